"""Search over a small index written directly: its stages, filters on every path, one hit per thing,
page hits, and search by image."""

from __future__ import annotations

import io
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from PIL import Image, ImageDraw, ImageFilter, ImageFont

from vision_rag_pipeline.chunks.model import Chunk, Landmarks
from vision_rag_pipeline.core.config import RagConfig, RetrievalConfig
from vision_rag_pipeline.core.postgres import connect
from vision_rag_pipeline.core.text import held_terms, term_set, terms
from vision_rag_pipeline.documents.loader import load_document
from vision_rag_pipeline.documents.model import DocumentImage
from vision_rag_pipeline.embeddings.encoder import EmbeddingModelError, encode
from vision_rag_pipeline.enrichment.batch import enrich_document_images
from vision_rag_pipeline.enrichment.classifier import classify_images
from vision_rag_pipeline.indexes.lexical import LexicalDoc
from vision_rag_pipeline.indexes.lexical_backend import open_lexical_index
from vision_rag_pipeline.indexes.pgvector_store import PgVectorStore, Pointers
from vision_rag_pipeline.query import candidates
from vision_rag_pipeline.query.candidates import (
    NEAR_DUPLICATE_BITS,
    NEAR_DUPLICATE_MARGIN,
    same_picture,
    vector_store,
)
from vision_rag_pipeline.query.features import FEATURES, content_query, term_shares
from vision_rag_pipeline.query.image_query import QueryImageError, describe_query_image
from vision_rag_pipeline.query.ranker import Ranker, load_ranker
from vision_rag_pipeline.query.search import score_candidates, search
from vision_rag_pipeline_tests.conftest import bench_module

# Rankings are asserted over what this module indexed, and nothing else (the fixture is in conftest).
pytestmark = pytest.mark.usefixtures("own_index")

SAMPLE_PDF = (
    Path(__file__).resolve().parents[1]
    / "vision_rag_pipeline"
    / "samples"
    / ("larkspur_q3_2024_operations_review.pdf")
)
TEXT_DOC = "quokka-text-0000000001"
KPI_DOC = "quokka-kpis-0000000004"
CHART_DOC = "quokka-chart-000000002"
PDF_DOC = "quokka-pdf-00000000003"
CORPUS_DOCS = [TEXT_DOC, KPI_DOC, CHART_DOC, PDF_DOC]


def chart(scale: float = 1.0) -> bytes:
    """A bar chart with its title and value labels, the kind of image enrichment reads by OCR."""
    width, height = int(640 * scale), int(400 * scale)
    img = Image.new("RGB", (width, height), "white")
    draw = ImageDraw.Draw(img)
    font = ImageFont.load_default(size=int(22 * scale))
    draw.text((int(20 * scale), int(12 * scale)), "Quokka feed tonnage by enclosure", fill="black", font=font)
    for i, (label, value) in enumerate((("Wallaby", 71.3), ("Bilby", 52.9), ("Numbat", 88.4))):
        x = int((80 + i * 180) * scale)
        top = int((360 - value * 3.2) * scale)
        draw.rectangle((x, top, x + int(90 * scale), int(360 * scale)), fill="#1f4e79")
        draw.text((x, top - int(28 * scale)), f"{value}", fill="black", font=font)
        draw.text((x, int(366 * scale)), label, fill="black", font=font)
    buffer = io.BytesIO()
    img.save(buffer, format="PNG")
    return buffer.getvalue()


def pdf_chunk() -> Chunk:
    """A text chunk of the sample PDF spanning its first elements, as the chunk builder makes it."""
    doc = load_document(SAMPLE_PDF)
    elements = [e for e in doc.elements if e.kind == "text" and e.location.page == 1][:4]
    boxes = [e.location.bbox for e in elements]
    return Chunk(
        chunk_id=f"{PDF_DOC}:00000",
        document_id=PDF_DOC,
        index=0,
        kind="text",
        text="\n\n".join(e.text for e in elements),
        page=1,
        bbox=(
            min(b[0] for b in boxes),
            min(b[1] for b in boxes),
            max(b[2] for b in boxes),
            max(b[3] for b in boxes),
        ),
        char_span=(elements[0].location.char_span[0], elements[-1].location.char_span[1]),
        metadata={"source": str(SAMPLE_PDF)},
    )


