"""The MHTML loader on archives built with the stdlib `email` package, plus the real corpus when present."""

from __future__ import annotations

import base64
import contextlib
import io
import json
import re
from dataclasses import dataclass
from email import encoders
from email.mime.multipart import MIMEMultipart
from email.mime.nonmultipart import MIMENonMultipart
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from PIL import Image

from vision_rag_pipeline.core.config import DocumentLimits
from vision_rag_pipeline.core.sniff import sniff_document_kind, sniff_image_mime
from vision_rag_pipeline.documents.mhtml import load_mhtml
from vision_rag_pipeline.documents.model import DocumentBudgetError, DocumentError, LoadedDocument
from vision_rag_pipeline_tests.conftest import CORPUS, bench_module

PAGE_URL = "https://example.test/articles/page.html"


@dataclass
class Resource:
    """One saved resource of a fixture archive."""

    data: bytes
    content_type: str
    location: str | None = None
    cid: str | None = None
    charset: str | None = None
    transfer: str = "base64"


def raster(kind: str, size: tuple[int, int] = (40, 30)) -> bytes:
    buffer = io.BytesIO()
    Image.new("RGB", size, (200, 30, 30)).save(buffer, format=kind)
    return buffer.getvalue()


SVG_WITH_SIZE = (
    b'<?xml version="1.0"?>\n<svg xmlns="http://www.w3.org/2000/svg" width="120" height="60"></svg>'
)
SVG_WITH_VIEWBOX = b'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 24 16"><path d="M0 0h1"/></svg>'


def mime_part(resource: Resource) -> MIMENonMultipart:
    maintype, subtype = resource.content_type.split("/")
    params = {"charset": resource.charset} if resource.charset else {}
    part = MIMENonMultipart(maintype, subtype, **params)
    part.set_payload(resource.data)
    (encoders.encode_base64 if resource.transfer == "base64" else encoders.encode_quopri)(part)
    if resource.location:
        part["Content-Location"] = resource.location
    if resource.cid:
        part["Content-ID"] = f"<{resource.cid}>"
    return part


def build_mhtml(
    html: str | bytes,
    resources: tuple[Resource, ...] = (),
    *,
    charset: str | None = "utf-8",
    transfer: str = "quoted-printable",
    headers: dict[str, str] | None = None,
) -> bytes:
    """An archive shaped like a Blink save: headers, then the page, then its resources."""
    message = MIMEMultipart("related", type="text/html")
    for name, value in {"From": "<Saved by Blink>", "Subject": "Fixture page", **(headers or {})}.items():
        message[name] = value
    page = html.encode(charset or "utf-8") if isinstance(html, str) else html
    message.attach(
        mime_part(Resource(page, "text/html", PAGE_URL, "frame-root@mhtml.blink", charset, transfer))
    )
    for resource in resources:
        message.attach(mime_part(resource))
    return message.as_bytes()


def load(tmp_path: Path, archive: bytes, name: str = "page.mhtml") -> LoadedDocument:
    path = tmp_path / name
    path.write_bytes(archive)
    return load_mhtml(path)


def texts(doc: LoadedDocument) -> list[str]:
    return [element.text for element in doc.elements if element.kind != "image"]


def images_in_order(doc: LoadedDocument) -> list[str]:
    return [doc.images[e.image_index].name for e in doc.elements if e.kind == "image"]


@pytest.mark.parametrize("transfer", ["quoted-printable", "base64"])
def test_page_text_comes_out_in_reading_order_with_markdown_structure(tmp_path: Path, transfer: str) -> None:
    html = """<html><head><title>Säved   page</title><style>p {color: red}</style>
    <script>var hidden = "script text";</script></head><body>
    <h1>Main   heading</h1><p>First paragraph with <b>bold</b> and a very long line that quoted-printable
    has to fold because it is longer than seventy-six characters — ünïcödé.</p>
    <ul><li>one</li><li>two<br>lines</li></ul><noscript>enable js</noscript>
    <div hidden>secret</div><p style="display: none">also secret</p><h3>Small</h3></body></html>"""
    doc = load(tmp_path, build_mhtml(html, transfer=transfer))
    assert doc.title == "Säved page"
    assert doc.mime == "multipart/related"
    assert texts(doc) == [
        "# Main heading",
        "First paragraph with bold and a very long line that quoted-printable has to fold because it is "
        "longer than seventy-six characters — ünïcödé.",
        "- one",
        "- two\nlines",
        "### Small",
    ]


