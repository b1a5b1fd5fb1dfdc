"""The HTTP API of the reference architecture (`vision-rag serve`), documented at /docs and /openapi.json.

- `POST /upload`: files into the inbox the sensor watches (`VISION_RAG_INBOX`, default
  `$VISION_RAG_HOME/inbox`) and, so it works without the Dagster daemon, ingested in a background
  thread too (one at a time; ingestion is idempotent, so the sensor seeing the same file again only
  re-checks it); 204.
- `POST /search`, `POST /chat`: hybrid search and cited answers for a `rag_config` and a query.
- `POST /enrichment-services/media-enrichment`: the media-enrichment operation on up to 10 images.

A `rag_config` id names the active config (`VISION_RAG_CONFIG` or the defaults) or a file
`$VISION_RAG_HOME/configs/<id>.json|yaml`. Requests are validated by pydantic (422 with the
failing field; every string field is bounded, and NUL bytes or lone surrogates anywhere are
refused), unknown configs are 404, oversized bodies 413 (counted on the stream, so a chunked body
without Content-Length is cut off too), files that are neither MHTML nor PDF 415. Every error is
JSON with a `detail`, unexpected ones included (500).

With `VISION_RAG_API_TOKEN` set, every endpoint but the docs wants `Authorization: Bearer <token>`
(401 otherwise); `serve` refuses a non-loopback address without one.
"""

from __future__ import annotations

import hmac
import ipaddress
import json
import os
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Annotated, Any, Literal

from fastapi import FastAPI, File, Form, HTTPException, Request, UploadFile
from fastapi.encoders import jsonable_encoder
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, ConfigDict, Field, model_validator
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from vision_rag_pipeline.core.config import (
    API_TOKEN_ENV,
    ConfigError,
    RagConfig,
    api_token,
    home,
    inbox_dir,
    load_config,
    require_shared_stores,
)
from vision_rag_pipeline.core.sniff import ImagePayloadError, decode_image_payload, sniff_document_kind
from vision_rag_pipeline.enrichment.cache import EnrichmentCache
from vision_rag_pipeline.enrichment.preprocess import MAX_IMAGE_BYTES
from vision_rag_pipeline.media_enrichment import MAX_IMAGES_PER_REQUEST, media_enrichment
from vision_rag_pipeline.query.ask import Answer, ask
from vision_rag_pipeline.query.image_query import QueryImageError
from vision_rag_pipeline.query.search import Filters, Hit, SearchMode, search_queries

MAX_UPLOAD_FILE_BYTES = 100 * 1024 * 1024
MAX_UPLOAD_FILES = 20
MAX_ENRICHMENT_BODY_BYTES = 12 * MAX_IMAGE_BYTES  # ten base64 images of up to 20 MB each, plus slack
MAX_QUERY_BODY_BYTES = 2 * MAX_IMAGE_BYTES  # search and chat: one base64 image at most, plus slack
MAX_IMAGE_CHARS = (MAX_IMAGE_BYTES + 2) // 3 * 4 + 200  # base64 of the largest image, data: header
MAX_QUERY_CHARS = 2000
MAX_NAME_CHARS = 255
MAX_FILTER_ITEMS = 100
OPEN_PATHS = {"/docs", "/docs/oauth2-redirect", "/redoc", "/openapi.json"}  # readable without a token
ConfigId = Annotated[str, Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,99}$", description="RAG config id")]
ImageField = Annotated[str, Field(max_length=MAX_IMAGE_CHARS, description="base64 or a base64 data: URL")]
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


class SearchRequest(_Request):
    rag_config: ConfigId | None = None
    query: str | None = Field(None, min_length=1, max_length=MAX_QUERY_CHARS)
    image: ImageField | None = None
    k: int = Field(5, ge=1, le=100)
    mode: SearchMode = "hybrid"
    documents: list[Annotated[str, Field(max_length=4096)]] | None = Field(
        None, max_length=MAX_FILTER_ITEMS, description="document ids, source paths or file names"
    )
    kinds: list[Literal["text", "table", "image"]] | None = Field(None, max_length=3)
    metadata: dict[str, Any] | None = Field(
        None, max_length=MAX_FILTER_ITEMS, description="chunk metadata must contain this (JSON)"
    )