def index_chunks(chunks: list[Chunk]) -> None:
    """Write chunks to pgvector and the lexical index the way the index assets do."""
    store = vector_store(RagConfig().embedding.model)
    lexical = open_lexical_index()
    for document_id in dict.fromkeys(c.document_id for c in chunks):
        own = [c for c in chunks if c.document_id == document_id]
        store.replace_document(document_id, own, encode([c.text for c in own], RagConfig().embedding.model))
        lexical.replace_document(
            document_id,
            [
                LexicalDoc(
                    chunk_id=c.chunk_id,
                    document_id=c.document_id,
                    kind=c.kind,
                    text=c.text,
                    page=c.page,
                    landmarks=c.landmarks,
                )
                for c in own
            ],
        )


def build_corpus() -> list[Chunk]:
    image = DocumentImage(url="https://zoo.example/feed.png", name="feed.png", mime="image/png", data=chart())
    verdict = classify_images([image], RagConfig().media_enrichment.features.classifier)[0]
    batch = enrich_document_images(
        [image], [verdict.model_copy(update={"verdict": "VISION"})], RagConfig(), None, "zoo.mhtml"
    )
    texts = [
        "The Zephyrine Labs annual picnic drew 734 attendees to Riverton park.",
        "Volunteers repainted the Quokka enclosure fence in a cheerful green.",
    ]
    chunks = [
        Chunk(
            chunk_id=f"{TEXT_DOC}:{i:05d}",
            document_id=TEXT_DOC,
            index=i,
            kind="text",
            text=text,
            char_span=(i * 100, i * 100 + len(text)),
            metadata={"source": "/archive/zoo-news.mhtml", "title": "Zoo news"},
        )
        for i, text in enumerate(texts)
    ]
    chunks.append(
        Chunk(
            chunk_id=f"{CHART_DOC}:00000",
            document_id=CHART_DOC,
            index=0,
            kind="image",
            text=batch.results[image.sha256].meta_content,
            char_span=(40, 40),
            image=image.url,
            metadata={
                "source": "/archive/zoo-feed.mhtml",
                "image_type": "Chart",
                "image_sha256": image.sha256,
                "perceptual_hash": verdict.perceptual_hash,
            },
        )
    )
    return [*chunks, pdf_chunk()]


@pytest.fixture(scope="module")
def corpus(pg_url: str) -> list[Chunk]:
    chunks = build_corpus()
    index_chunks(chunks)
    return chunks


SURVEY_DOC = "quokka-survey-000000005"
SURVEY_IMAGE = "survey.pdf#page=2&image=1"


def survey_chunks() -> list[Chunk]:
    """A three-page PDF as ingest indexes it: text chunks, a picture on page 2 (its Meta-Content chunk
    and an excerpt of its text, one image), and one page unit per page; page 2 captions Figure 1."""
    source = {"source": "/archive/quokka-survey.pdf", "title": "Quokka habitat survey"}
    rows = [
        ("text", 1, "Quokka habitat survey, spring. The survey counted burrows along the coast.", {}),
        ("text", 2, "Burrow density rose where the heath was left unburnt for ten years.", {}),
        (
            "image",
            2,
            "<meta>\n[Type]: Chart\n</meta>\n<content>Chart. Figure 1: burrows per hectare 14 22 31",
            {},
        ),
        ("image", 2, "Figure 1: burrows per hectare — 14 22 31", {"image_excerpt": 0}),
        ("text", 3, "Contacts: the survey office answers questions about quokka burrows by email.", {}),
    ]
    chunks = []
    for index, (kind, page, text, extra) in enumerate(rows):
        metadata = source | extra | ({"image_type": "Chart"} if kind == "image" else {})
        chunks.append(
            Chunk(
                chunk_id=f"{SURVEY_DOC}:{index:05d}",
                document_id=SURVEY_DOC,
                index=index,
                kind=kind,
                text=text,
                page=page,
                image=SURVEY_IMAGE if kind == "image" else None,
                landmarks=Landmarks(
                    page_names=[str(page)],
                    page_count=3,
                    references=["figure 1"] if page == 2 else [],
                    header="Quokka habitat survey",
                ),
                metadata=metadata,
            )
        )
    for page in (1, 2, 3):
        chunks.append(
            Chunk(
                chunk_id=f"{SURVEY_DOC}:page-{page}",
                document_id=SURVEY_DOC,
                index=100 + page,
                kind="page",
                text="\n\n".join(c.text for c in chunks if c.page == page and c.kind != "page"),
                page=page,
                landmarks=Landmarks(page_names=[str(page)], page_count=3, header="Quokka habitat survey"),
            )
        )
    return chunks


