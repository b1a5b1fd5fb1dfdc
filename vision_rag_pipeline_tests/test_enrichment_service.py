"""The enrichment service end to end: real Tesseract, the embedded Postgres cache, a fake OpenAI server."""

from __future__ import annotations

import base64
import io
import json
import uuid
from collections.abc import Iterator
from pathlib import Path

import openai
import pytest
from PIL import Image, ImageDraw, ImageFont

from vision_rag_pipeline.core.config import ProviderLimits, RagConfig
from vision_rag_pipeline.documents.model import DocumentImage
from vision_rag_pipeline.enrichment.batch import enrich_document_images
from vision_rag_pipeline.enrichment.cache import EnrichmentCache
from vision_rag_pipeline.enrichment.classifier import classify_images
from vision_rag_pipeline.enrichment.cost import vision_tokens
from vision_rag_pipeline.enrichment.model import MetaContent
from vision_rag_pipeline.enrichment.vlm import VisionClient
from vision_rag_pipeline.media_enrichment import enrich_files, media_enrichment
from vision_rag_pipeline_tests.openai_fake import FakeOpenAI, Reply, chat_reply, error_reply

TEXTS = [
    ["Warehouse Helsinki", "Revenue 4217 EUR"],
    ["Quarterly Forecast", "Margin 38 percent"],
    ["Customer Onboarding", "Ticket backlog 112"],
]


def png(lines: list[str], size: tuple[int, int] = (640, 200)) -> bytes:
    img = Image.new("RGB", size, "white")
    draw = ImageDraw.Draw(img)
    font = ImageFont.load_default(size=32)
    for i, line in enumerate(lines):
        draw.text((30, 30 + i * 60), line, fill="black", font=font)
    buffer = io.BytesIO()
    img.save(buffer, format="PNG")
    return buffer.getvalue()


def image(lines: list[str], name: str, **fields: object) -> DocumentImage:
    return DocumentImage(
        url=f"https://example.com/{name}", name=name, mime="image/png", data=png(lines), **fields
    )


def tracking_pixel() -> DocumentImage:
    buffer = io.BytesIO()
    Image.new("RGB", (1, 1), "white").save(buffer, format="PNG")
    return DocumentImage(
        url="https://example.com/pixel.gif", name="pixel.gif", mime="image/png", data=buffer.getvalue()
    )


def fresh_config(**mllm: object) -> RagConfig:
    """A config with its own domain, so cache entries of other tests never match."""
    config = RagConfig(domain=f"test-{uuid.uuid4().hex[:12]}")
    return config.with_settings({"media_enrichment": {"features": {"mllm": mllm}}})


@pytest.fixture(scope="module")
def text_images() -> list[DocumentImage]:
    return [image(lines, f"figure-{i}.png") for i, lines in enumerate(TEXTS)]


@pytest.fixture
def cache(pg_url: str) -> EnrichmentCache:
    return EnrichmentCache(pg_url)


def test_cold_then_warm_cache_then_a_prompt_edit_then_a_keyword_change(
    text_images: list[DocumentImage], cache: EnrichmentCache
) -> None:
    images = [*text_images, tracking_pixel()]
    config = fresh_config()
    verdicts = classify_images(images, config.media_enrichment.features.classifier)
    assert [v.verdict for v in verdicts] == ["VISION", "VISION", "VISION", "IGNORE"]

    cold = enrich_document_images(images, verdicts, config, cache, "report.mhtml")
    assert (cold.calls, cold.cache_hits, cold.errors) == (3, 0, [])
    assert set(cold.results) == {img.sha256 for img in text_images}  # the IGNOREd pixel is not enriched
    for img, lines in zip(text_images, TEXTS, strict=True):
        result = cold.results[img.sha256]
        meta = MetaContent.parse(result.meta_content)
        assert meta.source == f"report.mhtml/{img.name}"
        for word in " ".join(lines).split():
            assert word in meta.content  # the image's words are searchable
        assert result.fusion == "rule" and not result.cached
        size = Image.open(io.BytesIO(img.data)).size
        assert result.vision_tokens == vision_tokens(*size, "auto"), "cost is estimated even offline"
    assert cold.vision_tokens == sum(r.vision_tokens for r in cold.results.values())

    warm = enrich_document_images(images, verdicts, config, cache, "report.mhtml")
    assert (warm.calls, warm.cache_hits) == (0, 3)
    assert all(r.cached for r in warm.results.values())
    assert {s: r.meta_content for s, r in warm.results.items()} == {
        s: r.meta_content for s, r in cold.results.items()
    }

    # No vision model: the prompt shapes nothing, so editing it reads no image again.
    config = config.with_settings(
        {"media_enrichment": {"features": {"mllm": {"prompt": "List every number in the image."}}}}
    )
    edited = enrich_document_images(images, verdicts, config, cache, "report.mhtml")
    assert (edited.calls, edited.cache_hits) == (0, 3)

    config = config.with_settings(
        {"media_enrichment": {"fusion": {"max_keywords": 5}}}
    )  # shapes it offline too
    changed = enrich_document_images(images, verdicts, config, cache, "report.mhtml")
    assert (changed.calls, changed.cache_hits) == (3, 0)