class SearchResponse(BaseModel):
    hits: list[Hit]


class ChatRequest(_Request):
    rag_config: ConfigId | None = None
    query: str = Field(min_length=1, max_length=MAX_QUERY_CHARS)
    image: ImageField | None = None
    k: int | None = Field(None, ge=1, le=50)


class EnrichmentImage(_Request):
    data: ImageField | None = None
    url: ImageField | None = None
    name: Name | None = None
    mime: Annotated[str, Field(max_length=100)] | None = None


class MediaEnrichmentRequest(_Request):
    rag_config: ConfigId | None = None
    domain: Name | None = None
    config_version: Name | None = None
    images: list[EnrichmentImage] = Field(min_length=1, max_length=MAX_IMAGES_PER_REQUEST)
    features: dict[str, Any] = Field(default_factory=dict, max_length=10)


class GeneratedResponse(BaseModel):
    content: str
    errors: list[str] = Field(default_factory=list)


class MediaEnrichmentResponse(BaseModel):
    classifier_result: dict[str, Any]
    generated_response: GeneratedResponse


def resolve_config(config_id: str | None) -> RagConfig:
    """The active config, or `$VISION_RAG_HOME/configs/<id>.{json,yaml,yml}`; 404 when unknown."""
    active = load_config()
    if config_id is None or config_id == active.id:
        return active
    for suffix in (".json", ".yaml", ".yml"):
        path = home() / "configs" / f"{config_id}{suffix}"
        if path.is_file():
            config = load_config(path)
            if config.id != config_id:
                raise HTTPException(422, f"{path.name} declares id {config.id!r}, not {config_id!r}")
            return config
    raise HTTPException(404, f"unknown rag_config {config_id!r} (active: {active.id!r})")


def _decode_image(value: str) -> bytes:
    try:
        return decode_image_payload(value, MAX_IMAGE_BYTES)[0]
    except ImagePayloadError as exc:
        raise HTTPException(413 if exc.too_large else 422, f"image: {exc}") from None


class _Ingestor:
    """Ingests uploaded files one run at a time, off the request thread."""

    def __init__(self) -> None:
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="upload-ingest")

    def submit(self, paths: list[str]) -> None:
        from vision_rag_pipeline.defs.runner import ingest_paths

        self._pool.submit(ingest_paths, paths)


def _save_upload(upload: UploadFile, inbox: Path) -> Path:
    """Stream one upload into the inbox: written aside, size-checked and sniffed, then renamed in."""
    name = Path(upload.filename or "").name
    problem = _text_problem(name)
    if not name or name.startswith(".") or problem:
        raise HTTPException(
            422, f"upload: invalid file name {upload.filename!r}" + (f" ({problem})" if problem else "")
        )
    if len(name.encode()) > MAX_NAME_CHARS:
        raise HTTPException(422, f"upload: file name over {MAX_NAME_CHARS} bytes: {name[:40]!r}...")
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
        os.replace(partial, target)
        return target
    finally:
        partial.unlink(missing_ok=True)