@pytest.fixture(scope="module")
def survey(corpus: list[Chunk]) -> list[Chunk]:
    chunks = survey_chunks()
    index_chunks(chunks)
    return chunks


@pytest.mark.parametrize("mode", ["hybrid", "vector", "lexical"])
def test_each_mode_finds_the_passage(corpus: list[Chunk], mode: str) -> None:
    hits = search("How many people came to the Zephyrine picnic?", k=3, mode=mode, document_ids=CORPUS_DOCS)
    assert hits[0].chunk_id == f"{TEXT_DOC}:00000"
    assert hits[0].document == "/archive/zoo-news.mhtml"
    assert hits[0].char_span == (0, len(corpus[0].text))


def test_one_statement_finds_what_the_separate_lookups_do(corpus: list[Chunk]) -> None:
    """The candidates' one round trip holds every chunk an exact kNN finds, and the rows asked for by
    id, each with its stored row and vector; filters hold on all of them."""
    store = PgVectorStore(384)
    vectors = encode(["Quokka enclosure fence", "feed tonnage chart"], RagConfig().embedding.model)
    also = [f"{TEXT_DOC}:00001", f"{PDF_DOC}:00000", "no-such-chunk"]
    found = store.candidates(vectors, 3, also, ef_search=400)
    with connect() as conn:
        for vector in vectors:
            exact = conn.execute(
                "SELECT chunk_id FROM chunks WHERE kind <> 'page' ORDER BY embedding <=> %s LIMIT 3",
                (vector,),
            ).fetchall()
            assert {row[0] for row in exact} <= set(found.chunks)
    assert set(also[:2]) <= set(found.chunks) and "no-such-chunk" not in found.chunks
    assert found.chunks[f"{PDF_DOC}:00000"] == corpus[-1]
    assert set(found.chunks) == set(found.embeddings)
    stored = store.similarities(vectors[0], list(found.chunks))
    assert found.nearest[0] == pytest.approx({cid: stored[cid] for cid in found.nearest[0]}, abs=1e-6)

    charts = {"image_type": "Chart"}
    found = store.candidates(vectors[1:], 2, also, ef_search=40, kinds=["image"], metadata=charts)
    assert found.chunks and all(
        c.kind == "image" and c.metadata.get("image_type") == "Chart" for c in found.chunks.values()
    ), "rows asked for by id pass the filters too"


def test_searches_run_at_once_from_several_threads_find_what_each_finds_alone(corpus: list[Chunk]) -> None:
    """A server answers several searches at once; each runs its embedding and lookups in the one
    pool of search threads beside the others', and gets the hits it gets when it runs alone."""
    questions = [
        "How many people came to the Zephyrine picnic?",
        "feed tonnage by enclosure",
        "Quokka enclosure fence",
        "What do the burrows show?",
    ] * 3
    alone = {question: search(question, k=3, document_ids=CORPUS_DOCS) for question in set(questions)}
    with ThreadPoolExecutor(max_workers=6) as threads:
        together = list(threads.map(lambda q: search(q, k=3, document_ids=CORPUS_DOCS), questions))
    assert together == [alone[question] for question in questions]


def test_a_failed_query_embedding_fails_the_search_with_its_reason(
    corpus: list[Chunk], monkeypatch: pytest.MonkeyPatch
) -> None:
    def unavailable(*_args, **_kwargs):
        raise EmbeddingModelError("model 'x' is not available offline")

    monkeypatch.setattr(candidates, "encode", unavailable)
    with pytest.raises(EmbeddingModelError, match="not available offline"):
        search("a question no search here asked before", k=3, document_ids=CORPUS_DOCS)