def test_duplicates_are_enriched_once_and_a_hit_names_the_current_document(
    text_images: list[DocumentImage], cache: EnrichmentCache
) -> None:
    config = fresh_config()
    first = text_images[0]
    again = first.model_copy(update={"name": "copy.png", "url": "https://example.com/copy.png"})
    verdicts = classify_images([first], config.media_enrichment.features.classifier)
    batch = enrich_document_images([first, again], verdicts, config, cache, "a.mhtml")
    assert (batch.calls, len(batch.results)) == (1, 1)

    other = first.model_copy(update={"alt": "Helsinki warehouse revenue", "url": "https://example.com/b.png"})
    hit = enrich_document_images([other], verdicts, config, cache, "b.mhtml").results[first.sha256]
    meta = MetaContent.parse(hit.meta_content)
    assert hit.cached and meta.source == f"b.mhtml/{first.name}" and hit.image_url == other.url
    assert "Helsinki warehouse revenue" in meta.content and hit.description == "Helsinki warehouse revenue"


def test_svg_text_and_scanned_pages_are_enriched(cache: EnrichmentCache) -> None:
    svg = DocumentImage(
        url="https://example.com/flow.svg",
        name="flow.svg",
        mime="image/svg+xml",
        data=b'<svg xmlns="http://www.w3.org/2000/svg"><text x="1" y="9">Approval workflow</text>'
        b'<text x="1" y="29">Legal review</text></svg>',
    )
    page = image(["Signed lease agreement", "Tenant Virtanen"], "page-3.png", is_page_image=True)
    config = fresh_config()
    verdicts = classify_images([svg, page], config.media_enrichment.features.classifier)
    batch = enrich_document_images([svg, page], verdicts, config, None, "scan.pdf")
    assert batch.errors == []
    svg_meta = MetaContent.parse(batch.results[svg.sha256].meta_content)
    assert "Approval workflow" in svg_meta.content and "Legal review" in svg_meta.content
    assert "Tenant Virtanen" in batch.results[page.sha256].meta_content


def test_a_scan_with_its_own_ocr_layer_is_not_read_again(
    cache: EnrichmentCache, monkeypatch: pytest.MonkeyPatch
) -> None:
    from vision_rag_pipeline.enrichment import batch as batch_module

    layer = "Lease agreement No. 4471\nTenant Virtanen, rent 12,5 % above index"
    scan = image(["Signed lease agreement", "Tenant Virtanen"], "page-1-image-1.png", text_layer=layer)
    bare = scan.model_copy(update={"text_layer": ""})
    config = fresh_config()
    verdicts = classify_images([scan], config.media_enrichment.features.classifier)

    def no_tesseract(*_args: object) -> None:
        raise AssertionError("an image with a text layer was OCR'd")

    monkeypatch.setattr(batch_module, "read_image", no_tesseract)
    result = enrich_document_images([scan], verdicts, config, cache, "scan.pdf").results[scan.sha256]
    assert result.ocr.text == layer and result.ocr.level == "High"
    assert "rent 12,5 % above index" in MetaContent.parse(result.meta_content).content

    monkeypatch.undo()  # the same bytes without a layer are another enrichment: read, not served the layer
    unread = enrich_document_images([bare], verdicts, config, cache, "scan.pdf")
    assert (unread.calls, unread.cache_hits) == (1, 0)
    assert "Virtanen" in unread.results[scan.sha256].ocr.text