@pytest.mark.parametrize(
    ("declared", "meta", "codec", "sample"),
    [
        ("gb2312", None, "gb18030", "中文测试：堃与镕"),  # GBK-only characters under a gb2312 label
        (None, "KOI8-R", "koi8-r", "Библиотека Максима Мошкова"),
        ("koi8-r", None, "koi8-r", "Привет, мир"),
        ("windows-1252", None, "cp1252", "Café “quoted” – naïve"),
        (None, None, "utf-8", "ελληνικά και 日本語"),
    ],
)
def test_declared_and_meta_charsets_round_trip(
    tmp_path: Path, declared: str | None, meta: str | None, codec: str, sample: str
) -> None:
    meta_tag = f'<meta http-equiv="Content-Type" content="text/html; charset={meta}">' if meta else ""
    html = f"<html><head>{meta_tag}<title>t</title></head><body><p>{sample}</p></body></html>"
    doc = load(tmp_path, build_mhtml(html.encode(codec), charset=declared))
    assert texts(doc) == [sample]


def test_bad_bytes_in_a_declared_charset_become_replacement_characters(tmp_path: Path) -> None:
    html = "<p>good text</p><p>broken \xff byte</p>".encode("latin-1").replace(b"good", "gööd".encode())
    doc = load(tmp_path, build_mhtml(html, charset="utf-8"))
    assert texts(doc) == ["gööd text", "broken \ufffd byte"]


def test_images_resolve_by_content_location_relative_url_base_and_cid(tmp_path: Path) -> None:
    png, jpeg = raster("PNG", (40, 30)), raster("JPEG", (64, 48))
    html = """<p>Before the pictures.</p>
    <img src="../images/chart.png" alt="Sales chart" title="Q3">
    <p>Between <img src="cid:logo-1@mhtml.blink" alt="Logo"> inline.</p>"""
    doc = load(
        tmp_path,
        build_mhtml(
            html,
            (
                Resource(png, "image/png", "https://example.test/images/chart.png"),
                Resource(jpeg, "image/jpeg", cid="logo-1@mhtml.blink"),
            ),
        ),
    )
    chart, logo = doc.images
    assert (chart.url, chart.name, chart.mime, chart.data, chart.alt, chart.title) == (
        "https://example.test/images/chart.png", "chart.png", "image/png", png, "Sales chart", "Q3"
    )  # fmt: skip
    assert (chart.width, chart.height) == (40, 30)
    assert (logo.url, logo.mime, logo.alt, logo.width, logo.height) == (
        "cid:logo-1@mhtml.blink", "image/jpeg", "Logo", 64, 48
    )  # fmt: skip
    assert logo.name.endswith(".jpg")
    assert [e.kind for e in doc.elements] == ["text", "image", "text", "image"]
    # the inline logo sits inside its paragraph, right after "Between "
    logo_at = doc.elements[3].location.char_span
    assert doc.text[: logo_at[0]].endswith("Between ") and logo_at[0] == logo_at[1]
    assert "Before the pictures." in chart.context and "Between inline." in chart.context


def test_base_href_decides_relative_urls(tmp_path: Path) -> None:
    html = '<head><base href="https://cdn.example.test/static/"></head><body><img src="pic.gif"></body>'
    gif = raster("GIF")
    doc = load(
        tmp_path, build_mhtml(html, (Resource(gif, "image/gif", "https://cdn.example.test/static/pic.gif"),))
    )
    assert [(image.name, image.mime) for image in doc.images] == [("pic.gif", "image/gif")]


def test_mislabelled_parts_are_sniffed_and_non_images_ignored(tmp_path: Path) -> None:
    png = raster("PNG")
    html = '<img src="a.bin"><img src="b.jpg"><img src="font.woff">'
    doc = load(
        tmp_path,
        build_mhtml(
            html,
            (
                Resource(png, "application/octet-stream", "https://example.test/articles/a.bin"),
                Resource(png, "image/jpeg", "https://example.test/articles/b.jpg"),
                Resource(
                    b"wOFF\x00\x01\x00\x00" * 8,
                    "application/octet-stream",
                    "https://example.test/articles/font.woff",
                ),
            ),
        ),
    )
    assert [image.mime for image in doc.images] == ["image/png", "image/png"]


