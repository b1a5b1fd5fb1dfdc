"""The HTTP API of the reference architecture (`vision-rag serve`), documented at /docs and /openapi.json.

- `POST /upload`: files into the inbox the sensor watches (`VISION_RAG_INBOX`, default
  `$VISION_RAG_HOME/inbox`), registered (bytes in the index database, recorded as seen by the inbox,
  which so never ingests them again) and their runs requested before the answer (202 with each
  file's document id), through the one way in every door takes (defs/intake.py). A Dagster daemon
  serving the instance runs them; without one, this server does, as `vision-rag ingest` would
  (defs/runner.py), and takes over runs whose process is gone. A name the inbox would skip (hidden,
  or not .mhtml/.mht/.pdf) is refused with 415.
- `GET /documents/{document_id}`: what became of a file (requested, queued, running, ingested,
  duplicate, failed with its reason), whichever door it came through. `GET /health`: 200 when the
  index database answered the last probe (a thread asks every second), else 503 with the reason; it
  never waits on the database.
- `POST /search`, `POST /chat`: hybrid search and cited answers for a `rag_config` and a query.
- `POST /enrichment-services/media-enrichment`: the media-enrichment operation on up to 10 images.

A `rag_config` id names the config in effect (`VISION_RAG_CONFIG`, else `$VISION_RAG_HOME/config.yaml`)
or a file `$VISION_RAG_HOME/configs/<id>.json|yaml`. Requests are validated by pydantic (422 with the
failing field; every string field is bounded, and NUL bytes or lone surrogates anywhere are
refused; `detail` is always the list of problems FastAPI's schema says; an image that is not base64
is one), unknown configs are 404, oversized bodies and media-enrichment requests past
`limits.requests` 413 (bodies counted on the stream, so a chunked body without Content-Length is cut
off too), files that are neither MHTML nor PDF and base64 that is no image 415, image queries beyond `MAX_IMAGE_QUERIES` at once
that waited `IMAGE_QUERY_WAIT_SECONDS` in vain 429, and while the index database is down (it is
restarted when it is the embedded one) or hangs 503 with Retry-After: every statement of a request is
bounded by `limits.database.request_timeout_s`. Every error is JSON with a `detail`,
unexpected ones included (500).

With `VISION_RAG_API_TOKEN` set (16 characters or more), every endpoint but the docs wants
`Authorization: Bearer <token>` (401 otherwise); `serve` refuses a non-loopback address without one.
Without a token only requests addressed to this machine are answered: `Host` a loopback name and
`Origin`, if any, a loopback origin on the same port (403 otherwise), so a web page can neither post
to the API (CSRF) nor reach it through a name of its own that resolves to 127.0.0.1 (DNS rebinding).
"""

from __future__ import annotations

import hmac
import ipaddress
import json
import logging
import os
import threading
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager, suppress
from pathlib import Path
from typing import Annotated, Any, Literal
from urllib.parse import urlsplit

import psycopg
from fastapi import FastAPI, File, Form, HTTPException, Request, UploadFile
from fastapi import Path as PathParameter
from fastapi.encoders import jsonable_encoder
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field, create_model, model_validator
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from vision_rag_pipeline.core.config import (
    API_TOKEN_ENV,
    ConfigError,
    EnrichmentFeatures,
    RagConfig,
    api_token,
    config_in_effect,
    home,
    inbox_dir,
    load_config,
    require_shared_stores,
)
from vision_rag_pipeline.core.postgres import (
    DatabaseUnavailable,
    DiskFullError,
    connect,
    database_limits,
    statement_timeout,
)
from vision_rag_pipeline.core.printable import printable_name
from vision_rag_pipeline.core.sniff import ImagePayloadError, decode_image_payload, sniff_document_kind
from vision_rag_pipeline.documents.inbox import DOCUMENT_SUFFIXES
from vision_rag_pipeline.documents.registry import DocumentRegistry, Fate
from vision_rag_pipeline.enrichment.cache import EnrichmentCache
from vision_rag_pipeline.enrichment.preprocess import MAX_IMAGE_BYTES
from vision_rag_pipeline.indexes.lexical import LexicalIndexError
from vision_rag_pipeline.indexes.lexical_backend import open_lexical_index
from vision_rag_pipeline.media_enrichment import MAX_IMAGES_PER_REQUEST, media_enrichment
from vision_rag_pipeline.query.ask import Answer, ask
from vision_rag_pipeline.query.image_query import QueryImageError
from vision_rag_pipeline.query.search import Filters, Hit, ResultUnit, SearchMode, search_queries, warm_up

