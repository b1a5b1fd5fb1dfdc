"""Cited answers: excerpts verbatim in their chunks and located in the source; LLM replies validated."""

from __future__ import annotations

import json
import os
from pathlib import Path

import openai
import pytest
from hypothesis import given
from hypothesis import strategies as st

from vision_rag_pipeline.core.config import AnswerConfig, EmbeddingConfig, ProviderLimits, RagConfig
from vision_rag_pipeline.documents.loader import load_document
from vision_rag_pipeline.embeddings.encoder import encode
from vision_rag_pipeline.enrichment.model import CHART_DATA_HEADING, MetaContent
from vision_rag_pipeline.enrichment.vlm import VisionClient
from vision_rag_pipeline.query.ask import UNRESOLVED_LOG, ask, decompose, extractive_answer, sentences
from vision_rag_pipeline.query.localize import find_excerpt, locate
from vision_rag_pipeline.query.search import Hit
from vision_rag_pipeline_tests.openai_fake import FakeOpenAI, chat_reply
from vision_rag_pipeline_tests.test_query import CHART_DOC, SAMPLE_PDF, TEXT_DOC, corpus, pdf_chunk

__all__ = ["corpus"]  # the index fixture, indexed again into this module's own index

# Answers are asserted over what this module indexed, and nothing else (the fixture is in conftest).
pytestmark = pytest.mark.usefixtures("own_index")

PICNIC = "How many people came to the Zephyrine Labs picnic?"


def as_hit(chunk) -> Hit:
    return Hit(
        chunk_id=chunk.chunk_id,
        document=chunk.metadata["source"],
        kind=chunk.kind,
        text=chunk.text,
        score=1.0,
        page=chunk.page,
        bbox=chunk.bbox,
        char_span=chunk.char_span,
        image=chunk.image,
    )


@given(st.text(alphabet="abc XYZ.\n", min_size=5, max_size=80), st.data())
def test_an_excerpt_is_found_despite_case_and_whitespace(text: str, data: st.DataObject) -> None:
    start = data.draw(st.integers(0, len(text) - 1))
    end = data.draw(st.integers(start + 1, len(text)))
    excerpt = text[start:end]
    if not excerpt.strip():
        return
    quoted = " ".join(excerpt.split()).upper()  # what an LLM does to a quote
    match = find_excerpt(quoted, text)
    assert match is not None
    assert " ".join(text[match.start : match.end].split()).upper() == quoted


def test_a_slightly_misquoted_excerpt_is_replaced_by_the_verbatim_text() -> None:
    text = (
        "Intro line.\nAt its meeting the Board approved a quarterly dividend of $0.42 per\nshare. Other news."
    )
    match = find_excerpt("the board approved a quarterly divident of $0.42 per share", text)
    assert match is not None
    assert text[match.start : match.end] == "the Board approved a quarterly dividend of $0.42 per\nshare"
    assert find_excerpt("completely unrelated words about football", text) is None


def test_a_pdf_excerpt_is_narrowed_to_the_element_it_falls_in() -> None:
    chunk = pdf_chunk()
    hit = as_hit(chunk)
    sentence = "The fleet in service reached 1,950 carts across 37 customer sites."
    where = locate(hit, find_excerpt(sentence, chunk.text))
    doc = load_document(SAMPLE_PDF)
    element = next(e for e in doc.elements if e.text.startswith(sentence))
    assert where.page == 1
    assert where.bbox == element.location.bbox
    assert where.bbox != chunk.bbox  # narrower than the chunk
    assert doc.text[where.char_span[0] : where.char_span[1]] == sentence


def test_sentences_never_cut_an_image_annotation_or_cite_the_image_context() -> None:
    text = "Results.\n\n![Figure 1. Key indicators.](doc.pdf#page=1&image=4)\n\nNext."
    assert [text[a:b] for a, b in sentences(text)] == [
        "Results.",
        "![Figure 1. Key indicators.](doc.pdf#page=1&image=4)",
        "Next.",
    ]
    meta = MetaContent(
        source="a/b.png", image_type="Chart", content="Chart.\nText in image:\nSales 4.2\nContext: Page text."
    ).render()
    found = [meta[a:b] for a, b in sentences(meta)]
    assert "Sales 4.2" in found and not any(
        "Page text" in sentence or "Source" in sentence for sentence in found
    )