def test_webp_gif_and_svg_parts_get_their_pixel_sizes(tmp_path: Path) -> None:
    resources = (
        Resource(raster("WEBP", (33, 22)), "image/webp", "https://example.test/a.webp"),
        Resource(raster("GIF", (7, 5)), "image/gif", "https://example.test/b.gif"),
        Resource(SVG_WITH_SIZE, "image/svg+xml", "https://example.test/c.svg", transfer="quoted-printable"),
        Resource(SVG_WITH_VIEWBOX, "image/svg+xml", "https://example.test/d.svg"),
    )
    html = "".join(f'<img src="{resource.location}">' for resource in resources)
    doc = load(tmp_path, build_mhtml(html, resources))
    assert [(image.mime, image.width, image.height) for image in doc.images] == [
        ("image/webp", 33, 22),
        ("image/gif", 7, 5),
        ("image/svg+xml", 120, 60),
        ("image/svg+xml", 24, 16),
    ]


def test_picture_lazy_sources_data_uris_and_missing_parts(tmp_path: Path) -> None:
    webp, png = raster("WEBP"), raster("PNG", (2, 2))
    data_uri = "data:image/png;base64," + base64.b64encode(png).decode()
    html = f"""
    <picture><source srcset="https://example.test/hero-2x.webp 2x, https://example.test/hero.webp 1x">
      <img src="https://example.test/hero-fallback.jpg" alt="Hero"></picture>
    <img src="{data_uri}" alt="inline pixel">
    <img src="https://example.test/not-saved.png" alt="missing">
    <img src="data:image/gif;base64,R0lGOD" data-src="https://example.test/lazy.webp" alt="lazy">
    <input type="image" src="https://example.test/hero.webp">"""
    resources = (
        Resource(webp, "image/webp", "https://example.test/hero.webp"),
        Resource(webp[:-1] + b"\x00", "image/webp", "https://example.test/lazy.webp"),
    )
    doc = load(tmp_path, build_mhtml(html, resources))
    assert [doc.images[e.image_index].alt for e in doc.elements if e.kind == "image"] == [
        "Hero", "inline pixel", "lazy", "Hero"
    ]  # fmt: skip
    assert doc.images[1].data == png and doc.images[1].url.startswith("data:image/png;sha256=")


def test_same_image_twice_gives_two_elements_sharing_one_entry(tmp_path: Path) -> None:
    png = raster("PNG")
    html = '<p>One</p><img src="x.png" alt="first"><p>Two</p><img src="x.png" alt="second">'
    doc = load(
        tmp_path, build_mhtml(html, (Resource(png, "image/png", "https://example.test/articles/x.png"),))
    )
    image_elements = [e for e in doc.elements if e.kind == "image"]
    assert [e.image_index for e in image_elements] == [0, 0]
    assert len(doc.images) == 1 and doc.images[0].alt == "first"
    assert doc.images[0].location.char_span == image_elements[0].location.char_span


def test_nested_iframes_are_inlined_where_they_stand_and_cycles_stop(tmp_path: Path) -> None:
    outer_frame = (
        '<p>Outer frame text</p><iframe src="cid:inner@mhtml.blink"></iframe><img src="cid:px"></img>'
    )
    inner_frame = '<p>Inner frame text</p><iframe src="https://example.test/articles/page.html"></iframe>'
    frame = '<iframe src="cid:outer@mhtml.blink"></iframe>'
    html = f"<p>Before</p>{frame}<p>After</p>{frame}"
    resources = (
        Resource(outer_frame.encode(), "text/html", "https://ads.example.test/", "outer@mhtml.blink"),
        Resource(inner_frame.encode(), "text/html", None, "inner@mhtml.blink", transfer="quoted-printable"),
        Resource(raster("GIF", (1, 1)), "image/gif", None, "px"),
    )
    doc = load(tmp_path, build_mhtml(html, resources))
    assert texts(doc) == [
        "Before",
        "Outer frame text",
        "Inner frame text",
        "After",
        "Outer frame text",
        "Inner frame text",
    ]
    assert [e.kind for e in doc.elements].count("image") == 2 and len(doc.images) == 1


WORD_PAGE = """<html xmlns:v="urn:schemas-microsoft-com:vml"
xmlns:o="urn:schemas-microsoft-com:office:office"><body lang=EN-US>
<p class=MsoNormal>Chart:<!--[if gte vml 1]><v:shape id="Chart_x0020_2" style='width:432pt'>
 <v:imagedata src="Test_files/image005.png" o:title=""/></v:shape><![endif]--><![if !vml]><img
width=577 height=337 src="Test_files/image006.png" v:shapes="Chart_x0020_2"><![endif]></p>
<p class=MsoNormal>Only VML:<!--[if gte vml 1]><v:shape id="_x0000_i1030">
<v:imagedata src="Test_files/image007.png"/></v:shape><![endif]--></p>
<p class=MsoNormal>Fallback lost:<!--[if gte vml 1]><v:shape id="Pic_9">
<v:imagedata src="Test_files/image009.png"/></v:shape><![endif]--><![if !vml]><img
src="Test_files/image010.png" v:shapes="Pic_9"><![endif]></p></body></html>"""