MAX_UPLOAD_FILE_BYTES = 100 * 1024 * 1024
MAX_UPLOAD_FILES = 20
MAX_ENRICHMENT_BODY_BYTES = 12 * MAX_IMAGE_BYTES  # ten base64 images of up to 20 MB each, plus slack
MAX_QUERY_BODY_BYTES = 2 * MAX_IMAGE_BYTES  # search and chat: one base64 image at most, plus slack
MAX_IMAGE_CHARS = (MAX_IMAGE_BYTES + 2) // 3 * 4 + 200  # base64 of the largest image, data: header
MAX_QUERY_CHARS = 2000
MAX_NAME_CHARS = 255
MAX_FILTER_ITEMS = 100
OPEN_PATHS = {"/docs", "/docs/oauth2-redirect", "/redoc", "/openapi.json"}  # readable without a token
MAX_IMAGE_QUERIES = 2  # image queries decoded and OCR'd at once (each may hold ~100 MB while it runs)
IMAGE_QUERY_WAIT_SECONDS = 10.0  # how long an image query waits for a turn before it gets 429
RETRY_AFTER_SECONDS = 5  # what a 503 (database down) or a 429 (image queries busy) asks clients to wait
RUNNER_POLL_SECONDS = 10.0  # how often the server looks for requested documents to run, without a daemon
HEALTH_PROBE_SECONDS = 1.0  # how often the health monitor asks the index database
HEALTH_PROBE_TIMEOUT_SECONDS = 2.0  # how long it waits for the answer before it reports the database down
# An upload's registration writes its bytes to the index database: its statements may take this
# long per byte beyond limits.database.request_timeout_s (100 MB took 5-8 s here).
REGISTER_SECONDS_PER_BYTE = 1 / (5 * 2**20)
logger = logging.getLogger("vision_rag_pipeline.api")
ConfigId = Annotated[str, Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,99}$", description="RAG config id")]
# What `sniff.decode_image_payload` decodes: padded standard base64, alone or as a data: URL. Said in
# the schema, so a string that is not base64 is refused by validation (422), and only bytes that are
# no image get 415.
BASE64 = r"(?:[A-Za-z0-9+/]{4})*(?:[A-Za-z0-9+/]{2}==|[A-Za-z0-9+/]{3}=)?"
DATA_URL = rf"data:[^,]*;base64,{BASE64}"
ImageField = Annotated[
    str,
    Field(
        min_length=1,
        max_length=MAX_IMAGE_CHARS,
        pattern=rf"^(?:{DATA_URL}|{BASE64})$",
        description="an image as base64, or as a base64 data: URL",
    ),
]
Name = Annotated[str, Field(max_length=MAX_NAME_CHARS)]


def _text_problem(data: object) -> str | None:
    """Where the request holds a NUL byte or a lone surrogate (neither survives Postgres, tantivy or
    a file name), else None. Iterative: a deeply nested JSON value must not exhaust the stack."""
    stack: list[tuple[str, object]] = [("body", data)]
    while stack:
        where, value = stack.pop()
        if isinstance(value, str):
            if "\x00" in value:
                return f"{where}: NUL byte in text"
            try:
                value.encode("utf-8")
            except UnicodeEncodeError:
                return f"{where}: lone surrogate in text (not valid Unicode)"
        elif isinstance(value, dict):
            for key, item in value.items():
                # the path names the key as printable ASCII: it ends up in the JSON reply
                inner = f"{where}.{str(key).encode('ascii', 'backslashreplace').decode()}"
                stack.extend(((inner, key), (inner, item)))
        elif isinstance(value, list):
            stack.extend((f"{where}[{i}]", item) for i, item in enumerate(value))
    return None


class _Request(BaseModel):
    model_config = ConfigDict(extra="forbid")

    @model_validator(mode="before")
    @classmethod
    def _valid_text(cls, data: object) -> object:
        problem = _text_problem(data)
        if problem:
            raise ValueError(problem)
        return data


def _one_of_given(*fields: str) -> dict[str, Any]:
    """JSON Schema for "at least one of these fields, as a string": what the endpoint checks too."""
    given = {"type": "string", "minLength": 1}
    return {"anyOf": [{"required": [name], "properties": {name: given}} for name in fields]}


class SearchRequest(_Request):
    model_config = ConfigDict(extra="forbid", json_schema_extra=_one_of_given("query", "image"))

    rag_config: ConfigId | None = None
    query: str | None = Field(None, min_length=1, max_length=MAX_QUERY_CHARS)
    image: ImageField | None = None
    k: int | None = Field(None, ge=1, le=100, description="hits to return; default: the config's retrieval.k")
    mode: SearchMode | None = Field(None, description="default: the config's retrieval.mode")
    unit: ResultUnit | None = Field(
        None, description="a hit is a chunk, or a page with its best passages; default: retrieval.unit"
    )
    documents: list[Annotated[str, Field(max_length=4096)]] | None = Field(
        None, max_length=MAX_FILTER_ITEMS, description="document ids, source paths or file names"
    )
    kinds: list[Literal["text", "table", "image"]] | None = Field(None, max_length=3)
    metadata: dict[str, Any] | None = Field(
        None, max_length=MAX_FILTER_ITEMS, description="chunk metadata must contain this (JSON)"
    )