def test_each_chart_row_is_a_sentence_whatever_its_case_and_the_heading_is_none() -> None:
    meta = MetaContent(
        source="a/b.png",
        image_type="Chart",
        content=f"Chart.\nText in image:\nFeed by pen\n{CHART_DATA_HEADING}\nwallaby: 71.3\nbilby: 52.9\nContext: Page text.",
    ).render()
    found = [meta[a:b] for a, b in sentences(meta)]
    assert found[-2:] == ["wallaby: 71.3", "bilby: 52.9"]
    assert not any(CHART_DATA_HEADING in sentence for sentence in found)


def _hit(chunk_id: str, text: str, kind: str = "image") -> Hit:
    return Hit(chunk_id=chunk_id, document="report.mhtml", kind=kind, text=text, score=1.0, image="c.png")


def _best(question: str, context: list[Hit]) -> str:
    embedding = EmbeddingConfig()
    vector = encode([question], embedding.model)[0]
    chosen = extractive_answer(question, vector, context, AnswerConfig(), embedding)
    hit, match, _ = chosen[0]
    return hit.text[match.start : match.end]


HEADING = "Larkspur Mills Quarterly Report, Q3 2024 — Figure {n}. — Output by mill, Q3 2024 (tonnes)"


def test_an_image_excerpts_heading_is_never_the_answer() -> None:
    """Every excerpt of an image repeats the document title and the image's title; matching the
    question's company and quarter, that heading used to be the answer to everything."""
    context = [_hit(f"c{n}", HEADING.format(n=n) + ": 100 · 80 · 60") for n in range(1, 4)]
    context.append(_hit("t", "Boiler upgrades cut gas use by 12,940 therms across the mills.", kind="text"))
    assert _best("How many therms did Larkspur Mills save in Q3 2024?", context) == (
        "Boiler upgrades cut gas use by 12,940 therms across the mills."
    )


def test_a_chart_row_under_its_excerpt_heading_answers_alone() -> None:
    context = [
        _hit(f"r{n}", HEADING.format(n=1) + f": {row}")
        for n, row in enumerate(["Alder: 41.7", "birch: 38.2"])
    ]
    context.append(_hit("s", HEADING.format(n=1) + ": 100 · 80 · 41.7 · 38.2 · Alder · birch"))
    assert _best("How many tonnes did the Birch mill produce in Q3 2024?", context) == "birch: 38.2"


def test_offline_answer_to_a_chart_question_is_the_bar_and_cites_the_chart(corpus) -> None:
    """The row alone is the answer, and its citation is the chart's chunk: the image, and where the
    image sits in its page (an excerpt read off an image is in no span of the page's text)."""
    answer = ask(
        "How many tonnes of feed did the Numbat enclosure get?",
        config=RagConfig(answer=AnswerConfig(use_llm=False)),
    )
    assert answer.answer == "Numbat: 88.4"
    [citation] = answer.citations
    chart = next(c for c in corpus if c.document_id == CHART_DOC)
    assert citation.chunk_id == chart.chunk_id and citation.excerpt == "Numbat: 88.4"
    assert citation.excerpt in chart.text
    where = (citation.page, citation.bbox, citation.char_span, citation.image)
    assert where == (chart.page, chart.bbox, chart.char_span, chart.image)


def test_compound_questions_are_split() -> None:
    assert decompose("What was revenue in Q3 and how many people were employed?", 3) == [
        "What was revenue in Q3?",
        "how many people were employed?",
    ]
    assert decompose("What was revenue in Q3?", 3) == []


def test_offline_answer_cites_verbatim_located_excerpts(corpus) -> None:
    answer = ask(PICNIC, config=RagConfig(answer=AnswerConfig(use_llm=False)))
    assert answer.answered and answer.method == "extractive"
    assert "734" in answer.answer
    texts = {hit.chunk_id: hit.text for hit in answer.hits}
    for citation in answer.citations:
        assert citation.excerpt in texts[citation.chunk_id]
    first = answer.citations[0]
    assert first.chunk_id == f"{TEXT_DOC}:00000"
    offset = texts[first.chunk_id].index(first.excerpt)
    assert first.char_span == (offset, offset + len(first.excerpt))  # chunk start 0 + offset