def test_a_process_whose_database_changes_searches_the_new_one(
    survey: list[Chunk], fresh_database: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The store is kept per process and database: after the database in effect changes (another
    home or `database.url`), a search reads the new one, its tables made there, not the old one's
    rows."""
    assert search("burrows per hectare", k=3, document_ids=[SURVEY_DOC])
    monkeypatch.setenv("VISION_RAG_PG_URL", fresh_database)
    assert search("burrows per hectare", k=3) == []


def test_a_text_query_is_one_postgres_round_trip(survey: list[Chunk]) -> None:
    round_trips = bench_module("bench_query_scale").round_trips
    search("Quokka enclosure", k=3)  # the store opened and its schema checked
    for arguments in ({}, {"kinds": ["image"], "metadata": {"image_type": "Chart"}}, {"unit": "page"}):
        with round_trips() as counted:
            search("What do the burrows on page 2 show?", k=3, **arguments)
        assert counted == [1], arguments
    with round_trips() as counted:  # documents named by path or file name are looked up first
        search("What do the burrows on page 2 show?", k=3, document_ids=["quokka-survey.pdf"])
    assert counted == [2]


DOCUMENT_CHOICES = [
    TEXT_DOC,
    CHART_DOC,
    SURVEY_DOC,
    "zoo-news.mhtml",
    "/archive/quokka-survey.pdf",
    "nope.pdf",
]
METADATA_CHOICES = [
    {"image_type": "Chart"},
    {"title": "Quokka habitat survey"},
    {"source": "/archive/zoo-news.mhtml"},
    {"no_such_key": "zzz"},
]
QUERIES = [
    "Quokka enclosure",
    "What do the burrows on page 2 show?",
    "Figure 1 burrows per hectare",
    "Whom does the last page say to contact?",
    "feed tonnage chart",
]


@given(
    query=st.sampled_from(QUERIES),
    documents=st.none() | st.lists(st.sampled_from(DOCUMENT_CHOICES), min_size=1, max_size=3, unique=True),
    kinds=st.none() | st.lists(st.sampled_from(["text", "table", "image"]), min_size=1, unique=True),
    metadata=st.none() | st.sampled_from(METADATA_CHOICES),
    unit=st.sampled_from(["chunk", "page"]),
)
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_every_hit_satisfies_the_filters_on_every_path(
    survey: list[Chunk],
    query: str,
    documents: list[str] | None,
    kinds: list[str] | None,
    metadata: dict | None,
    unit: str,
) -> None:
    """Page units, pointed pages, the named documents' own searches and BM25 all propose candidates;
    whichever did, a hit is in the documents asked for, of the kinds asked for, with the metadata."""
    store = vector_store(RagConfig().embedding.model)
    allowed = set(store.resolve_documents(documents)) if documents is not None else None
    hits = search(query, k=10, document_ids=documents, kinds=kinds, metadata=metadata, unit=unit)
    chunks = [passage for hit in hits for passage in (hit.passages if unit == "page" else [hit])]
    rows = store.candidates([], 0, [c.chunk_id for c in chunks]).chunks  # content chunks' stored rows
    for chunk in chunks:
        # a pointed page unit (unfiltered searches only) is no content chunk: its hit says what it is,
        # and whichever documents indexed it (the samples of test_pipeline too)
        row = rows.get(chunk.chunk_id)
        document_id = row.document_id if row else store.resolve_documents([chunk.document])[0]
        assert allowed is None or document_id in allowed, (chunk, allowed)
        if kinds is not None or metadata:
            assert row is not None and row.kind in (kinds or ["text", "table", "image"]), (chunk, kinds)
        if metadata:
            assert row.metadata.items() >= metadata.items(), (row.metadata, metadata)
    if unit == "page":  # a paginated document's hits are its pages; a web archive's, its chunks
        assert all((hit.kind == "page") == (hit.page is not None) for hit in hits), hits
        assert all(passage.page == hit.page for hit in hits for passage in hit.passages)
    scores = [hit.score for hit in hits]
    assert scores == sorted(scores, reverse=True), "hits come best first, as their scores say"
    pictures = [(hit.document, hit.image) for hit in hits if hit.image]
    assert len(pictures) == len(set(pictures)), "one hit per picture"


def test_a_picture_is_one_hit_however_many_chunks_describe_it(survey: list[Chunk]) -> None:
    hits = search("burrows per hectare chart Figure 1", k=5, document_ids=[SURVEY_DOC], unit="chunk")
    assert [hit.image for hit in hits].count(SURVEY_IMAGE) == 1
    assert len(hits) == 4, "the other three things of the document fill the places the excerpt would take"


def test_a_page_hit_carries_its_best_passages_and_its_place(survey: list[Chunk]) -> None:
    hits = search("burrows per hectare", k=3, document_ids=[SURVEY_DOC], unit="page")
    assert len({hit.page for hit in hits}) == len(hits) == 3
    best = hits[0]
    assert best.kind == "page" and best.page == 2 and best.chunk_id == f"{SURVEY_DOC}:page-2"
    assert best.document == "/archive/quokka-survey.pdf"
    assert {p.page for p in best.passages} == {2} and best.passages[0].score == best.score
    assert "burrows per hectare" in best.text


def test_the_ranker_file_must_describe_these_features(tmp_path: Path) -> None:
    shipped = load_ranker()
    assert shipped.features == list(FEATURES) and shipped.fitted_on
    other = tmp_path / "old.json"
    other.write_text(shipped.model_copy(update={"features": [*FEATURES[1:], "rrf"]}).model_dump_json())
    with pytest.raises(ValueError, match=r"old.json: .*missing \['cosine'\], unknown \['rrf'\]\); refit"):
        load_ranker(str(other))


def test_a_config_with_retired_ranking_settings_loads_and_says_so() -> None:
    with pytest.warns(UserWarning, match="rerank_depth, rrf_k no longer apply"):
        retrieval = RetrievalConfig.model_validate({"k": 7, "rrf_k": 60, "rerank_depth": 20})
    assert retrieval.k == 7


def test_a_refitted_ranker_named_in_the_config_is_used(survey: list[Chunk], tmp_path: Path) -> None:
    """`retrieval.ranker` names a weights file: one that only counts pointed pages puts page 3 first
    for a question naming it, whatever the rest says."""
    pointed_only = Ranker(
        version="test",
        features=list(FEATURES),
        weights=[1.0 if name == "pointed" else 0.0 for name in FEATURES],
        fitted_on="a test",
    )
    path = tmp_path / "ranker.json"
    path.write_text(pointed_only.model_dump_json())
    config = RagConfig(retrieval=RetrievalConfig(ranker=str(path)))
    hits = search("burrows per hectare on page 3", k=2, document_ids=[SURVEY_DOC], config=config)
    assert hits[0].page == 3


@pytest.mark.parametrize(
    ("pointers", "page"),
    [
        (Pointers(["3"], [], []), 3),
        (Pointers([], [], ["figure 1"]), 2),
        (Pointers([], ["first"], []), 1),
        (Pointers([], ["last"], []), 3),
        (Pointers([], ["second_last"], []), 2),
    ],
)
def test_the_chunks_a_question_points_at_are_those_on_its_page(
    survey: list[Chunk], pointers: Pointers, page: int
) -> None:
    """A page it names, a figure it names, the first, last or second last page: each is found by the
    landmarks' own indexes, within the document and across the index."""
    store = vector_store(RagConfig().embedding.model)
    vector = encode(["burrows"], RagConfig().embedding.model)[0]
    for documents in ([SURVEY_DOC], None):
        found = store.candidates([vector], 5, pointers=pointers, document_ids=documents)
        survey_pointed = [cid for cid in found.pointed if cid.startswith(SURVEY_DOC)]
        on_page = {chunk.chunk_id for chunk in survey if chunk.page == page and chunk.kind != "page"}
        assert on_page <= set(survey_pointed), (documents, found.pointed)
        assert all(found.chunks[cid].page == page for cid in survey_pointed), (documents, found.pointed)


def test_a_resized_copy_of_a_chart_finds_its_image_chunk(corpus: list[Chunk], tmp_path: Path) -> None:
    query = tmp_path / "smaller-copy.png"
    query.write_bytes(chart(scale=0.8))
    hits = search(image=query, k=3)
    assert hits[0].chunk_id == f"{CHART_DOC}:00000"
    assert hits[0].image == "https://zoo.example/feed.png"


def photographed(png: bytes) -> bytes:
    """The picture as a blurred phone photo: no word of it reads any more, its shapes remain."""
    img = Image.open(io.BytesIO(png)).convert("RGB").filter(ImageFilter.GaussianBlur(4))
    buffer = io.BytesIO()
    img.resize((img.width // 2, img.height // 2)).save(buffer, format="JPEG", quality=30)
    return buffer.getvalue()


def test_a_photo_of_a_chart_whose_text_no_longer_reads_finds_it_by_its_picture(
    corpus: list[Chunk], tmp_path: Path
) -> None:
    query = tmp_path / "photo.jpg"
    query.write_bytes(photographed(chart()))
    picture = describe_query_image(query)
    assert "Quokka" not in picture.text  # the text search has nothing to go on
    hits = search(image=query, k=3)
    assert hits[0].chunk_id == f"{CHART_DOC}:00000"
    assert hits[0].score == 1.0, "found as the same picture"


def test_a_picture_counts_as_the_copied_one_only_when_no_other_is_nearly_as_close() -> None:
    clear = {"a:1": (2, "aa"), "b:1": (2, "aa"), "c:1": (9, "cc")}  # one picture in two documents
    assert same_picture(clear) == ["a:1", "b:1"]
    siblings = {"a:1": (3, "aa"), "c:1": (8, "cc")}  # one chart template, two periods
    assert same_picture(siblings) == []
    assert same_picture({"a:1": (9, "aa")}) == []  # too far to be a copy


@st.composite
def near_pictures(draw: st.DrawFn) -> dict[str, tuple[int, str]]:
    """Chunks of a few indexed pictures, each picture at its own distance from the query."""
    distances = draw(st.dictionaries(st.sampled_from("abcd"), st.integers(0, 64), min_size=1))
    chunks = draw(st.dictionaries(st.text(min_size=1), st.sampled_from(sorted(distances)), max_size=8))
    return {cid: (distances[picture], picture) for cid, picture in chunks.items()}


@given(near_pictures())
def test_the_copied_picture_is_the_closest_one_and_clear_of_all_others(
    near: dict[str, tuple[int, str]],
) -> None:
    same = same_picture(near)
    if same:
        closest = min(distance for distance, _ in near.values())
        pictures = {near[cid][1] for cid in same}
        assert len(pictures) == 1 and {near[cid][0] for cid in same} == {closest}
        assert closest <= NEAR_DUPLICATE_BITS
        others = [d for d, picture in near.values() if picture not in pictures]
        assert all(d - closest >= NEAR_DUPLICATE_MARGIN for d in others)


def test_a_photo_of_another_picture_is_no_near_duplicate(corpus: list[Chunk], tmp_path: Path) -> None:
    img = Image.new("RGB", (640, 400), "white")
    ImageDraw.Draw(img).ellipse((200, 80, 440, 320), fill="#1f4e79")  # same colours, another shape
    buffer = io.BytesIO()
    img.save(buffer, format="PNG")
    query = tmp_path / "pie.jpg"
    query.write_bytes(photographed(buffer.getvalue()))
    scored = score_candidates([], image=describe_query_image(query))
    assert scored is None or same_picture(scored.pool.near) == []
    assert all(hit.score < 1.0 for hit in search(image=query, k=10))


def test_an_unreadable_query_image_is_a_clear_error(tmp_path: Path) -> None:
    bad = tmp_path / "notes.png"
    bad.write_bytes(b"not an image at all")
    with pytest.raises(QueryImageError, match="notes.png: not a readable image"):
        search(image=bad)
    with pytest.raises(QueryImageError, match="missing.png: cannot read"):
        search(image=tmp_path / "missing.png")


@given(
    st.text(st.characters(codec="utf-8"), max_size=120)
    | st.sampled_from(["John's April Н-558 营业收入 5.61"])
)
def test_the_set_of_a_texts_terms_is_read_as_its_terms_are(text: str) -> None:
    assert term_set(text) == frozenset(terms(text))


_TRICKY = st.text(st.sampled_from(list("aAİIsSeEpPНнОоб'’ -_5.,:/营业JohnAPRILseptember\n")), max_size=60)


@given(
    _TRICKY | st.text(st.characters(codec="utf-8"), max_size=120), st.lists(_TRICKY, max_size=4), st.data()
)
def test_the_terms_a_text_holds_are_its_terms_among_those_asked(
    text: str, others: list[str], data: st.DataObject
) -> None:
    """A search asks each candidate which of the question's terms it holds without tokenizing it
    whole: the answer must be what tokenizing it whole says, for terms it holds and terms it does not
    (parts of its words, words of other texts)."""
    offered = sorted(term_set(text)) + [term for other in others for term in terms(other)] + others
    wanted = frozenset(data.draw(st.lists(st.sampled_from(offered), max_size=8)) if offered else [])
    assert held_terms(text, wanted) == term_set(text) & wanted


def test_a_term_no_candidate_holds_changes_nothing() -> None:
    texts = [
        "Kubernetes nodes report their capacity to the control plane.",
        "Tell the story of the project in a short README.",
        "The Kubernetes scheduler assigns pods to nodes by resource requests.",
    ]
    shares = term_shares("Tell me how Kubernetes schedules pods", texts)
    assert shares[2] > shares[1], "the sentence about pods holds the rarer asked word"
    assert term_shares("zebra xylophone", texts).tolist() == [0.0, 0.0, 0.0]


def test_the_word_only_the_answer_has_outweighs_words_every_excerpt_repeats() -> None:
    """Terms weigh by how few candidates hold them: the period every excerpt of a quarter repeats
    tells them apart less than the one word asked about (a memo writing "2 кв." for "2 квартал")."""
    texts = [f"Северный ветер, 2 квартал 2024 года: показатель {i}" for i in range(8)]
    texts.append("Доля рынка, 2 кв. 2024 г.: 19,6 %")
    shares = term_shares("Доля рынка компании Северный ветер за 2 квартал 2024 года", texts)
    assert all(shares[-1] > share for share in shares[:-1]), shares


def test_a_month_is_matched_as_written_not_as_a_quarter() -> None:
    march, quarter = term_shares(
        "In March 2021, what was the price?",
        ["In March 2021 the price closed at $121.", "Q1 2021 average price: $118"],
    )
    assert march > quarter


def test_a_latin_code_matches_its_cyrillic_reading() -> None:
    pump, valve = term_shares(
        "Где находится H-558?", ["Насос \u041d-558 поставлен.", "Клапан \u0415-558 заменён."]
    )
    assert pump > valve


def test_content_query_drops_the_terms_most_candidates_share() -> None:
    candidates = [
        "Tidewell Software Quarterly Report, Q3 2023: Support tickets 33,773",
        "Tidewell Software Quarterly Report, Q3 2023: Revenue $12.4 million",
        "Tidewell Software Quarterly Report, Q3 2023: Headcount 412",
    ]
    question = "How many help-desk requests came in at Tidewell Software's desk during Q3 2023?"
    assert content_query(question, candidates) == "help-desk requests came desk during"
    assert content_query("Tidewell Software Q3 2023", candidates) == ""


KPI_TITLE = "Quokka Zoo Quarterly Report, Q3 2024"
KPI_ROWS = [
    "Gift shop sales came in at $88,400",
    "Feed cost per animal $12.40 $11.00 Watch",
    "Keeper overtime hours 1,320 1,100 Watch",
    "Visitor admissions 48,210 45,000 Ahead",
    "Enclosure repairs completed 14 12 On track",
]


def kpi_excerpts() -> list[Chunk]:
    """Excerpt chunks of one KPI table as the chunk builder makes them: one long shared heading, one
    row each; one picture."""
    heading = f"{KPI_TITLE} — Figure 3. Key performance indicators against target. — KPI summary, Q3 2024"
    return [
        Chunk(
            chunk_id=f"{KPI_DOC}:{i:05d}",
            document_id=KPI_DOC,
            index=i,
            kind="image",
            text=f"{heading}: {row}",
            image="https://zoo.example/kpis.png",
            metadata={"source": "/archive/zoo-q3-2024.pdf", "title": KPI_TITLE, "image_excerpt": i},
        )
        for i, row in enumerate(KPI_ROWS)
    ]


# question -> index of the KPI row it asks about, in none of the row's words. ("How many guests came
# in ...?" shows the gift-shop row, which says "came in" verbatim: the fitted ranker weighs the
# question's words a passage holds, within a document too.)
PARAPHRASES = {
    "How much did Quokka Zoo pay to feed each animal in Q3 2024?": 1,
    "How many extra hours did Quokka Zoo's keepers work in Q3 2024?": 2,
    "How many enclosures did Quokka Zoo fix in Q3 2024?": 4,
    "What did the souvenir store at Quokka Zoo earn in Q3 2024?": 0,
}


def test_each_paraphrased_question_shows_the_row_it_asks_about(pg_url: str) -> None:
    """The table is one picture, so one hit: the excerpt it shows is the row the question asks about,
    though the shared heading repeats the question's other words in every row."""
    index_chunks(kpi_excerpts())
    shown = {}
    for question, row in PARAPHRASES.items():
        hits = search(question, k=5, document_ids=[KPI_DOC])
        assert len(hits) == 1
        shown[question] = (hits[0].chunk_id, f"{KPI_DOC}:{row:05d}")
    assert all(got == wanted for got, wanted in shown.values()), shown