class SearchResponse(BaseModel):
    hits: list[Hit]


class ErrorResponse(BaseModel):
    detail: str


class UploadedDocument(BaseModel):
    name: str  # the file name in the inbox (a second file of the same name gets a suffix)
    document_id: str  # GET /documents/{document_id} tells where its ingestion stands
    # "requested" (its run is asked for), "unchanged" (indexed with these bytes already) or "duplicate"
    # (the same bytes as another document, indexed once under it)
    status: str


class UploadResponse(BaseModel):
    documents: list[UploadedDocument]


class HealthResponse(BaseModel):
    status: Literal["ok"]
    database: Literal["up"]
    lexical_index: Literal["ok"]


class HealthProblem(ErrorResponse):
    """What /health answers with 503: the one-line reason (with the repair, where there is one), and
    which part fails: `down` when the index database does, `degraded` when only the lexical index
    does (vector search still answers)."""

    status: Literal["down", "degraded", "starting"]
    database: Literal["up", "down", "unknown"]
    lexical_index: Literal["ok", "damaged", "unknown"]


def _errors(*codes: int) -> dict[int | str, dict[str, Any]]:
    """OpenAPI entries for the error answers a route gives (each JSON `{"detail": "..."}`)."""
    said = {
        400: "malformed request body (e.g. a multipart body that cannot be parsed)",
        401: "missing or wrong API token (only when VISION_RAG_API_TOKEN is set)",
        403: "without VISION_RAG_API_TOKEN: a Host that is not a loopback name, or an Origin of another site",
        404: "unknown rag_config or document",
        413: "request body, file or image over its limit",
        415: "not an MHTML web archive or a PDF, a file name the inbox skips, or an image that does not decode",
        429: "too many image queries at once; retry after Retry-After seconds",
        503: "the index database is unavailable, or the lexical index damaged (`vision-rag reindex` repairs "
        "it); retry after Retry-After seconds",
        507: "disk full where the index database keeps its data",
    }
    return {code: {"model": ErrorResponse, "description": said[code]} for code in codes}


class ChatRequest(_Request):
    rag_config: ConfigId | None = None
    # a question needs a character that is not white space (Python's idea of it: \x1c-\x1f count)
    query: str = Field(min_length=1, max_length=MAX_QUERY_CHARS, pattern=r"[^\s\x1c-\x1f\x85]")
    image: ImageField | None = None
    k: int | None = Field(None, ge=1, le=50)


class EnrichmentImage(_Request):
    model_config = ConfigDict(extra="forbid", json_schema_extra=_one_of_given("data", "url"))

    data: ImageField | None = None
    url: Annotated[ImageField, Field(pattern=rf"^{DATA_URL}$")] | None = None
    name: Name | None = None
    mime: Annotated[str, Field(max_length=100)] | None = None


def _override_model(model: type[BaseModel]) -> type[BaseModel]:
    """`model` with every field optional and unset by default (unset: the config's value stays), its
    constraints and schema kept: a request's partial override of those settings, validated (and
    documented) as the config validates them."""
    fields: dict[str, Any] = {}
    for name, info in model.model_fields.items():
        annotation = info.annotation
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            annotation = _override_model(annotation)
        if info.metadata:  # ge, le, max_length...
            annotation = Annotated[(annotation, *info.metadata)]
        # null only where the setting takes it (expiry: none); the unset default is never validated
        fields[name] = (annotation, Field(None, json_schema_extra=info.json_schema_extra))

    def valid_as_settings(override: BaseModel) -> BaseModel:
        model.model_validate(override.model_dump(exclude_unset=True))  # the settings' own validators
        return override

    return create_model(
        f"{model.__name__}Override",
        __config__=ConfigDict(extra="forbid"),
        __validators__={"valid_as_settings": model_validator(mode="after")(valid_as_settings)},
        **fields,
    )


FeaturesOverride = _override_model(EnrichmentFeatures)


class MediaEnrichmentRequest(_Request):
    rag_config: ConfigId | None = None
    domain: Name | None = None
    config_version: Name | None = None
    images: list[EnrichmentImage] = Field(min_length=1, max_length=MAX_IMAGES_PER_REQUEST)
    features: FeaturesOverride = Field(  # type: ignore[valid-type]
        default_factory=FeaturesOverride, description="settings of media_enrichment.features to use instead"
    )