def test_unanswerable_questions_say_so_and_are_logged(corpus) -> None:
    question = "Which team won the 1998 football world cup final?"
    answer = ask(question, config=RagConfig(answer=AnswerConfig(use_llm=False)))
    assert not answer.answered and answer.citations == []
    log = Path(os.environ["VISION_RAG_HOME"]) / UNRESOLVED_LOG
    lines = log.read_text(encoding="utf-8").split(
        "\n"
    )  # JSON Lines: U+2028 or U+0085 inside a question is no break
    logged = [json.loads(line)["question"] for line in lines if line]
    assert question in logged


def test_an_invalid_llm_reply_is_retried_and_its_excerpt_made_verbatim(corpus) -> None:
    invalid = {
        "answer": "734 people.",
        "citations": [{"chunk_id": f"{TEXT_DOC}:00000", "excerpt": "999 guests"}],
    }
    valid = {
        "answer": "734 people attended.",
        "citations": [{"chunk_id": f"{TEXT_DOC}:00000", "excerpt": "the annual picnic drew 734  attendees"}],
    }
    with FakeOpenAI() as server:
        server.script(chat_reply(json.dumps(invalid)), chat_reply(json.dumps(valid)))
        raw = openai.OpenAI(base_url=server.base_url, api_key="test", max_retries=0)
        client = VisionClient(raw, engine="openai:fake", limits=ProviderLimits(max_attempts=1))
        answer = ask(PICNIC, config=RagConfig(), client=client)
    assert answer.method == "llm" and answer.answer == "734 people attended."
    assert [c.excerpt for c in answer.citations] == ["annual picnic drew 734 attendees"]
    first, second = server.requests
    assert first.body["response_format"]["type"] == "json_schema"
    assert "does not appear in chunk" in second.body["messages"][-1]["content"]


def test_an_image_chunk_citation_points_at_the_image(corpus) -> None:
    chart = next(c for c in corpus if c.document_id == CHART_DOC)
    hit = as_hit(chart)
    where = locate(hit, find_excerpt("Numbat", chart.text))
    assert where.image == "https://zoo.example/feed.png"
    assert where.char_span == (40, 40)


OPENING = "This report summarises how Larkspur Mills performed in Q3 2024."


def test_a_how_much_question_is_answered_by_a_sentence_with_a_number_it_did_not_give() -> None:
    """The opening line names the company and quarter the question names; only the other sentence
    says how much, in words the question does not use."""
    context = [
        _hit("a", f"{OPENING} Energy use across the mills came to 53,200 megawatt-hours.", kind="text"),
    ]
    assert _best("How much electricity, in MWh, did Larkspur Mills consume in Q3 2024?", context) == (
        "Energy use across the mills came to 53,200 megawatt-hours."
    )


def test_a_question_that_asks_for_no_quantity_may_be_answered_without_a_number() -> None:
    context = [
        _hit(
            "a",
            "Ada Brandt led the Larkspur Mills boiler upgrade. The upgrade cost 4.2 million.",
            kind="text",
        ),
    ]
    assert _best("Who led the Larkspur Mills boiler upgrade?", context) == (
        "Ada Brandt led the Larkspur Mills boiler upgrade."
    )


def test_a_number_written_as_a_word_answers_a_how_many_question() -> None:
    """Real manuals write small counts in words (IBM's DB2 Redpaper: "nine different built-in
    global variables"); the sentence saying so must not lose to one that merely has digits."""
    context = [
        _hit(
            "a",
            "DB2 for i supports nine different built-in global variables that the system maintains. "
            "Table 3-2 lists the global variables.",
            kind="text",
        ),
    ]
    assert _best("How many built-in global variables does DB2 for i support?", context) == (
        "DB2 for i supports nine different built-in global variables that the system maintains."
    )
