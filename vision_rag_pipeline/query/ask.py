"""Question answering with Generate-Attribute-Localize: every claim points at a verbatim excerpt.

1. Retrieve: hybrid search for the question (and its sub-questions, and the query image);
   the relevance filter and the token budget decide which chunks form the context.
2. Generate + attribute: with an LLM endpoint, a JSON-schema answer `{answer, citations:
   [{chunk_id, excerpt}]}`, validated (known chunk ids, excerpts found in their chunks) and
   retried with the errors (`next_prompt`) or a reworded question and wider context
   (`next_interpretation`). Offline, or when the LLM gives up: an extractive answer made of the
   best-scoring sentences of the context (question-term overlap + embedding similarity).
3. Localize: each excerpt is matched in its chunk, replaced by the chunk's verbatim text, and
   mapped to its page/bbox, char span or image (see `localize`).
Questions left without an answer are appended to `$VISION_RAG_HOME/unresolved.jsonl`.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Literal

import numpy as np
from pydantic import BaseModel, Field, ValidationError

from vision_rag_pipeline.chunks.annotations import ANNOTATION_RE, find_annotations
from vision_rag_pipeline.core.config import AnswerConfig, EmbeddingConfig, RagConfig, config_in_effect, home
from vision_rag_pipeline.core.text import query_terms, stem
from vision_rag_pipeline.documents.model import BBox
from vision_rag_pipeline.embeddings.encoder import encode
from vision_rag_pipeline.enrichment.model import MetaContent
from vision_rag_pipeline.enrichment.vlm import VisionClient, VisionError, vision_client_from_env
from vision_rag_pipeline.query.candidates import indexed_embedding, vector_store
from vision_rag_pipeline.query.image_query import describe_query_image
from vision_rag_pipeline.query.localize import Match, find_excerpt, locate
from vision_rag_pipeline.query.search import Hit, search_queries

NO_ANSWER = "No answer found in the indexed documents."
UNRESOLVED_LOG = "unresolved.jsonl"
# Sentence ends: Latin/Cyrillic punctuation before a capital or digit, Chinese/Japanese full-width
# punctuation anywhere (no space follows it), a blank line, a line break before a non-lower-case start.
_BOUNDARY = re.compile(
    r"(?<=[.!?:])\s+(?=[\"'(\[«„]?[A-ZА-ЯЁ0-9$])|(?<=[。！？；])\s*|\n\s*\n|\n(?=\s*[^a-zа-яё\s])"
)
_SUB_QUESTION_SPLIT = re.compile(
    r"\?\s+|;\s+|,?\s+and\s+(?=(?:what|which|who|when|where|why|how)\b)|,?\s+(?=also\b)", re.I
)
MAX_SENTENCE_CHARS = 400
_EXCERPT_LINE = re.compile(r"[^\s·](?:[^·]*[^\s·])?")  # one line of an image excerpt ("line · line")


class Citation(BaseModel):
    chunk_id: str
    document: str
    excerpt: str  # verbatim in the chunk's text
    page: int | None = None
    bbox: BBox | None = None
    char_span: tuple[int, int] | None = None
    image: str | None = None


class Answer(BaseModel):
    question: str
    answer: str
    answered: bool
    method: Literal["llm", "extractive"]
    citations: list[Citation] = Field(default_factory=list)
    hits: list[Hit] = Field(default_factory=list)


class _LlmCitation(BaseModel):
    chunk_id: str
    excerpt: str = Field(min_length=1)


class _LlmAnswer(BaseModel):
    answer: str
    citations: list[_LlmCitation]


ANSWER_SCHEMA = {
    "name": "cited_answer",
    "strict": True,
    "schema": {
        "type": "object",
        "additionalProperties": False,
        "required": ["answer", "citations"],
        "properties": {
            "answer": {"type": "string"},
            "citations": {
                "type": "array",
                "items": {
                    "type": "object",
                    "additionalProperties": False,
                    "required": ["chunk_id", "excerpt"],
                    "properties": {"chunk_id": {"type": "string"}, "excerpt": {"type": "string"}},
                },
            },
        },
    },
}
SYSTEM_PROMPT = (
    "Answer the question using only the numbered context chunks. Reply with JSON: "
    '{"answer": "...", "citations": [{"chunk_id": "<id of a chunk>", "excerpt": "<exact words copied '
    'from that chunk that support the answer>"}]}. Copy excerpts character for character, one short '
    'passage each. If the context does not answer the question, reply {"answer": "", "citations": []}.'
)


# --- retrieval and context -------------------------------------------------------------------------


def question_terms(text: str) -> set[str]:
    """Content words of a question (or of a sentence), as core/text.py gives them, stemmed."""
    return {stem(term) for term in query_terms(text)}


def decompose(question: str, limit: int) -> list[str]:
    """Sub-questions of a compound question ("What was X and how many Y?"), rule-based."""
    parts = [p.strip(" ,;?") for p in _SUB_QUESTION_SPLIT.split(question)]
    parts = [p + "?" for p in parts if len(question_terms(p)) >= 1]
    return parts[:limit] if len(parts) > 1 else []


def _tokens(text: str) -> int:
    return len(text.split())


def relevant_context(
    question_vector: np.ndarray, hits: list[Hit], config: RagConfig
) -> tuple[list[Hit], dict[str, float]]:
    """The hits worth showing the answerer: relevance filter, at most N documents, token budget."""
    answer = config.answer
    similarity = vector_store(config.embedding.model).similarities(
        question_vector, [h.chunk_id for h in hits]
    )
    kept: list[Hit] = []
    documents: list[str] = []
    budget = answer.context_token_budget
    for hit in hits:
        if answer.relevance_filter:
            if _tokens(hit.text) < answer.min_tokens:
                continue
            if similarity.get(hit.chunk_id, 0.0) < answer.min_similarity:
                continue
            if hit.document not in documents and len(documents) >= answer.max_documents:
                continue
        cost = int(_tokens(hit.text) * 1.3) + 1
        if kept and cost > budget:
            continue
        budget -= cost
        kept.append(hit)
        if hit.document not in documents:
            documents.append(hit.document)
    return kept, similarity


# --- offline extractive answer ---------------------------------------------------------------------


def sentences(text: str) -> list[tuple[int, int]]:
    """(start, end) of each sentence of a chunk, skipping a Meta-Content header.

    Boundaries: sentence punctuation before a capital or digit, blank lines, and line breaks
    that do not continue a sentence (the next line starts with a capital, digit or symbol): OCR
    text and table rows break lines there, while a wrapped sentence goes on in lower case. Each
    row of an image's chart data is a sentence of its own, whatever case its label starts with;
    the data's heading is none.
    """
    body, rows = text, []
    layout = MetaContent.layout(text)
    if layout is not None:  # the header blanked, the page context (cited from its text chunk) cut off
        (start, end), heading, rows = layout
        body = " " * start + text[start:end]
        if heading is not None:  # the heading is no sentence
            body = body[: heading[0]] + " " * (heading[1] - heading[0]) + body[heading[1] :]
    notes = find_annotations(body)
    cuts = {0, len(body)} | {m.start() for m in _BOUNDARY.finditer(body)} | {c for row in rows for c in row}
    whole = [(n.start, n.end) for n in notes] + rows  # annotations and chart rows stay whole
    cuts = sorted(c for c in cuts if not any(a < c < b for a, b in whole))
    spans: list[tuple[int, int]] = []
    for a, b in zip(cuts, cuts[1:], strict=False):
        while a < b and body[a].isspace():
            a += 1
        while b > a and body[b - 1].isspace():
            b -= 1
        if b > a and any(c.isalnum() for c in body[a:b]):
            spans.append((a, min(b, a + MAX_SENTENCE_CHARS)))
    return spans


def _excerpt_heading_end(hit: Hit) -> int:
    """Where an image excerpt's own text starts, after the heading the chunk builder puts before it
    ("<document title> — <caption> — <image title>: "); 0 for every other chunk."""
    if hit.kind != "image" or hit.text.startswith("<meta>") or ": " not in hit.text:
        return 0
    return hit.text.index(": ") + 2


def _candidates(context: list[Hit]) -> tuple[list[tuple[Hit, tuple[int, int], bool]], dict[str, str]]:
    """Every sentence of the context as (hit, span, read under a title), and each excerpt's heading.

    An image excerpt's lines, joined by " · ", are its sentences ("Lynx: 47.2" is not cut at its
    colon), those with a number read under the excerpt's heading; in a Meta-Content chunk, the rows
    of its chart data are.
    """
    candidates: list[tuple[Hit, tuple[int, int], bool]] = []
    headings: dict[str, str] = {}
    for hit in context:
        begin = _excerpt_heading_end(hit)
        if begin:
            headings[hit.chunk_id] = hit.text[: begin - 2]
            for line in _EXCERPT_LINE.finditer(hit.text, begin):
                candidates.append((hit, line.span(), any(c.isdigit() for c in line.group())))
            continue
        layout = MetaContent.layout(hit.text)
        rows = set(layout.chart_rows) if layout else set()
        candidates += [(hit, span, span in rows) for span in sentences(hit.text)]
    return candidates, headings


_QUANTITY_QUESTION = re.compile(
    r"\bhow (?:much|many|large|big|long|far|often|old)\b|\bwhat (?:percentage|percent|proportion|number|amount)\b",
    re.IGNORECASE,
)
_NUMBER = re.compile(  # digits not glued to letters ("Q2", "H1", "FY24" are names), or a number word
    r"(?<![^\W_])\d+(?:[.,]\d+)*|\b(?:zero|one|two|three|four|five|six|seven|eight|nine|ten|eleven|twelve|"
    r"(?:thir|four|fif|six|seven|eigh|nine)teen|(?:twen|thir|for|fif|six|seven|eigh|nine)ty|hundred|thousand|"
    r"million|billion|dozen)\b",
    re.IGNORECASE,
)
# A sentence without a number the question lacks cannot say how much: the report's opening line
# ("how Tidewell performed in Q1 2023") matched the question's name and quarter better than the
# sentence with the megawatt-hours and was the offline answer to every such question.
NO_NEW_NUMBER_WEIGHT = 0.5


def asks_for_a_quantity(question: str) -> bool:
    """An English question whose answer is a number ("How many...", "What percentage...")."""
    return bool(_QUANTITY_QUESTION.search(question))


def _numbers(text: str) -> set[str]:
    """The numbers of a text, by their digits ("53,200" and "53.200" are one number) or word."""
    return {re.sub(r"[.,]", "", number).lower() for number in _NUMBER.findall(text)}


def extractive_answer(
    question: str,
    question_vector: np.ndarray,
    context: list[Hit],
    answer: AnswerConfig,
    embedding: EmbeddingConfig,
) -> list[tuple[Hit, Match, float]]:
    """The best sentences of the context: half term overlap with the question, half cosine similarity.

    A value ("Lynx: 47.2", a chart's row or an image excerpt's line with a number) says what it is
    about only under its title: the heading of an excerpt chunk (never an answer itself, it names
    the document and the image), or for a row of an image's chart data the best other sentence of
    its chunk. When such a line adds a question term its title lacks, it is scored with the title's
    terms and similarity too, and answers alone. A sentence is read in its chunk (the question's
    terms the chunk holds elsewhere count half), and one that cannot say how much does not answer
    "how much" as well as one that can (`asks_for_a_quantity`).
    """
    terms = question_terms(question)
    candidates, headings = _candidates(context)
    if not candidates or not terms:
        return []
    texts = [" ".join(hit.text[a:b].split()) for hit, (a, b), _ in candidates]
    vectors = encode([*texts, *headings.values()], embedding.model, precision=embedding.precision)
    cosine = [float(c) for c in vectors @ question_vector]
    found = [question_terms(text) & terms for text in [*texts, *headings.values()]]

    def score(held: set[str], similarity: float) -> float:
        return 0.5 * len(held) / len(terms) + 0.5 * similarity

    # A sentence is read in its chunk: the question's terms its chunk holds elsewhere (the company
    # and quarter of a report's heading) count for it at half weight.
    in_chunk = {hit.chunk_id: question_terms(hit.text) & terms for hit in context}
    scores = [
        score(found[i], cosine[i]) + 0.25 * len(in_chunk[hit.chunk_id] - found[i]) / len(terms)
        for i, (hit, _, _) in enumerate(candidates)
    ]
    # chunk id -> index (into texts + headings) of its title: its heading, else its best sentence not read under one
    titles = {chunk_id: len(texts) + n for n, chunk_id in enumerate(headings)}
    for index, (hit, _, under_title) in enumerate(candidates):
        if under_title or hit.chunk_id in headings:
            continue
        best = titles.get(hit.chunk_id)
        if best is None or scores[index] > scores[best]:
            titles[hit.chunk_id] = index
    ranked = []
    read_under: dict[int, int] = {}  # candidate -> the sentence it was read with as its title
    for index, (hit, (a, b), under_title) in enumerate(candidates):
        value = scores[index]
        title = titles.get(hit.chunk_id)
        if under_title and title is not None and found[index] - found[title]:
            read_under[index] = title
            value = score(found[index] | found[title], max(cosine[index], cosine[title]))
        ranked.append((value, index, hit, Match(start=a, end=b, ratio=1.0)))
    if asks_for_a_quantity(question):
        given = _numbers(question)
        ranked = [
            (value if _numbers(texts[index]) - given else value * NO_NEW_NUMBER_WEIGHT, index, hit, match)
            for value, index, hit, match in ranked
        ]
    ranked.sort(key=lambda item: -item[0])
    chosen: list[tuple[Hit, Match, float]] = []
    said: list[str] = []
    titles_said: set[int] = set()
    for value, index, hit, match in ranked:
        if value < answer.min_sentence_score or len(chosen) >= answer.max_sentences:
            break
        if chosen and value < chosen[0][2] * 0.8:
            break  # far weaker than the best sentence: it would dilute the answer
        if index in titles_said:
            continue  # the title a chosen row was read with: the row answers alone
        text = " ".join(hit.text[match.start : match.end].split()).lower()
        if any(text in seen or seen in text for seen in said):
            continue  # the same sentence from another chunk (image context, overlap)
        said.append(text)
        chosen.append((hit, match, round(value, 4)))
        if index in read_under:
            titles_said.add(read_under[index])
    return chosen


# --- LLM answer ------------------------------------------------------------------------------------


def _context_prompt(question: str, context: list[Hit]) -> str:
    blocks = [f"[chunk_id: {hit.chunk_id}] (from {Path(hit.document).name})\n{hit.text}" for hit in context]
    return "Context chunks:\n\n" + "\n\n---\n\n".join(blocks) + f"\n\nQuestion: {question}"


def validate_llm_reply(
    reply: str, context: list[Hit]
) -> tuple[_LlmAnswer, list[tuple[Hit, Match]], list[str]]:
    """The parsed reply, its citations located in their chunks, and what is wrong with it."""
    try:
        parsed = _LlmAnswer.model_validate_json(reply)
    except ValidationError as exc:
        return (
            _LlmAnswer(answer="", citations=[]),
            [],
            [f"the reply is not the requested JSON: {exc.errors()[0]['msg']}"],
        )
    by_id = {hit.chunk_id: hit for hit in context}
    located, problems = [], []
    for citation in parsed.citations:
        hit = by_id.get(citation.chunk_id)
        if hit is None:
            problems.append(f"chunk_id {citation.chunk_id!r} is not one of the context chunks")
            continue
        match = find_excerpt(citation.excerpt, hit.text)
        if match is None:
            problems.append(f"the excerpt {citation.excerpt[:80]!r} does not appear in chunk {hit.chunk_id}")
            continue
        located.append((hit, match))
    if parsed.answer.strip() and not parsed.citations:
        problems.append("the answer has no citations")
    return parsed, located, problems


def llm_answer(
    client: VisionClient,
    question: str,
    context: list[Hit],
    answer: AnswerConfig,
    wider_context: Callable[[], list[Hit]],
) -> tuple[str, list[tuple[Hit, Match]]] | None:
    """A validated LLM answer, or None when the model declines or every attempt was invalid."""
    kwargs = {**answer.llm_kwargs, "response_format": {"type": "json_schema", "json_schema": ANSWER_SCHEMA}}
    messages = [
        {"role": "system", "content": SYSTEM_PROMPT},
        {"role": "user", "content": _context_prompt(question, context)},
    ]
    for attempt in range(answer.max_attempts):
        try:
            reply = client.complete(answer.model, messages, kwargs)
        except VisionError:
            return None
        parsed, located, problems = validate_llm_reply(reply, context)
        if not answer.validate_answer:
            problems = [p for p in problems if "not the requested JSON" in p]
        if not problems:
            return (parsed.answer.strip(), located) if parsed.answer.strip() and located else None
        if attempt + 1 == answer.max_attempts or not answer.retry_strategies:
            break
        strategy = answer.retry_strategies[attempt % len(answer.retry_strategies)]
        if strategy == "next_prompt":
            messages = [
                *messages,
                {"role": "assistant", "content": reply},
                {
                    "role": "user",
                    "content": "Your reply was invalid: "
                    + "; ".join(problems)
                    + ". Answer again; copy each excerpt exactly from the chunk whose id you give.",
                },
            ]
        else:  # next_interpretation: the question reduced to its key terms, over a wider context
            context = wider_context()
            keywords = " ".join(sorted(question_terms(question)))
            messages = [
                {"role": "system", "content": SYSTEM_PROMPT},
                {"role": "user", "content": _context_prompt(f"{question} (key terms: {keywords})", context)},
            ]
    return None


def _plain(excerpt: str) -> str:
    """An excerpt as answer prose: one line, an inline image annotation reduced to its description."""
    return " ".join(ANNOTATION_RE.sub(lambda m: m["description"], excerpt).split())


# --- the entry point -------------------------------------------------------------------------------


def _citation(hit: Hit, match: Match) -> Citation:
    where = locate(hit, match)
    return Citation(
        chunk_id=hit.chunk_id,
        document=hit.document,
        excerpt=hit.text[match.start : match.end],
        page=where.page,
        bbox=where.bbox,
        char_span=where.char_span,
        image=where.image,
    )


def log_unresolved(question: str, reason: str, hits: list[Hit]) -> None:
    path = home() / UNRESOLVED_LOG
    path.parent.mkdir(parents=True, exist_ok=True)
    entry = {
        "time": datetime.now(UTC).isoformat(timespec="seconds"),
        "question": question,
        "reason": reason,
        "hits": [hit.chunk_id for hit in hits],
    }
    with path.open("a", encoding="utf-8") as handle:
        handle.write(json.dumps(entry, ensure_ascii=False) + "\n")


def ask(
    question: str,
    image: str | Path | bytes | None = None,
    k: int | None = None,
    config: RagConfig | None = None,
    client: VisionClient | None = None,
) -> Answer:
    """Answer `question` from the indexes with located, verbatim citations (see the module doc).

    `client` defaults to the endpoint configured in the environment; without one the answer is
    extractive.
    """
    if not question or not question.strip():
        raise ValueError("ask: the question is empty")
    config = config or config_in_effect().config
    settings = config.answer
    k = k or settings.k
    queries: list[tuple[str, float]] = [(question, 1.0)]
    if settings.decompose:
        queries += [(sub, 1.0) for sub in decompose(question, settings.max_subquestions)]
    picture = describe_query_image(image, config) if image is not None else None
    hits = search_queries(queries, k, image=picture, config=config, unit="chunk")  # answers cite chunks
    # the question and the sentences it is compared with as the indexed vectors were embedded
    config = config.model_copy(
        update={"embedding": indexed_embedding(vector_store(config.embedding.model), config.embedding)}
    )
    question_vector = encode([question], config.embedding.model, precision=config.embedding.precision)[0]
    context, _ = relevant_context(question_vector, hits, config)
    client = client or (
        vision_client_from_env(config.media_enrichment.provider) if settings.use_llm else None
    )

    located: list[tuple[Hit, Match]] = []
    method: Literal["llm", "extractive"] = "extractive"
    text = ""
    if client is not None and context:
        generated = llm_answer(
            client,
            question,
            context,
            settings,
            lambda: search_queries(queries, k * 2, image=picture, config=config, unit="chunk"),
        )
        if generated is not None:
            text, located = generated
            method = "llm"
    if not located:
        chosen = extractive_answer(question, question_vector, context, settings, config.embedding)
        located = [(hit, match) for hit, match, _ in chosen]
        text = " ".join(_plain(hit.text[m.start : m.end]) for hit, m in located)
    if not located:
        if settings.log_unresolved:
            reason = "no relevant chunk" if not context else "no sentence passed the answer threshold"
            log_unresolved(question, reason, hits)
        return Answer(question=question, answer=NO_ANSWER, answered=False, method=method, hits=hits)
    citations = list({c.chunk_id + c.excerpt: c for c in (_citation(h, m) for h, m in located)}.values())
    return Answer(
        question=question, answer=text, answered=True, method=method, citations=citations, hits=hits
    )