def test_word_single_file_web_page_pictures_are_not_doubled(tmp_path: Path) -> None:
    base = "file:///C:/267BA2D4/Test_files/"
    resources = tuple(
        Resource(raster("PNG", (number, number)), "image/png", f"{base}image{number:03d}.png")
        for number in (5, 6, 7, 9)
    )
    archive = build_mhtml(WORD_PAGE.encode("windows-1252"), resources, charset="windows-1252")
    archive = archive.replace(PAGE_URL.encode(), b"file:///C:/267BA2D4/Test.htm")
    doc = load(tmp_path, archive, "word.mht")
    assert images_in_order(doc) == ["image006.png", "image007.png", "image009.png"]
    assert texts(doc) == ["Chart:", "Only VML:", "Fallback lost:"]


def test_archive_headers_and_x_metadata_are_kept(tmp_path: Path) -> None:
    headers = {
        "Subject": "=?utf-8?Q?Caf=C3=A9_menu?=",
        "Date": "Tue, 5 Sep 2016 22:30:04 -0000",
        "Snapshot-Content-Location": "https://example.test/menu",
        "X-Metadata": json.dumps({"team": "ops", "tags": ["a", "b"]}),
    }
    doc = load(tmp_path, build_mhtml("<p>no title here</p>", headers=headers))
    assert doc.title == "Café menu"
    assert doc.metadata["x_metadata"] == {"team": "ops", "tags": ["a", "b"]}
    assert doc.metadata["subject"] == "Café menu"
    assert doc.metadata["date"] == "Tue, 5 Sep 2016 22:30:04 -0000"
    assert doc.metadata["from"] == "<Saved by Blink>"
    assert doc.metadata["snapshot_content_location"] == "https://example.test/menu"
    raw = load(tmp_path, build_mhtml("<p>x</p>", headers={"X-Metadata": "owner=ops; not json"}), "raw.mhtml")
    assert raw.metadata["x_metadata"] == "owner=ops; not json"
    eight_bit = build_mhtml("<p>x</p>", headers={"Subject": "placeholder"})
    eight_bit = eight_bit.replace(b"Subject: placeholder", "Subject: Отчёт".encode())
    assert load(tmp_path, eight_bit, "8bit.mhtml").metadata["subject"] == "Отчёт"


def test_data_tables_become_markdown_and_layout_tables_stay_text(tmp_path: Path) -> None:
    html = """<table><tr><th>Year</th><th>Sales | net</th></tr><tr><td>2023</td><td colspan=1>10</td></tr>
    <tr><td colspan="2">total 10</td></tr></table>
    <table><tr><td><p>Layout cell paragraph</p></td></tr></table>
    <table><tr><td><h2>Sidebar</h2></td><td>Body text</td></tr><tr><td>x</td><td>y</td></tr></table>"""
    doc = load(tmp_path, build_mhtml(html))
    assert [(e.kind, e.text) for e in doc.elements] == [
        ("table", "| Year | Sales \\| net |\n| --- | --- |\n| 2023 | 10 |\n| total 10 |  |"),
        ("text", "Layout cell paragraph"),
        ("text", "## Sidebar"),
        ("text", "Body text"),
        ("text", "x"),
        ("text", "y"),
    ]


def test_figure_caption_is_attached_to_its_image(tmp_path: Path) -> None:
    html = '<figure><img src="f.png" alt="plot"><figcaption>Figure 3: growth</figcaption></figure><p>Next</p>'
    doc = load(
        tmp_path,
        build_mhtml(html, (Resource(raster("PNG"), "image/png", "https://example.test/articles/f.png"),)),
    )
    assert doc.images[0].caption == "Figure 3: growth"
    assert texts(doc) == ["Figure 3: growth", "Next"]


def test_broken_folded_top_header_is_recovered(tmp_path: Path) -> None:
    archive = build_mhtml(
        "<title>Recovered</title><p>Body survives</p>", headers={"X-Snapshot-Title": "placeholder"}
    )
    archive = archive.replace(
        b"X-Snapshot-Title: placeholder", b"X-Snapshot-Title: =?utf-8?Q?This is on multiple\nlines"
    )
    doc = load(tmp_path, archive)
    assert doc.title == "Recovered" and texts(doc) == ["Body survives"]
    assert doc.metadata["from"] == "<Saved by Blink>"


