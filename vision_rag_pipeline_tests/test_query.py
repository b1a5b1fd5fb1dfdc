"""Hybrid search, fusion, filters and search by image over a small index written directly."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st
from PIL import Image, ImageDraw, ImageFont

from vision_rag_pipeline.chunks.model import Chunk
from vision_rag_pipeline.core.config import RagConfig, RetrievalConfig
from vision_rag_pipeline.documents.loader import load_document
from vision_rag_pipeline.documents.model import DocumentImage
from vision_rag_pipeline.embeddings.encoder import encode
from vision_rag_pipeline.enrichment.batch import enrich_document_images
from vision_rag_pipeline.enrichment.classifier import classify_images
from vision_rag_pipeline.indexes.lexical import LexicalDoc
from vision_rag_pipeline.indexes.lexical_backend import open_lexical_index
from vision_rag_pipeline.indexes.pgvector_store import PgVectorStore
from vision_rag_pipeline.query.image_query import QueryImageError
from vision_rag_pipeline.query.search import (
    Ranking,
    asks_for_share,
    content_query,
    query_identifiers,
    rerank_by_content,
    rerank_by_identifiers,
    rrf_fuse,
    search,
    weighted_fuse,
)

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
            metadata={"source": "/archive/zoo-feed.mhtml", "image_type": "Chart"},
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
    hits = search("How many people came to the Zephyrine picnic?", k=3, mode=mode)
    assert hits[0].chunk_id == f"{TEXT_DOC}:00000"
    assert hits[0].document == "/archive/zoo-news.mhtml"
    assert hits[0].char_span == (0, len(corpus[0].text))


def test_weighted_fusion_is_configurable(corpus: list[Chunk]) -> None:
    config = RagConfig(retrieval=RetrievalConfig(fusion="weighted", lexical_weight=0.5))
    hits = search("Zephyrine picnic attendees", k=2, config=config)
    assert hits[0].chunk_id == f"{TEXT_DOC}:00000"
    assert hits[0].score <= 1.5


def test_filters_by_kind_document_and_metadata(corpus: list[Chunk]) -> None:
    query = "Quokka enclosure"
    assert {h.kind for h in search(query, k=10, kinds=["image"])} == {"image"}
    by_name = search(query, k=10, document_ids=["zoo-news.mhtml"])
    assert by_name and {h.document for h in by_name} == {"/archive/zoo-news.mhtml"}
    charts = search(query, k=10, metadata={"image_type": "Chart"})
    assert charts[0].chunk_id == f"{CHART_DOC}:00000"
    stored = PgVectorStore(384).fetch([h.chunk_id for h in charts])  # other tests' documents share the index
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


def test_an_unreadable_query_image_is_a_clear_error(tmp_path: Path) -> None:
    bad = tmp_path / "notes.png"
    bad.write_bytes(b"not an image at all")
    with pytest.raises(QueryImageError, match="notes.png: not a readable image"):
        search(image=bad)
    with pytest.raises(QueryImageError, match="missing.png: cannot read"):
        search(image=tmp_path / "missing.png")


def test_identifier_rerank_prefers_the_right_quarter_and_company() -> None:
    texts = {
        "q2": "Tidewell Software Quarterly Report, Q2 2023: Support tickets 31,200",
        "other": "Northwind Quarterly Report, Q3 2023: Support tickets 12,000",
        "q3": "Tidewell Software Quarterly Report, Q3 2023: Support tickets 33,773",
    }
    question = "How many help-desk requests came in at Tidewell Software's desk during Q3 2023?"
    assert query_identifiers(question) == {"tidewell", "software", "q3", "2023"}
    assert rerank_by_identifiers(question, ["q2", "other", "q3"], texts) == ["q3", "q2", "other"]
    assert rerank_by_identifiers("how many tickets?", ["q2", "q3"], texts) == ["q2", "q3"], (
        "no identifiers: order kept"
    )


@pytest.mark.parametrize(
    ("question", "asks"),
    [
        ("What share of Quokka Zoo's Q2 2024 sales came from plush toys?", True),
        ("What percentage of its visitors came back in Q3?", True),
        ("What proportion of keepers left the zoo?", True),
        ("What per-share payout to shareholders did the board approve?", False),
        ("How many visitors came in Q3 2024?", False),
    ],
)
def test_questions_asking_for_a_share_are_told_apart(question: str, asks: bool) -> None:
    assert asks_for_share(question) is asks


def test_a_question_asking_for_a_share_puts_excerpts_stating_a_percentage_first() -> None:
    texts = {
        "units": "Quokka Zoo Quarterly Report, Q2 2024 — Units sold per product line: plush toys 41.2",
        "mix": "Quokka Zoo Quarterly Report, Q2 2024 — Share of revenue: plush toys 23.5% · snacks 40.1%",
        "sibling": "Quokka Zoo Quarterly Report, Q1 2024 — Share of revenue: plush toys 19.0%",
    }
    incoming = ["units", "sibling", "mix"]
    share = "What share of Quokka Zoo's Q2 2024 sales came from plush toys?"
    # the named report first, then within it the excerpt stating a percentage
    assert rerank_by_identifiers(share, incoming, texts) == ["mix", "units", "sibling"]
    units = "How many plush toys did Quokka Zoo sell in Q2 2024?"
    assert rerank_by_identifiers(units, incoming, texts) == ["units", "mix", "sibling"]


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
        assert hits[0].chunk_id == f"{KPI_DOC}:{row:05d}", (
            question,
            [h.text.rsplit(": ", 1)[1] for h in hits],
        )
    souvenirs = "What did the souvenir store at Quokka Zoo earn in Q3 2024?"
    whole_query_only = RagConfig(retrieval=RetrievalConfig(content_rerank_depth=0))
    hits = search(souvenirs, k=5, document_ids=[KPI_DOC], config=whole_query_only)
    assert hits[0].chunk_id != f"{KPI_DOC}:00000", "without the content re-score the shared heading decides"


def test_content_query_keeps_what_is_asked_without_naming_the_report() -> None:
    question = "How many help-desk requests came in at Tidewell Software's desk during Q3 2023?"
    assert content_query(question) == "help-desk requests came desk during"
    assert content_query("Tidewell Software Q3 2023") == ""
    assert query_identifiers("How many thousand visits did the website receive in April 2025?") == {
        "april",
        "2025",
        "q2",
    }, "a month and its year name the quarter"
    assert "q2" not in query_identifiers("May we see the 2025 visits?")


@given(
    st.lists(st.floats(0, 1), min_size=6, max_size=6),
    st.lists(st.floats(-1, 1), min_size=6, max_size=6),
    st.floats(0, 1),
)
def test_content_rescoring_never_puts_a_sibling_report_ahead(
    fused_scores: list[float], similarities: list[float], weight: float
) -> None:
    """Whatever the scores, the identifier order keeps the named company and quarter first, even
    when a sibling report also mentions the product the question asks about."""
    titles = {
        "right-a": "Tidewell Software Quarterly Report, Q3 2023",
        "right-b": "Tidewell Software Quarterly Report, Q3 2023",
        "q4-helix": "Tidewell Software Quarterly Report, Q4 2023",
        "q2": "Tidewell Software Quarterly Report, Q2 2023",
        "other-helix": "Northwind Quarterly Report, Q3 2023",
        "text": "Zoo news",
    }
    rows = {
        "right-a": "Revenue mix by product line, Q3 2023: Falcon 31.3% · 12.8% · Orion 17.4%",
        "right-b": "KPI summary, Q3 2023: Support tickets 33,773 29,004 Watch",
        "q4-helix": "Revenue mix by product line, Q4 2023: Falcon 34.2% · Helix 20.0%",
        "q2": "Revenue mix by product line, Q2 2023: Falcon 21.6%",
        "other-helix": "Revenue mix by product line, Q3 2023: Helix 11.0%",
        "text": "The Helix pilot enrolled 2,000 households.",
    }
    texts = {cid: f"{titles[cid]} — {row}" if cid != "text" else row for cid, row in rows.items()}
    ids = list(rows)
    by_content = rerank_by_content(
        ids, dict(zip(ids, fused_scores, strict=True)), dict(zip(ids, similarities, strict=True)), weight
    )
    question = "What share of Tidewell Software's Q3 2023 sales came from Helix?"
    ranked = rerank_by_identifiers(question, by_content, texts, titles)
    assert set(ranked[:2]) == {"right-a", "right-b"}
    assert ranked.index("q4-helix") < ranked.index("q2"), "same company and year, product named: next"
    assert ranked.index("q2") < ranked.index("other-helix"), "the product never outweighs the company"