class GeneratedResponse(BaseModel):
    content: str
    errors: list[str] = Field(default_factory=list)


class MediaEnrichmentResponse(BaseModel):
    classifier_result: dict[str, Any]
    generated_response: GeneratedResponse


def resolve_config(config_id: str | None) -> RagConfig:
    """The active config, or `$VISION_RAG_HOME/configs/<id>.{json,yaml,yml}`; 404 when unknown."""
    active = config_in_effect().config
    if config_id is None or config_id == active.id:
        return active
    for suffix in (".json", ".yaml", ".yml"):
        path = home() / "configs" / f"{config_id}{suffix}"
        if path.is_file():
            config = load_config(path)
            if config.id != config_id:
                raise unprocessable(f"{path.name} declares id {config.id!r}, not {config_id!r}", "rag_config")
            return config
    raise HTTPException(404, f"unknown rag_config {config_id!r} (active: {active.id!r})")


def _decode_image(value: str) -> bytes:
    try:
        return decode_image_payload(value, MAX_IMAGE_BYTES)[0]
    except ImagePayloadError as exc:
        raise HTTPException(413 if exc.too_large else 415, f"image: {exc}") from None


def unprocessable(message: str, *loc: str | int) -> HTTPException:
    """A 422 whose `detail` has the shape FastAPI's own 422s have (and its OpenAPI schema says)."""
    return HTTPException(422, [{"type": "value_error", "loc": ["body", *loc], "msg": message}])


class _Runner:
    """Runs requested documents (uploads, and any other door's) in this server when no Dagster daemon
    serves the instance: the same claim, batches and outcome records as `vision-rag ingest`, on one
    thread, one run at a time. Each pass first takes over runs whose process is gone (a peer server
    killed mid-run), so their documents run again."""

    def __init__(self) -> None:
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._work, name="vision-rag-runner", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        self._thread.join(timeout=5)

    def wake(self) -> None:
        self._wake.set()

    def _work(self) -> None:
        from vision_rag_pipeline.defs.intake import daemon_serves
        from vision_rag_pipeline.defs.runner import dagster_instance, run_requested

        while not self._stop.is_set():
            try:
                instance = dagster_instance()
                if not daemon_serves(instance):
                    run_requested(instance, None, workers=1)
            except Exception as exc:  # the database is down: the requests are still there at the next pass
                logger.warning(
                    "cannot run requested documents now (%s); retrying in %.0f s", exc, RUNNER_POLL_SECONDS
                )
            self._wake.wait(RUNNER_POLL_SECONDS)
            self._wake.clear()