@pytest.mark.parametrize(
    ("content", "reason"),
    [
        (b"", "empty file"),
        (b"\x00\xff\x13garbage" * 50, "not an MHTML archive"),
        (b"<html><body><p>plain html, no MIME</p></body></html>", "not an MHTML archive"),
        (
            b'MIME-Version: 1.0\nContent-Type: multipart/related; boundary="b"\n\n--b\n'
            b"Content-Type: text/css\n\nbody {}\n--b--\n",
            "no text/html part",
        ),
    ],
)
def test_unloadable_files_raise_one_line_document_errors(tmp_path: Path, content: bytes, reason: str) -> None:
    with pytest.raises(DocumentError, match=rf"^bad\.mhtml: {reason}"):
        load(tmp_path, content, "bad.mhtml")


def test_unreadable_path_raises_document_error(tmp_path: Path) -> None:
    with pytest.raises(DocumentError, match="missing.mhtml: cannot read"):
        load_mhtml(tmp_path / "missing.mhtml")


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.binary(max_size=600))
def test_arbitrary_bytes_load_or_raise_document_error(tmp_path: Path, junk: bytes) -> None:
    header = b'MIME-Version: 1.0\nContent-Type: multipart/related; boundary="b"\n\n'
    for content in (junk, header + b"--b\nContent-Type: text/html\n\n" + junk):
        with contextlib.suppress(DocumentError):
            load(tmp_path, content, "junk.mhtml")