# --- with a vision endpoint ----------------------------------------------------------------------


@pytest.fixture
def server() -> Iterator[FakeOpenAI]:
    with FakeOpenAI() as fake:
        yield fake


@pytest.fixture
def vision(server: FakeOpenAI) -> VisionClient:
    client = openai.OpenAI(base_url=server.base_url, api_key="k", max_retries=0, timeout=10)
    return VisionClient(
        client,
        engine=f"openai:{server.base_url}",
        limits=ProviderLimits(max_attempts=2),
        sleep=lambda _s: None,
    )


def test_vision_caption_and_llm_fusion(
    text_images: list[DocumentImage], cache: EnrichmentCache, server: FakeOpenAI, vision: VisionClient
) -> None:
    img = text_images[0]
    fused = {
        "type": "Screenshot",
        "keywords": ["Helsinki", "revenue"],
        "content": "A sales dashboard. " + " ".join(TEXTS[0]),
    }
    server.script(chat_reply("A dashboard tile about the Helsinki warehouse."), chat_reply(json.dumps(fused)))
    config = fresh_config(model="llava", detail_mode="low")
    verdicts = classify_images([img], config.media_enrichment.features.classifier)
    batch = enrich_document_images([img], verdicts, config, cache, "doc", vision=vision)

    result = batch.results[img.sha256]
    assert result.vlm_caption == "A dashboard tile about the Helsinki warehouse."
    assert result.fusion == "llm" and result.image_type == "Screenshot" and result.errors == []
    assert MetaContent.parse(result.meta_content).content.startswith("A sales dashboard. Warehouse Helsinki")
    assert batch.vision_tokens == result.vision_tokens == 85  # low detail
    describe, fusion = server.requests
    assert describe.body["model"] == "llava"
    assert describe.body["messages"][0]["content"][1]["image_url"]["detail"] == "low"
    assert "Warehouse Helsinki" in fusion.body["messages"][1]["content"]  # OCR text handed to fusion
    assert "A dashboard tile" in fusion.body["messages"][1]["content"]  # and the VLM caption

    # an entry computed with the endpoint is not served offline (and vice versa): the engine is in the key
    assert enrich_document_images([img], verdicts, config, cache, "doc").calls == 1


def test_llm_fusion_failure_keeps_the_caption_in_rule_fusion(
    text_images: list[DocumentImage], server: FakeOpenAI, vision: VisionClient
) -> None:
    img = text_images[2]
    server.script(chat_reply("An onboarding dashboard."), chat_reply("Sure! Here is the entry: ..."))
    config = fresh_config()
    verdicts = classify_images([img], config.media_enrichment.features.classifier)
    result = enrich_document_images([img], verdicts, config, None, "doc", vision=vision).results[img.sha256]
    assert result.fusion == "rule" and result.vlm_caption == "An onboarding dashboard."
    assert "An onboarding dashboard." in result.meta_content and "Ticket backlog 112" in result.meta_content
    assert len(result.errors) == 1 and result.errors[0].startswith("fusion: ")


def test_llm_fusion_that_drops_the_image_words_gets_the_ocr_text_appended(
    text_images: list[DocumentImage], server: FakeOpenAI, vision: VisionClient
) -> None:
    img = text_images[2]
    server.script(
        chat_reply("A dashboard."), chat_reply(json.dumps({"type": "Chart", "content": "A dashboard."}))
    )
    config = fresh_config()
    verdicts = classify_images([img], config.media_enrichment.features.classifier)
    result = enrich_document_images([img], verdicts, config, None, "doc", vision=vision).results[img.sha256]
    content = MetaContent.parse(result.meta_content).content
    assert result.fusion == "llm" and content.startswith("A dashboard.")
    assert "Customer Onboarding" in content and "Ticket backlog 112" in content