class _HealthMonitor:
    """Asks the index database and the lexical index every `HEALTH_PROBE_SECONDS`, on a thread of its
    own, how they are; `/health` answers from the last answers at once, so a hung database is
    reported instead of hanging the caller (a probe waits at most `HEALTH_PROBE_TIMEOUT_SECONDS` for
    the database). A probe that finds the embedded server dead starts it again, as a request would."""

    def __init__(self) -> None:
        self._stop = threading.Event()
        self._probed = threading.Event()
        self._report = HealthProblem(
            detail="starting: the first health probe has not finished",
            status="starting",
            database="unknown",
            lexical_index="unknown",
        )
        self._thread = threading.Thread(target=self._work, name="health-monitor", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    def report(self) -> HealthResponse | HealthProblem:
        """The last probe's findings. Before the first probe has finished it waits for it, as long
        as a probe may take."""
        self._probed.wait(database_limits().connect_timeout_s + HEALTH_PROBE_TIMEOUT_SECONDS + 1)
        return self._report

    def _work(self) -> None:
        while not self._stop.is_set():
            self._report = self._probe()
            self._probed.set()
            self._stop.wait(HEALTH_PROBE_SECONDS)

    @staticmethod
    @statement_timeout(HEALTH_PROBE_TIMEOUT_SECONDS)  # the lexical index's ledger asks the database too
    def _probe() -> HealthResponse | HealthProblem:
        try:
            with connect() as conn:
                conn.execute("SELECT 1")
        except Exception as exc:  # whatever it is, /health says it and the monitor goes on
            return HealthProblem(
                detail=_one_line_reason(exc), status="down", database="down", lexical_index="unknown"
            )
        try:
            open_lexical_index().count()
        except Exception as exc:  # a damaged or missing index, a search server that is down
            return HealthProblem(
                detail=_one_line_reason(exc), status="degraded", database="up", lexical_index="damaged"
            )
        return HealthResponse(status="ok", database="up", lexical_index="ok")


class _ImageQuerySlots:
    """At most `MAX_IMAGE_QUERIES` image queries decode and OCR at once; the next waits up to
    `IMAGE_QUERY_WAIT_SECONDS` for a turn, then gets 429 with Retry-After."""

    def __init__(
        self, slots: int = MAX_IMAGE_QUERIES, wait_seconds: float = IMAGE_QUERY_WAIT_SECONDS
    ) -> None:
        self._slots = threading.BoundedSemaphore(slots)
        self.wait_seconds = wait_seconds

    @contextmanager
    def turn(self) -> Iterator[None]:
        if not self._slots.acquire(timeout=self.wait_seconds):
            raise HTTPException(
                429,
                f"{MAX_IMAGE_QUERIES} image queries are running; retry in a few seconds",
                headers={"Retry-After": str(RETRY_AFTER_SECONDS)},
            )
        try:
            yield
        finally:
            self._slots.release()
            _give_back_memory()


def _give_back_memory() -> None:
    """Return the heap an image query freed to the system (glibc keeps freed arenas otherwise: four
    large queries left the server 2.4 GB above its baseline)."""
    import ctypes

    with suppress(OSError, AttributeError):  # not glibc: nothing to trim
        ctypes.CDLL("libc.so.6").malloc_trim(0)


def _inbox_name(upload: UploadFile) -> str:
    """The upload's file name reduced to printable characters (no line break, escape sequence or
    bidi mark reaches the inbox, the registry or a terminal), if the inbox would take it: 415 with
    the reason otherwise (the sensor would skip the file, so it would sit there, never indexed)."""
    given = Path(upload.filename or "").name
    problem = _text_problem(given)
    if problem:
        raise unprocessable(f"upload: invalid file name {upload.filename!r} ({problem})", "files")
    name = printable_name(given)
    if len(name.encode()) > MAX_NAME_CHARS:
        raise unprocessable(f"upload: file name over {MAX_NAME_CHARS} bytes: {name[:40]!r}...", "files")
    if not name.strip():
        raise HTTPException(
            415, f"upload: no file name ({upload.filename!r}); the inbox needs .mhtml, .mht or .pdf"
        )
    if name.startswith("."):
        raise HTTPException(415, f"{name}: hidden files (name starting with a dot) are skipped by the inbox")
    if not name.lower().encode().endswith(DOCUMENT_SUFFIXES):
        raise HTTPException(415, f"{name}: the inbox takes only .mhtml, .mht and .pdf files")
    return name


def _save_upload(upload: UploadFile, inbox: Path) -> tuple[Path, bool]:
    """Stream one upload into the inbox: written aside, size-checked and sniffed, then renamed in.
    Returns its path and whether this request created it (an identical file may be there already)."""
    name = _inbox_name(upload)
    partial = inbox / f".{uuid.uuid4().hex}.part"
    size = 0
    try:
        with partial.open("wb") as out:
            while chunk := upload.file.read(1 << 20):
                size += len(chunk)
                if size > MAX_UPLOAD_FILE_BYTES:
                    raise HTTPException(
                        413, f"{name}: over the {MAX_UPLOAD_FILE_BYTES // 2**20} MB per-file limit"
                    )
                out.write(chunk)
        if sniff_document_kind(partial) is None:
            raise HTTPException(415, f"{name}: not an MHTML web archive or a PDF")
        target = inbox / name
        if target.exists() and target.read_bytes() != partial.read_bytes():
            target = inbox / f"{target.stem}-{uuid.uuid4().hex[:8]}{target.suffix}"
        created = not target.exists()
        os.replace(partial, target)
        return target, created
    finally:
        partial.unlink(missing_ok=True)


def _warm_search() -> None:
    """One search before the first caller's (`query.search.warm_up`): without it the first search
    after a start loads the model and opens the indexes (BENCHMARKS.md, "A server's first search")."""
    started = time.monotonic()
    try:
        warm_up()
    except Exception as exc:  # a store that is down: /health reports it, and each search its own error
        logger.warning("search warm-up failed, the first search will load what it needs: %s", exc)
        return
    logger.info("search ready in %.1f s", time.monotonic() - started)


def create_app(ingest_on_upload: bool = True) -> FastAPI:
    require_shared_stores()  # a multi-node API without them would answer from this host's own index
    runner = _Runner() if ingest_on_upload else None
    image_slots = _ImageQuerySlots()
    monitor = _HealthMonitor()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        monitor.start()
        await run_in_threadpool(_warm_search)  # before the port opens: a caller finds it ready
        if runner is not None:
            runner.start()
        yield
        if runner is not None:
            runner.stop()
        monitor.stop()

    app = FastAPI(
        title="vision-rag",
        summary="Multimodal RAG over MHTML and PDF: upload, search, cited answers, media enrichment.",
        version="1",
        lifespan=lifespan,
    )
    app.state.runner = runner
    app.state.image_slots = image_slots
    app.state.health = monitor
    app.add_middleware(_Guard, token=api_token(), request_timeout_s=database_limits().request_timeout_s)

    @app.exception_handler(RequestValidationError)
    async def invalid_request(request: Request, exc: RequestValidationError) -> JSONResponse:
        """FastAPI's 422 without the offending input: it may be a 27 MB image, or text (a lone
        surrogate) that cannot be encoded into the reply at all."""
        errors = [{k: e[k] for k in ("type", "loc", "msg") if k in e} for e in exc.errors()]
        return JSONResponse({"detail": jsonable_encoder(errors)}, 422)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        detail = exc.detail
        if exc.status_code == 422 and isinstance(detail, str):  # the schema says a list of problems
            detail = [{"type": "value_error", "loc": ["body"], "msg": detail}]
        return JSONResponse({"detail": detail}, exc.status_code, headers=exc.headers)

    @app.exception_handler(Exception)
    async def internal_error(request: Request, exc: Exception) -> JSONResponse:
        return JSONResponse({"detail": f"internal error ({type(exc).__name__}); see the server log"}, 500)

    @app.exception_handler(psycopg.OperationalError)
    async def database_down(request: Request, exc: psycopg.OperationalError) -> JSONResponse:
        logger.warning("%s %s: %s", request.method, request.url.path, " ".join(str(exc).split())[:300])
        return _database_down_reply(exc)

    @app.exception_handler(LexicalIndexError)
    async def lexical_index_unavailable(request: Request, exc: LexicalIndexError) -> JSONResponse:
        """A damaged or missing index, a search server that is down: the server's fault, not the
        caller's (the message names the repair where there is one)."""
        logger.warning("%s %s: %s", request.method, request.url.path, _one_line_reason(exc))
        return JSONResponse(
            {"detail": _one_line_reason(exc)},
            status_code=503,
            headers={"Retry-After": str(RETRY_AFTER_SECONDS)},
        )

    @app.exception_handler(DiskFullError)
    async def disk_full(request: Request, exc: DiskFullError) -> JSONResponse:
        return JSONResponse({"detail": str(exc)}, status_code=507)

    @app.exception_handler(QueryImageError)
    async def bad_image(request: Request, exc: QueryImageError) -> JSONResponse:
        return JSONResponse({"detail": str(exc)}, status_code=415)

    @app.exception_handler(ConfigError)
    async def bad_config(request: Request, exc: ConfigError) -> JSONResponse:
        return JSONResponse({"detail": str(exc)}, status_code=500)

    @app.post(
        "/upload",
        status_code=202,
        response_model=UploadResponse,
        summary="Add documents to the index",
        responses=_errors(400, 401, 403, 404, 413, 415, 503, 507),
    )
    def upload(
        files: Annotated[
            list[UploadFile],
            File(
                description="MHTML or PDF files",
                min_length=1,
                max_length=MAX_UPLOAD_FILES,
            ),
        ],
        rag_config: Annotated[str | None, Form(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,99}$")] = None,
    ) -> UploadResponse:
        """Each file is in the inbox, its bytes registered in the index database and its run requested
        before the answer; on any error none of the files this request brought stays behind."""
        from vision_rag_pipeline.defs.definitions import defs
        from vision_rag_pipeline.defs.intake import request_files
        from vision_rag_pipeline.defs.runner import dagster_instance

        resolve_config(rag_config)
        inbox = inbox_dir()  # the folder the inbox sensor watches (VISION_RAG_INBOX moves both)
        inbox.mkdir(parents=True, exist_ok=True)
        saved: list[tuple[Path, bool]] = []
        try:
            for upload in files:
                saved.append(_save_upload(upload, inbox))
            largest = max(path.stat().st_size for path, _ in saved)
            with statement_timeout(database_limits().request_timeout_s + largest * REGISTER_SECONDS_PER_BYTE):
                arrivals = request_files(
                    dagster_instance(), [str(path) for path, _ in saved], "upload", defs.resolve_asset_graph()
                )
        except BaseException:
            for path, created in saved:
                if created:
                    path.unlink(missing_ok=True)
            raise
        if runner is not None:
            runner.wake()
        return UploadResponse(
            documents=[
                UploadedDocument(name=path.name, document_id=arrival.document_id, status=arrival.outcome)
                for (path, _), arrival in zip(saved, arrivals, strict=True)
            ]
        )

    @app.get(
        "/documents/{document_id}",
        response_model=Fate,
        summary="What became of a file: requested, queued, running, ingested, duplicate, or failed with why",
        responses=_errors(401, 403, 404, 503),
    )
    def document_status(document_id: Annotated[str, PathParameter(max_length=200)]) -> Fate:
        fates = [fate for fate in DocumentRegistry().fates([document_id]) if fate.document_id == document_id]
        if not fates:
            raise HTTPException(404, f"no document with id {document_id!r}")
        return fates[0]

    @app.get(
        "/health",
        response_model=HealthResponse,
        summary="Whether the server can answer: its index database, as last probed (about every second)",
        responses={
            **_errors(401, 403),
            503: {
                "model": HealthProblem,
                "description": "the index database is down or hangs, or the lexical index is damaged",
            },
        },
    )
    async def health() -> HealthResponse | JSONResponse:
        report = await run_in_threadpool(monitor.report)  # waits only for the first probe
        if isinstance(report, HealthResponse):
            return report
        return JSONResponse(report.model_dump(), 503, headers={"Retry-After": str(RETRY_AFTER_SECONDS)})

    @app.post(
        "/search",
        response_model=SearchResponse,
        summary="Hybrid search by text and/or image",
        responses=_errors(400, 401, 403, 404, 413, 415, 429, 503),
    )
    def search_endpoint(request: SearchRequest) -> SearchResponse:
        config = resolve_config(request.rag_config)
        # a query of white space only, like one of stop words or punctuation, matches nothing
        queries: list[tuple[str, float]] = (
            [(request.query, 1.0)] if request.query and request.query.strip() else []
        )
        picture = None
        if request.image:
            from vision_rag_pipeline.query.image_query import describe_query_image

            with image_slots.turn():
                picture = describe_query_image(_decode_image(request.image), config)
        if not queries and not picture:
            if request.query:
                return SearchResponse(hits=[])
            raise unprocessable("give a query or an image", "query")
        filters = Filters(documents=request.documents, kinds=request.kinds, metadata=request.metadata)
        try:
            hits = search_queries(
                queries,
                request.k,
                request.mode,
                image=picture,
                filters=filters,
                config=config,
                unit=request.unit,
            )
        except ValueError as exc:
            raise unprocessable(str(exc)) from None
        return SearchResponse(hits=hits)

    @app.post(
        "/chat",
        response_model=Answer,
        summary="Answer with verbatim, located citations",
        responses=_errors(400, 401, 403, 404, 413, 415, 429, 503),
    )
    def chat(request: ChatRequest) -> Answer:
        config = resolve_config(request.rag_config)
        try:
            if not request.image:
                return ask(request.query, k=request.k, config=config)
            with image_slots.turn():
                return ask(request.query, image=_decode_image(request.image), k=request.k, config=config)
        except QueryImageError:
            raise  # 415, by its handler
        except ValueError as exc:  # e.g. a question ask() finds empty
            raise unprocessable(str(exc), "query") from None

    @app.post(
        "/enrichment-services/media-enrichment",
        response_model=MediaEnrichmentResponse,
        summary="Classify and describe up to 10 images",
        responses=_errors(400, 401, 403, 404, 413, 415, 429, 503),
    )
    def enrichment(request: MediaEnrichmentRequest) -> MediaEnrichmentResponse:
        config = resolve_config(request.rag_config)
        body = request.model_dump(exclude_none=True, exclude={"rag_config", "features"})
        body["features"] = request.features.model_dump(exclude_unset=True)  # a null expiry is a setting
        try:
            cache = EnrichmentCache() if config.media_enrichment.features.cache.enabled else None
            with image_slots.turn():
                result = media_enrichment(body, config, cache)
        except ImagePayloadError as exc:
            raise HTTPException(413 if exc.too_large else 415, str(exc)) from None
        except ValueError as exc:
            raise unprocessable(str(exc), "images") from None
        return MediaEnrichmentResponse.model_validate(result)

    return app


def _one_line_reason(exc: BaseException) -> str:
    """The exception's first line, saying it is the index database where the message does not."""
    lines = str(exc).strip().splitlines()
    said = lines[0] if lines else type(exc).__name__
    if isinstance(exc, psycopg.OperationalError) and not isinstance(exc, DatabaseUnavailable):
        said = f"index database unavailable: {said}"
    return said


def _database_down_reply(exc: Exception) -> JSONResponse:
    return JSONResponse(
        {"detail": f"{_one_line_reason(exc)}; retry shortly"},
        status_code=503,
        headers={"Retry-After": str(RETRY_AFTER_SECONDS)},
    )


class BodyTooLarge(HTTPException):
    """Raised from `receive` when the body read so far passes the limit; FastAPI passes HTTPExceptions
    raised while it reads the body through unchanged, so the client gets this 413."""

    def __init__(self, limit: int) -> None:
        # close: the rest of the body is never read, so the connection cannot serve another request
        super().__init__(413, f"request body over the {limit:,} byte limit", headers={"Connection": "close"})


def body_limit(path: str) -> int:
    if path == "/upload":
        return MAX_UPLOAD_FILES * MAX_UPLOAD_FILE_BYTES
    if path == "/enrichment-services/media-enrichment":
        return MAX_ENRICHMENT_BODY_BYTES
    return MAX_QUERY_BODY_BYTES


class _Guard:
    """Token check, Host and Origin check and body limit before any endpoint reads a byte (pure
    ASGI, so the limit counts the body as it streams in: a chunked body has no Content-Length to
    trust); every database statement of the request is bounded by `request_timeout_s`."""

    def __init__(self, app: ASGIApp, token: str | None, request_timeout_s: float) -> None:
        self.app = app
        self.token = token
        self.request_timeout_s = request_timeout_s

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        if self.token and scope["path"] not in OPEN_PATHS and not self._authorized(headers):
            await _reply(
                send,
                401,
                "missing or wrong API token (Authorization: Bearer <token>)",
                [(b"www-authenticate", b"Bearer")],
            )
            return
        if not self.token and (refusal := foreign_request(headers.get("host", ""), headers.get("origin"))):
            await _reply(send, 403, refusal)
            return
        limit = body_limit(scope["path"])
        length = headers.get("content-length", "")
        if length and (not length.isdigit() or int(length) > limit):
            await _reply(send, 413, f"request body over the {limit:,} byte limit")
            return
        received = 0

        async def counted() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > limit:
                    raise BodyTooLarge(limit)
            return message

        with statement_timeout(self.request_timeout_s):  # copied into the endpoint's worker thread
            await self.app(scope, counted, send)

    def _authorized(self, headers: dict[str, str]) -> bool:
        scheme, _, given = headers.get("authorization", "").partition(" ")
        return scheme.lower() == "bearer" and hmac.compare_digest(given.strip().encode(), self.token.encode())


async def _reply(send: Send, status: int, detail: str, headers: list[tuple[bytes, bytes]] = ()) -> None:
    body = json.dumps({"detail": detail}).encode()
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
                (b"connection", b"close"),
                *headers,
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})