WORDS = st.text(alphabet=st.sampled_from("abcxyz ÄéЖ中  \t\n&<>"), min_size=0, max_size=30)
BLOCKS = st.lists(
    st.one_of(
        st.tuples(st.sampled_from(["p", "h2", "li", "td", "span", "pre"]), WORDS),
        st.tuples(st.just("img"), st.sampled_from(["a.png", "b.gif", "missing.png"])),
    ),
    max_size=12,
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(BLOCKS)
def test_every_element_span_slices_the_document_text_to_its_own_text(
    tmp_path: Path, blocks: list[tuple[str, str]]
) -> None:
    from html import escape

    html = "".join(
        f'<img src="{value}">' if tag == "img" else f"<{tag}>{escape(value)}</{tag}>" for tag, value in blocks
    )
    resources = (
        Resource(raster("PNG", (3, 3)), "image/png", "https://example.test/articles/a.png"),
        Resource(raster("GIF", (2, 2)), "image/gif", "https://example.test/articles/b.gif"),
    )
    doc = load(tmp_path, build_mhtml(html, resources))
    text = doc.text
    for element in doc.elements:
        start, end = element.location.char_span
        assert text[start:end] == element.text
        if element.kind == "image":
            assert start == end and 0 <= start <= len(text)
    starts = [element.location.char_span[0] for element in doc.elements]
    assert starts == sorted(starts)
    assert all(
        element.text == element.text.strip() and element.text
        for element in doc.elements
        if element.kind != "image"
    )
    assert sum(element.kind == "image" for element in doc.elements) == sum(
        tag == "img" and value != "missing.png" for tag, value in blocks
    )


@pytest.mark.parametrize(
    ("data", "mime"),
    [
        (raster("PNG"), "image/png"),
        (raster("JPEG"), "image/jpeg"),
        (raster("GIF"), "image/gif"),
        (raster("WEBP"), "image/webp"),
        (raster("BMP"), "image/bmp"),
        (raster("TIFF"), "image/tiff"),
        (raster("ICO"), "image/x-icon"),
        (SVG_WITH_SIZE, "image/svg+xml"),
        (b"\xef\xbb\xbf<!-- made by hand -->\n<!DOCTYPE svg><svg></svg>", "image/svg+xml"),
        (b"<html><body><svg></svg></body></html>", None),
        (b"BM not really a bitmap", None),
        (b"wOF2\x00\x01\x00\x00", None),
        (b"", None),
    ],
)
def test_sniff_image_mime_trusts_magic_bytes(data: bytes, mime: str | None) -> None:
    assert sniff_image_mime(data) == mime


@pytest.mark.parametrize(
    ("head", "kind"),
    [
        (b"%PDF-1.7\n%\xe2\xe3\xcf\xd3\n", "pdf"),
        (b"From: <Saved by Blink>\r\nSubject: x\r\n", "mhtml"),
        (b'MIME-Version: 1.0\nContent-Type: multipart/related; boundary="----=_NextPart_01"\n', "mhtml"),
        (b'Content-Type: multipart/related;\n\ttype="text/html"\n', "mhtml"),
        (b"<html><body>saved as plain html</body></html>", None),
        (b"PK\x03\x04 a zip file", None),
    ],
)
def test_sniff_document_kind_routes_by_content(tmp_path: Path, head: bytes, kind: str | None) -> None:
    path = tmp_path / "file.bin"
    path.write_bytes(head + b"\n" * 10)
    assert sniff_document_kind(path) == kind


MHTML_CORPUS = sorted((CORPUS / "mhtml").glob("*.mht*")) if (CORPUS / "mhtml").is_dir() else []
KNOWN_IN_CORPUS = {  # file -> (minimum distinct images, maximum distinct images, text that must appear)
    "opencola_docker_for_mac.mht": (15, 40, "Docker"),
    "testimio_example.com.mhtml": (0, 0, "Example Domain"),
    "zsxsoft_word2013_gb2312.mht": (1, 1, "我只是在测试文件而已"),
    "distill_lib.ru.koi8r.mhtml": (0, 2, "Библиотека"),
    "openxmlpowertools_PU001-Test001.mht": (3, 3, "Chart"),
    "mhtml2html_portfolio.mhtml": (0, 5, "Max Sindwani"),
    "testimio_wikipedia.mhtml": (5, 12, "Node.js"),
}


def test_multipart_bodies_nested_past_the_limit_are_refused_before_they_are_parsed(tmp_path: Path) -> None:
    """A 3,000-deep multipart archive failed with "maximum recursion depth exceeded"."""
    bombs = bench_module("bench_document_bombs")
    with pytest.raises(DocumentBudgetError) as refused:
        load(tmp_path, bombs.deep_mhtml(3000))
    assert (
        str(refused.value)
        == "page.mhtml: multipart bodies nested more than 32 deep (limits.documents.max_mhtml_depth)"
    )
    assert texts(load(tmp_path, bombs.deep_mhtml(32), "nested.mhtml")) == ["The page at the bottom."]


def test_a_url_urllib_cannot_parse_is_a_missing_image_not_an_error(tmp_path: Path) -> None:
    """The parser fuzz found `<img src="https://[cdn...">` raising ValueError ("Invalid IPv6 URL")."""
    broken = Resource(raster("png"), "image/png", "https://[cdn.example/logo.png")
    doc = load(
        tmp_path,
        build_mhtml('<p>Logo</p><img src="https://[cdn.example/a.png"><base href="http://[x">', (broken,)),
    )
    assert texts(doc) == ["Logo"]


def test_parts_decoding_past_the_limits_are_refused(tmp_path: Path) -> None:
    logo = Resource(raster("png", (400, 300)), "image/png", "https://example.test/articles/logo.png")
    archive = build_mhtml("<p>Logo below</p><img src='logo.png'>", (logo,))
    path = tmp_path / "page.mhtml"
    path.write_bytes(archive)
    with pytest.raises(DocumentBudgetError, match=r"in one part \(limits.documents.max_stream_bytes\)"):
        load_mhtml(path, DocumentLimits(max_stream_bytes=200))
    with pytest.raises(DocumentBudgetError, match=r"\(limits.documents.max_document_bytes\)"):
        load_mhtml(path, DocumentLimits(max_document_bytes=len(archive) // 2))
    assert len(load_mhtml(path).images) == 1


@pytest.mark.skipif(not MHTML_CORPUS, reason="shared corpus not present")
@pytest.mark.parametrize("path", MHTML_CORPUS, ids=lambda path: path.name)
def test_corpus_archives_load_or_raise_document_error(path: Path) -> None:
    try:
        doc = load_mhtml(path)
    except DocumentError as error:
        assert str(error).startswith(path.name)
        return
    assert doc.text or doc.images
    for element in doc.elements:
        start, end = element.location.char_span
        assert doc.text[start:end] == element.text
    if path.name in KNOWN_IN_CORPUS:
        least, most, phrase = KNOWN_IN_CORPUS[path.name]
        assert least <= len(doc.images) <= most
        assert phrase in doc.text
    if "gb2312" in path.name:
        assert re.search(r"[\u4e00-\u9fff]", doc.text)
    if "koi8r" in path.name:
        assert re.search(r"[\u0400-\u04ff]", doc.text)