@pytest.mark.parametrize(
    "failure",
    [Reply(body="<html>proxy error</html>"), error_reply(500, "overloaded")],
    ids=["malformed", "server-error-forever"],
)
def test_vision_failure_falls_back_to_ocr_and_is_not_cached(
    text_images: list[DocumentImage],
    cache: EnrichmentCache,
    server: FakeOpenAI,
    vision: VisionClient,
    failure: Reply,
) -> None:
    server.default = failure
    img = text_images[1]
    config = fresh_config().with_settings({"media_enrichment": {"fusion": {"use_llm": False}}})
    verdicts = classify_images([img], config.media_enrichment.features.classifier)
    batch = enrich_document_images([img], verdicts, config, cache, "doc", vision=vision)

    result = batch.results[img.sha256]
    assert result.fusion == "rule" and result.vlm_caption is None
    assert "Quarterly Forecast" in result.meta_content  # the OCR path still made it searchable
    assert len(result.errors) == 1 and result.errors[0].startswith("vision:")
    assert batch.errors == [f"doc/{img.name}: {result.errors[0]}"]
    assert len(server.requests) == (1 if failure.status == 200 else 2)  # bounded attempts
    assert enrich_document_images([img], verdicts, config, cache, "doc", vision=vision).calls == 1


# --- the reference operation ---------------------------------------------------------------------


def _request(*datas: bytes) -> dict[str, object]:
    return {
        "domain": f"test-{uuid.uuid4().hex[:12]}",
        "config_version": "v1",
        "images": [{"data": base64.b64encode(d).decode()} for d in datas],
        "features": {"mllm": {"prompt": "Describe."}},
    }


def test_media_enrichment_classifies_only_the_first_image() -> None:
    text = png(TEXTS[2])
    pixel = tracking_pixel().data
    enriched = media_enrichment(_request(text, pixel), RagConfig())
    assert enriched["classifier_result"]["verdict"] == "GPT_VISION"
    content = enriched["generated_response"]["content"]
    assert content.count("<meta>") == 2  # the pixel rides on the first image's verdict
    assert "Ticket backlog 112" in content

    ignored = media_enrichment(_request(pixel, text), RagConfig())
    assert ignored["classifier_result"]["verdict"] == "IGNORE"
    assert ignored["generated_response"]["content"] == ""


def test_media_enrichment_accepts_data_urls() -> None:
    url = "data:image/png;base64," + base64.b64encode(png(TEXTS[0])).decode()
    request = {"domain": "d", "config_version": "1", "images": [{"url": url, "name": "kpi.png"}]}
    content = media_enrichment(request, RagConfig())["generated_response"]["content"]
    assert MetaContent.parse(content).source == "request/kpi.png"


def test_media_enrichment_limits() -> None:
    tiny = png(["x"], size=(60, 60))
    with pytest.raises(ValueError, match="11 images, at most 10"):
        media_enrichment(_request(*[tiny] * 11), RagConfig())
    with pytest.raises(ValueError, match="20 MB"):
        media_enrichment(_request(b"\0" * (20 * 1024 * 1024 + 1)), RagConfig())
    bad_detail = {**_request(tiny), "features": {"mllm": {"detail_mode": "ultra"}}}
    with pytest.raises(ValueError, match="invalid request: media_enrichment.features.mllm.detail_mode"):
        media_enrichment(bad_detail, RagConfig())


def test_enrich_files_reports_each_file(pg_url: str, tmp_path: Path) -> None:
    chart = tmp_path / "kpi.png"
    chart.write_bytes(png(TEXTS[1]))
    ok, missing = enrich_files([chart, tmp_path / "missing.png"])
    assert ok["classifier_result"]["verdict"] == "GPT_VISION"
    assert "Margin 38 percent" in ok["generated_response"]["content"]
    assert missing["path"].endswith("missing.png") and "No such file" in missing["error"]


def test_fusion_is_not_asked_when_the_description_failed(
    text_images: list[DocumentImage], server: FakeOpenAI, vision: VisionClient
) -> None:
    server.default = error_reply(503, "overloaded")
    img = text_images[1]
    config = fresh_config()  # LLM fusion wanted
    verdicts = classify_images([img], config.media_enrichment.features.classifier)
    batch = enrich_document_images([img], verdicts, config, None, "doc", vision=vision)
    result = batch.results[img.sha256]
    assert result.fusion == "rule" and "Quarterly Forecast" in result.meta_content
    assert len(server.requests) == 2, "two description attempts, no fusion call"
    assert batch.fallbacks == {"fusion: description failed": 1, "vision: http 503": 1}