def create_app(ingest_on_upload: bool = True) -> FastAPI:
    require_shared_stores()  # a multi-node API without them would answer from this host's own index
    app = FastAPI(
        title="vision-rag",
        summary="Multimodal RAG over MHTML and PDF: upload, search, cited answers, media enrichment.",
        version="1",
    )
    ingestor = _Ingestor() if ingest_on_upload else None
    app.state.ingestor = ingestor
    app.add_middleware(_Guard, token=api_token())

    @app.exception_handler(RequestValidationError)
    async def invalid_request(request: Request, exc: RequestValidationError) -> JSONResponse:
        """FastAPI's 422 without the offending input: it may be a 27 MB image, or text (a lone
        surrogate) that cannot be encoded into the reply at all."""
        errors = [{k: e[k] for k in ("type", "loc", "msg") if k in e} for e in exc.errors()]
        return JSONResponse({"detail": jsonable_encoder(errors)}, 422)

    @app.exception_handler(Exception)
    async def internal_error(request: Request, exc: Exception) -> JSONResponse:
        return JSONResponse({"detail": f"internal error ({type(exc).__name__}); see the server log"}, 500)

    @app.exception_handler(QueryImageError)
    async def bad_image(request: Request, exc: QueryImageError) -> JSONResponse:
        return JSONResponse({"detail": str(exc)}, status_code=422)

    @app.exception_handler(ConfigError)
    async def bad_config(request: Request, exc: ConfigError) -> JSONResponse:
        return JSONResponse({"detail": str(exc)}, status_code=500)

    @app.post("/upload", status_code=204, response_class=Response, summary="Add documents to the index")
    def upload(
        files: Annotated[list[UploadFile], File(description="MHTML or PDF files")],
        rag_config: Annotated[str | None, Form(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,99}$")] = None,
    ) -> Response:
        resolve_config(rag_config)
        if len(files) > MAX_UPLOAD_FILES:
            raise HTTPException(413, f"{len(files)} files, at most {MAX_UPLOAD_FILES} per upload")
        inbox = inbox_dir()  # the folder the inbox sensor watches (VISION_RAG_INBOX moves both)
        inbox.mkdir(parents=True, exist_ok=True)
        saved = [_save_upload(upload, inbox) for upload in files]
        if ingestor is not None:
            ingestor.submit([str(path) for path in saved])
        return Response(status_code=204)

    @app.post("/search", response_model=SearchResponse, summary="Hybrid search by text and/or image")
    def search_endpoint(request: SearchRequest) -> SearchResponse:
        config = resolve_config(request.rag_config)
        queries: list[tuple[str, float]] = [(request.query, 1.0)] if request.query else []
        picture = None
        if request.image:
            from vision_rag_pipeline.query.image_query import describe_query_image

            picture = describe_query_image(_decode_image(request.image), config)
        if not queries and not picture:
            raise HTTPException(422, "give a query or an image")
        filters = Filters(documents=request.documents, kinds=request.kinds, metadata=request.metadata)
        try:
            hits = search_queries(
                queries, request.k, request.mode, image=picture, filters=filters, config=config
            )
        except ValueError as exc:
            raise HTTPException(422, str(exc)) from None
        return SearchResponse(hits=hits)

    @app.post("/chat", response_model=Answer, summary="Answer with verbatim, located citations")
    def chat(request: ChatRequest) -> Answer:
        config = resolve_config(request.rag_config)
        image = _decode_image(request.image) if request.image else None
        return ask(request.query, image=image, k=request.k, config=config)

    @app.post(
        "/enrichment-services/media-enrichment",
        response_model=MediaEnrichmentResponse,
        summary="Classify and describe up to 10 images",
    )
    def enrichment(request: MediaEnrichmentRequest) -> MediaEnrichmentResponse:
        config = resolve_config(request.rag_config)
        body = request.model_dump(exclude_none=True, exclude={"rag_config"})
        try:
            cache = EnrichmentCache() if config.media_enrichment.features.cache.enabled else None
            result = media_enrichment(body, config, cache)
        except ImagePayloadError as exc:
            raise HTTPException(413 if exc.too_large else 422, str(exc)) from None
        except ValueError as exc:
            raise HTTPException(422, str(exc)) from None
        return MediaEnrichmentResponse.model_validate(result)

    return app


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
    """Token check and body limit before any endpoint reads a byte (pure ASGI, so the limit counts
    the body as it streams in: a chunked body has no Content-Length to trust)."""

    def __init__(self, app: ASGIApp, token: str | None) -> None:
        self.app = app
        self.token = token

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