def foreign_request(host: str, origin: str | None) -> str | None:
    """Why a request to an API without a token is refused, or None when it may be answered.

    Without a token the API trusts whoever can reach it, which on a loopback address means this
    machine's users, but also any web page its browser shows: a page may send a cross-origin POST
    (CSRF), and a name the page's site resolves to 127.0.0.1 puts its own name in `Host` (DNS
    rebinding). So `Host` must be a loopback name and `Origin`, when a browser sends one, a
    loopback origin on the same port.
    """
    addressed = _host_and_port(host, "http")
    if addressed is None or not is_loopback(addressed[0]):
        return (
            f"Host {host!r} is not a loopback name: without {API_TOKEN_ENV} the API answers only "
            "requests addressed to this machine (localhost, 127.0.0.1, ::1)"
        )
    if origin is None:
        return None
    scheme = origin.partition("://")[0].lower()
    came_from = _host_and_port(origin.partition("://")[2], scheme) if scheme in ("http", "https") else None
    if came_from is None or not is_loopback(came_from[0]) or came_from[1] != addressed[1]:
        return (
            f"Origin {origin!r} is another site: without {API_TOKEN_ENV} the API answers web pages "
            "of its own origin only"
        )
    return None


def _host_and_port(netloc: str, scheme: str) -> tuple[str, int] | None:
    """(host name, port) of a `Host` header or an origin's authority, the scheme's default port when
    none is given; None when it does not parse."""
    try:
        parts = urlsplit(f"//{netloc}")
        return (parts.hostname or "", parts.port or (443 if scheme == "https" else 80))
    except ValueError:
        return None


class UnsafeBindError(RuntimeError):
    """`serve` was asked to listen beyond this machine without a token."""


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:  # a host name: it may resolve to anything
        return False


def serve(host: str = "127.0.0.1", port: int = 8000, ingest_on_upload: bool = True) -> None:
    """Run the API; on a non-loopback address only with `VISION_RAG_API_TOKEN` set."""
    import uvicorn

    if not is_loopback(host) and not api_token():
        raise UnsafeBindError(
            f"refusing to listen on {host}: anyone who can reach it could upload, ingest and read the index. "
            f"Set {API_TOKEN_ENV} to a secret token (clients send Authorization: Bearer <token>), "
            "or listen on 127.0.0.1."
        )

    uvicorn.run(create_app(ingest_on_upload), host=host, port=port)
