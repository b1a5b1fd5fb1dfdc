"""Hybrid search, fusion, filters and search by image over a small index written directly."""

from __future__ import annotations

import io
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from PIL import Image, ImageDraw, ImageFilter, ImageFont
from psycopg.types.json import Jsonb

from vision_rag_pipeline.chunks.model import Chunk
from vision_rag_pipeline.core.config import RagConfig, RetrievalConfig
from vision_rag_pipeline.core.periods import without_periods
from vision_rag_pipeline.core.postgres import connect
from vision_rag_pipeline.documents.loader import load_document
from vision_rag_pipeline.documents.model import DocumentImage
from vision_rag_pipeline.embeddings.encoder import encode
from vision_rag_pipeline.enrichment.batch import enrich_document_images
from vision_rag_pipeline.enrichment.classifier import classify_images
from vision_rag_pipeline.indexes.lexical import LexicalDoc
from vision_rag_pipeline.indexes.lexical_backend import open_lexical_index
from vision_rag_pipeline.indexes.pgvector_store import PgVectorStore
from vision_rag_pipeline.query.image_query import QueryImageError, describe_query_image
from vision_rag_pipeline.query.search import (
    CHUNK_KINDS,
    Hit,
    Ranking,
    _unsure_ocr,
    content_query,
    cosine_similarities,
    fuse,
    match_scores,
    pages_in_document_order,
    query_terms,
    rerank,
    rrf_fuse,
    same_picture,
    search,
    vector_store,
    weighted_fuse,
)
from vision_rag_pipeline_tests.conftest import bench_module

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
    from vision_rag_pipeline.query.search import vector_store

    store = vector_store(RagConfig().embedding.model)
    lexical = open_lexical_index()
    for document_id in dict.fromkeys(c.document_id for c in chunks):
        own = [c for c in chunks if c.document_id == document_id]
        store.replace_document(document_id, own, encode([c.text for c in own], RagConfig().embedding.model))
        lexical.replace_document(
            document_id,
            [
                LexicalDoc(
                    chunk_id=c.chunk_id, document_id=c.document_id, kind=c.kind, text=c.text, page=c.page
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


@given(
    st.lists(
        st.dictionaries(st.text(min_size=1, max_size=3), st.floats(-50, 50), min_size=1, max_size=6),
        min_size=1,
        max_size=3,
    )
)
def test_weighted_fusion_scores_stay_within_the_weights(score_maps: list[dict[str, float]]) -> None:
    rankings = [Ranking(scores, 0.5 + i) for i, scores in enumerate(score_maps)]
    fused = weighted_fuse(rankings)
    assert min(fused.values()) >= 0 and max(fused.values()) <= sum(r.weight for r in rankings) + 1e-9
    for ranking in rankings:  # the best of a ranking gets its whole weight
        best = max(ranking.scores, key=ranking.scores.get)
        assert fused[best] >= ranking.weight - 1e-9


def test_rrf_rewards_agreement_between_rankings() -> None:
    fused = rrf_fuse([(["a", "b", "c"], 1.0), (["d", "b", "e"], 1.0)], rrf_k=60)
    assert max(fused, key=fused.get) == "b"  # second in both beats first in one


@pytest.mark.parametrize("mode", ["hybrid", "vector", "lexical"])
def test_each_mode_finds_the_passage(corpus: list[Chunk], mode: str) -> None:
    # among this module's documents: other tests' documents have page units, these chunks none
    hits = search("How many people came to the Zephyrine picnic?", k=3, mode=mode, document_ids=CORPUS_DOCS)
    assert hits[0].chunk_id == f"{TEXT_DOC}:00000"
    assert hits[0].document == "/archive/zoo-news.mhtml"
    assert hits[0].char_span == (0, len(corpus[0].text))


def test_weighted_fusion_is_configurable(corpus: list[Chunk]) -> None:
    config = RagConfig(retrieval=RetrievalConfig(fusion="weighted", lexical_weight=0.5))
    hits = search("Zephyrine picnic attendees", k=2, config=config)
    assert hits[0].chunk_id == f"{TEXT_DOC}:00000"
    assert hits[0].score <= 1.5


def nearest_alone(vector: np.ndarray, limit: int, ef_search: int, where: str = "", *params) -> list[tuple]:
    """pgvector kNN as its own statement: the oracle for `PgVectorStore.candidates`."""
    with connect() as conn:
        conn.execute(f"SET LOCAL hnsw.ef_search = {ef_search}")
        if where:
            conn.execute("SET LOCAL hnsw.iterative_scan = 'relaxed_order'")
        rows = conn.execute(
            f"SELECT chunk_id, 1 - (embedding <=> %s) FROM chunks {where} ORDER BY embedding <=> %s LIMIT %s",
            (vector, *params, vector, limit),
        ).fetchall()
    return sorted(rows, key=lambda row: -row[1])


def rows_alone(chunk_ids: list[str]) -> dict[str, Chunk]:
    """The rows of `chunk_ids` as their own statement."""
    return {c.chunk_id: c for c in PgVectorStore(384).candidates([], 0, chunk_ids).chunks.values()}


def test_one_statement_finds_what_the_separate_lookups_do(corpus: list[Chunk]) -> None:
    store = PgVectorStore(384)
    vectors = encode(["Quokka enclosure fence", "feed tonnage chart"], RagConfig().embedding.model)
    also = [f"{TEXT_DOC}:00001", f"{PDF_DOC}:00000", "no-such-chunk"]
    found = store.candidates(vectors, 3, also, ef_search=40)
    for vector, nearest in zip(vectors, found.nearest, strict=True):
        alone = nearest_alone(vector, 3, 40)
        assert list(nearest) == [chunk_id for chunk_id, _ in alone]
        assert list(nearest.values()) == pytest.approx([similarity for _, similarity in alone], abs=1e-9)
    wanted = {*also, *found.nearest[0], *found.nearest[1]} - {"no-such-chunk"}
    with connect() as conn:
        expected_rows = conn.execute(
            "SELECT chunk_id FROM chunks WHERE chunk_id = ANY(%s)", (list(wanted),)
        ).fetchall()
    assert set(found.chunks) == {row[0] for row in expected_rows} == set(found.embeddings)
    assert found.chunks[f"{PDF_DOC}:00000"] == corpus[-1]
    cosines = cosine_similarities(vectors[0], found.embeddings)
    assert cosines == pytest.approx(store.similarities(vectors[0], list(found.chunks)), abs=1e-6)

    charts = {"image_type": "Chart"}
    found = store.candidates(vectors[1:], 2, also, ef_search=40, kinds=["image"], metadata=charts)
    alone = nearest_alone(
        vectors[1], 2, 40, "WHERE kind = ANY(%s) AND metadata @> %s", ["image"], Jsonb(charts)
    )
    assert list(found.nearest[0]) == [chunk_id for chunk_id, _ in alone]
    assert found.matching == {
        cid for cid, chunk in found.chunks.items() if chunk.metadata.get("image_type") == "Chart"
    }


def search_separately(query: str, k: int, config: RagConfig) -> list[tuple[str, float]]:
    """A plain hybrid search composed of its parts, each its own lookup (kNN, BM25, rows, similarities)."""
    retrieval, model = config.retrieval, config.embedding.model
    pool, depth = max(k, retrieval.candidates), max(k, retrieval.rerank_depth)
    content = list(CHUNK_KINDS)  # page units rank pages, they are not hits
    nearest = dict(
        nearest_alone(encode([query], model)[0], pool, retrieval.ef_search, "WHERE kind = ANY(%s)", content)
    )
    lexical = {hit.chunk_id: hit.score for hit in open_lexical_index().search(query, pool, kinds=content)}
    rankings = [Ranking(nearest, retrieval.vector_weight), Ranking(lexical, retrieval.lexical_weight)]
    fused = fuse(rankings, retrieval)
    ranked = sorted(fused, key=lambda cid: -fused[cid])[: depth * 2]
    rows = rows_alone(ranked)
    best = [cid for cid in ranked if cid in rows][:depth]
    head = best[: retrieval.rerank_depth]
    texts = {cid: rows[cid].text for cid in head}
    titles = {cid: str(rows[cid].metadata.get("title") or "") for cid in head}
    asked = content_query(query, [f"{titles[cid]} {texts[cid]}" for cid in head])
    similarities = vector_store(model).similarities(encode([asked], model)[0], head) if asked else {}
    head = rerank(head, fused, match_scores(query, texts, titles), similarities, retrieval)
    head = sorted(head, key=lambda cid: _unsure_ocr(rows[cid]))
    return [(cid, round(fused[cid], 6)) for cid in (head + best[len(head) :])[:k]]


@pytest.mark.parametrize("fusion", ["rrf", "weighted"])
def test_a_hybrid_search_finds_what_its_parts_do_separately(corpus: list[Chunk], fusion: str) -> None:
    # the chunk-level parts only: page units and the named or dated documents' rankings have their
    # own tests; other tests' documents have page units, which would rank beside these chunks
    retrieval = RetrievalConfig(
        fusion=fusion,
        candidates=3,
        rerank_depth=3,
        page_weight=0,
        named_weight=0,
        period_weight=0,
        pages_within_documents=False,
    )
    config = RagConfig(retrieval=retrieval)
    index_chunks(kpi_excerpts())
    for query in [*PARAPHRASES, "Quokka enclosure", "Zephyrine picnic attendees", "feed tonnage"]:
        hits = search(query, k=4, config=config)
        expected = search_separately(query, 4, config)
        assert [h.chunk_id for h in hits] == [cid for cid, _ in expected], query
        assert [h.score for h in hits] == pytest.approx([score for _, score in expected], abs=1e-6)


def test_a_hybrid_text_query_is_one_postgres_round_trip(corpus: list[Chunk]) -> None:
    round_trips = bench_module("bench_query_scale").round_trips
    search("Quokka enclosure", k=3)  # the store opened and its schema checked
    alone = RagConfig(retrieval=RetrievalConfig(pages_within_documents=False))
    with round_trips() as plain:
        search("Quokka enclosure", k=3, config=alone)
    with round_trips() as filtered:
        search("Quokka enclosure", k=3, kinds=["image"], metadata={"image_type": "Chart"}, config=alone)
    assert plain == filtered == [1]
    # by default, one more for each document whose later hits its own search orders
    with round_trips() as ordered:
        hits = search("Quokka enclosure", k=3)
    documents = Counter(hit.document for hit in hits[1:])
    assert ordered == [1 + sum(count > 1 for count in documents.values())]


def test_filters_by_kind_document_and_metadata(corpus: list[Chunk]) -> None:
    query = "Quokka enclosure"
    assert {h.kind for h in search(query, k=10, kinds=["image"])} == {"image"}
    by_name = search(query, k=10, document_ids=["zoo-news.mhtml"])
    assert by_name and {h.document for h in by_name} == {"/archive/zoo-news.mhtml"}
    charts = search(query, k=10, metadata={"image_type": "Chart"})
    assert charts[0].chunk_id == f"{CHART_DOC}:00000"
    # other tests' documents share the index
    stored = PgVectorStore(384).candidates([], 0, [h.chunk_id for h in charts]).chunks
    assert {stored[h.chunk_id].metadata.get("image_type") for h in charts} == {"Chart"}
    assert search(query, k=10, document_ids=["no-such-document.pdf"]) == []
    with pytest.raises(ValueError, match="unknown chunk kind"):
        search(query, kinds=["video"])


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
    assert "Quokka" not in describe_query_image(query).text  # the text search has nothing to go on
    hits = search(image=query, k=3)
    assert hits[0].chunk_id == f"{CHART_DOC}:00000"
    off = RagConfig(retrieval=RetrievalConfig(near_duplicate_bits=None))
    without = {hit.chunk_id: hit.score for hit in search(image=query, k=10, config=off)}
    assert hits[0].score > without.get(hits[0].chunk_id, 0.0)  # found as the same picture


def test_a_picture_counts_as_the_copied_one_only_when_no_other_is_nearly_as_close() -> None:
    settings = RetrievalConfig(near_duplicate_bits=8, near_duplicate_margin=6)
    clear = {"a:1": (2, "aa"), "b:1": (2, "aa"), "c:1": (9, "cc")}  # one picture in two documents
    assert same_picture(clear, settings) == ["a:1", "b:1"]
    siblings = {"a:1": (3, "aa"), "c:1": (8, "cc")}  # one chart template, two periods
    assert same_picture(siblings, settings) == []
    assert same_picture({"a:1": (9, "aa")}, settings) == []  # too far to be a copy


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
    settings = RetrievalConfig()
    same = same_picture(near, settings)
    if same:
        closest = min(distance for distance, _ in near.values())
        pictures = {near[cid][1] for cid in same}
        assert len(pictures) == 1 and {near[cid][0] for cid in same} == {closest}
        assert closest <= settings.near_duplicate_bits
        others = [d for d, picture in near.values() if picture not in pictures]
        assert all(d - closest >= settings.near_duplicate_margin for d in others)


def test_a_photo_of_another_picture_is_no_near_duplicate(corpus: list[Chunk], tmp_path: Path) -> None:
    img = Image.new("RGB", (640, 400), "white")
    ImageDraw.Draw(img).ellipse((200, 80, 440, 320), fill="#1f4e79")  # same colours, another shape
    buffer = io.BytesIO()
    img.save(buffer, format="PNG")
    query = tmp_path / "pie.jpg"
    query.write_bytes(photographed(buffer.getvalue()))
    off = RagConfig(retrieval=RetrievalConfig(near_duplicate_bits=None))
    assert search(image=query, k=10) == search(image=query, k=10, config=off)


def test_an_unreadable_query_image_is_a_clear_error(tmp_path: Path) -> None:
    bad = tmp_path / "notes.png"
    bad.write_bytes(b"not an image at all")
    with pytest.raises(QueryImageError, match="notes.png: not a readable image"):
        search(image=bad)
    with pytest.raises(QueryImageError, match="missing.png: cannot read"):
        search(image=tmp_path / "missing.png")


def _reranked(
    query: str, texts: dict[str, str], titles: dict[str, str] | None = None, match_weight: float = 1.0
) -> list[str]:
    """The re-order with the fused scores falling in the given order and no content cosine;
    unrelated candidates fill the 20 re-scored hits."""
    texts = texts | {
        f"filler{i}": f"Opening hours of museum cafe number {i}." for i in range(20 - len(texts))
    }
    ids = list(texts)
    fused = {cid: 1.0 - i / len(ids) for i, cid in enumerate(ids)}
    matches = match_scores(query, texts, titles or {})
    ranked = rerank(ids, fused, matches, {}, RetrievalConfig(match_weight=match_weight))
    return [cid for cid in ranked if not cid.startswith("filler")]


def test_a_capitalised_verb_is_no_name_and_changes_no_order() -> None:
    texts = {
        "nodes": "Kubernetes nodes report their capacity to the control plane.",
        "story": "Tell the story of the project in a short README.",
        "pods": "The Kubernetes scheduler assigns pods to nodes by resource requests.",
    }
    query = "Tell me how Kubernetes schedules pods"
    assert "tell" in query_terms(query), "a word like any other, no name"
    ranked = _reranked(query, texts)
    assert ranked.index("pods") < ranked.index("story"), "the sentence about pods passes the one with 'Tell'"


def test_a_percentage_is_not_preferred_for_a_question_with_share_in_it() -> None:
    texts = {
        "eps": "Apple fiscal 2021: EPS $5.61, up 71% from $3.28.",
        "margin": "Apple fiscal 2021: gross margin 41.8 %, up from 38.2 %.",
    }
    question = "earnings per share of Apple in 2021"
    assert _reranked(question, texts) == ["eps", "margin"], "nothing tells them apart: the fused order stays"
    spelled = {"margin": texts["margin"], "eps": "Apple fiscal 2021: diluted earnings per share were $5.61."}
    assert _reranked(question, spelled)[0] == "eps", "the words themselves, found verbatim, win"


def test_a_month_is_matched_as_written_not_as_a_quarter() -> None:
    texts = {"march": "In March 2021 the price closed at $121.", "quarter": "Q1 2021 average price: $118"}
    question = "In March 2021, what was the price?"
    matches = match_scores(question, texts, {})
    assert matches["march"] > matches["quarter"]
    assert _reranked(question, texts) == ["march", "quarter"]


def test_a_month_written_out_meets_its_abbreviation_on_a_chart_axis() -> None:
    texts = {
        "q1": "Monthly active users, Q1 2023 (thousands): 512.0 498.3 505.1 · Jan Feb Mar",
        "q2": "Monthly active users, Q2 2023 (thousands): 804.7 731.4 754.9 · Apr May Jun",
    }
    question = "How many thousand people used the app in April 2023?"
    assert "apr" in query_terms(question)
    assert _reranked(question, texts) == ["q2", "q1"]


def test_a_question_naming_a_documents_title_finds_that_document_among_siblings() -> None:
    titles = {
        "q2": "Tidewell Software Quarterly Report, Q2 2023",
        "other": "Northwind Quarterly Report, Q3 2023",
        "q3": "Tidewell Software Quarterly Report, Q3 2023",
    }
    texts = {cid: "KPI summary: Support tickets 31,200 29,004 Watch" for cid in titles}
    question = "How many support tickets did Tidewell Software handle in Q3 2023?"
    assert _reranked(question, texts, titles)[0] == "q3"
    assert _reranked(question, texts, titles, match_weight=0.0) == list(texts), "match_weight 0 turns it off"


def test_the_word_only_the_answer_has_outweighs_words_every_excerpt_repeats() -> None:
    """Terms weigh by how few candidates hold them: the period every excerpt of a quarter repeats
    tells them apart less than the one word asked about (a memo writing "2 кв." for "2 квартал")."""
    texts = {f"row{i}": f"Северный ветер, 2 квартал 2024 года: показатель {i}" for i in range(8)}
    texts["memo"] = "Доля рынка, 2 кв. 2024 г.: 19,6 %"
    matches = match_scores("Доля рынка компании Северный ветер за 2 квартал 2024 года", texts, {})
    assert all(matches["memo"] > matches[f"row{i}"] for i in range(8)), matches


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
    """Excerpt chunks of one KPI table as the chunk builder makes them: one long shared heading, one row each."""
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


PARAPHRASES = {  # question -> index of the KPI row it asks about, in none of the row's words
    "How many guests came in at Quokka Zoo during Q3 2024?": 3,
    "How much did Quokka Zoo pay to feed each animal in Q3 2024?": 1,
    "How many extra hours did Quokka Zoo's keepers work in Q3 2024?": 2,
    "How many enclosures did Quokka Zoo fix in Q3 2024?": 4,
    "What did the souvenir store at Quokka Zoo earn in Q3 2024?": 0,
}


def test_each_paraphrased_question_gets_its_own_row_first(pg_url: str) -> None:
    index_chunks(kpi_excerpts())
    for question, row in PARAPHRASES.items():
        hits = search(question, k=5, document_ids=[KPI_DOC])
        rank = [h.chunk_id for h in hits].index(f"{KPI_DOC}:{row:05d}")
        # "guests came in": the gift-shop row says "came in" verbatim, but within one document exact
        # matches do not outvote what the question asks about
        assert rank == 0, (
            question,
            [h.text.rsplit(": ", 1)[1] for h in hits],
        )
    souvenirs = "What did the souvenir store at Quokka Zoo earn in Q3 2024?"
    whole_query_only = RagConfig(retrieval=RetrievalConfig(content_weight=0.0))
    hits = search(souvenirs, k=5, document_ids=[KPI_DOC], config=whole_query_only)
    assert hits[0].chunk_id != f"{KPI_DOC}:00000", "without the content re-score the shared heading decides"


def test_unsure_ocr_never_outranks_the_page_text_unless_asked_not_to(pg_url: str) -> None:
    """An image chunk of Low-confidence OCR that repeats the question's words comes after the
    paragraph that answers; with `low_confidence_ocr_last` off, plain ranking decides."""
    document = "scan-order-000000000009"
    source = {"source": "/archive/handbook.pdf", "title": "Maintenance handbook"}
    ocr = {"ocr_confidence": "Low", "fusion": "rule", "image_type": "Photo"}
    question = "torque wrench calibration interval"
    rows = [
        ("image", "Torque wrench calibration interval ry) 4 Car te Figur ALWe torque wrench calibration", 2),
        (
            "text",
            "Calibrate each torque wrench every 12 months or after 5,000 cycles, whichever comes first.",
            3,
        ),
    ]
    chunks = [
        Chunk(
            chunk_id=f"{document}:{index:05d}",
            document_id=document,
            index=index,
            kind=kind,
            text=text,
            page=page,
            metadata=source | (ocr if kind == "image" else {}),
        )
        for index, (kind, text, page) in enumerate(rows)
    ]
    index_chunks(chunks)
    hits = search(question, k=2, document_ids=[document])
    assert [h.page for h in hits] == [3, 2]
    plain = RagConfig(retrieval=RetrievalConfig(low_confidence_ocr_last=False))
    assert search(question, k=2, document_ids=[document], config=plain)[0].page == 2


def test_a_passage_is_not_the_answer_for_repeating_the_period_its_report_is_about() -> None:
    question = "Who led the Q2 2024 safety audit at the Gdansk site?"
    texts = {
        "opening": "Talfield Solar Operations Review Q2 2024. This review covers the second quarter of 2024.",
        "answer": "The safety audit at the Gdansk site was led by Marek Janssen.",
        "other quarter": "The safety audit at the Gdansk site was led by Pieter Weber.",
    }
    titles = {"opening": "Review Q2 2024", "answer": "Review Q2 2024", "other quarter": "Review Q3 2024"}
    scores = match_scores(without_periods(question), texts, titles, question)
    assert scores["answer"] > scores["opening"]  # the report's period is judged by its title
    assert scores["answer"] > scores["other quarter"]  # which names another quarter


@given(st.lists(st.sampled_from("abc"), min_size=1, max_size=12), st.randoms(use_true_random=False))
def test_a_documents_hits_after_the_first_take_its_places_in_its_own_page_order(
    documents: list[str], rnd
) -> None:
    """Across documents the ranking says which documents hold the hits, how many and which chunks;
    each searched document's own search says in which order its pages come after the first hit."""
    hits = [
        Hit(
            chunk_id=f"{doc}:{i}", document=doc, kind="text", text="", score=100.0 - i, page=rnd.randint(1, 4)
        )
        for i, doc in enumerate(documents)
    ]
    page_order = {doc: rnd.sample(range(1, 5), rnd.randint(1, 4)) for doc in "ab"}  # "c" was not searched
    ordered = pages_in_document_order(hits, documents, page_order)
    assert ordered[0] == hits[0]
    assert [hit.document for hit in ordered] == documents, "every place keeps its document"
    assert [hit.score for hit in ordered] == [hit.score for hit in hits], "and its score"
    assert sorted(hit.chunk_id for hit in ordered) == sorted(hit.chunk_id for hit in hits)
    for doc, pages in page_order.items():
        ranks = [
            pages.index(h.page) if h.page in pages else len(pages) for h in ordered[1:] if h.document == doc
        ]
        assert ranks == sorted(ranks)
    assert [h for h in ordered[1:] if h.document == "c"] == [h for h in hits[1:] if h.document == "c"]


def test_across_documents_a_documents_later_hits_follow_its_own_search(pg_url: str) -> None:
    topics = ["glacier melt rates", "alpine glacier retreat", "glacier mass balance", "glacier surveys"]
    chunks = [
        Chunk(
            chunk_id=f"glacier-{doc}-000000000:{page:05d}",
            document_id=f"glacier-{doc}-000000000",
            index=page,
            kind="text",
            text=f"Report {doc}, page {page}: the {topics[(page + doc) % 4]} measured at station {doc}{page}.",
            page=page + 1,
            char_span=(page * 100, page * 100 + 60),
            metadata={"source": f"/reports/glacier-{doc}.pdf"},
        )
        for doc in range(2)
        for page in range(4)
    ]
    index_chunks(chunks)
    documents = sorted({c.document_id for c in chunks})
    hits = search("glacier retreat measured at station", k=8, document_ids=documents)
    assert {h.document for h in hits} == {"/reports/glacier-0.pdf", "/reports/glacier-1.pdf"}
    for document in documents:
        own = [h.page for h in search("glacier retreat measured at station", k=8, document_ids=[document])]
        later = [h.page for h in hits[1:] if h.chunk_id.startswith(document)]
        assert later == sorted(later, key=own.index), document
