"""The HTTP API of the reference architecture (`vision-rag serve`), documented at /docs and /openapi.json.

- `POST /upload`: files into the inbox the sensor watches (`VISION_RAG_INBOX`, default
  `$VISION_RAG_HOME/inbox`) and, so it works without the Dagster daemon, ingested in a background
  thread too (one at a time; ingestion is idempotent, so the sensor seeing the same file again only
  re-checks it); 204.
- `POST /search`, `POST /chat`: hybrid search and cited answers for a `rag_config` and a query.
- `POST /enrichment-services/media-enrichment`: the media-enrichment operation on up to 10 images.

A `rag_config` id names the active config (`VISION_RAG_CONFIG` or the defaults) or a file
`$VISION_RAG_HOME/configs/<id>.json|yaml`. Requests are validated by pydantic (422 with the
failing field), unknown configs are 404, oversized bodies 413, files that are neither MHTML nor
PDF 415.
"""

from __future__ import annotations

import base64
import binascii
import os
import threading
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Annotated, Any, Literal

from fastapi import FastAPI, File, Form, HTTPException, Request, UploadFile
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, ConfigDict, Field

from vision_rag_pipeline.core.config import ConfigError, RagConfig, home, load_config
from vision_rag_pipeline.core.sniff import sniff_document_kind
from vision_rag_pipeline.documents.inbox import inbox_dir
from vision_rag_pipeline.enrichment.cache import EnrichmentCache
from vision_rag_pipeline.enrichment.preprocess import MAX_IMAGE_BYTES
from vision_rag_pipeline.media_enrichment import MAX_IMAGES_PER_REQUEST, media_enrichment
from vision_rag_pipeline.query.ask import Answer, ask
from vision_rag_pipeline.query.image_query import QueryImageError
from vision_rag_pipeline.query.search import Filters, Hit, SearchMode, search_queries

MAX_UPLOAD_FILE_BYTES = 100 * 1024 * 1024
MAX_UPLOAD_FILES = 20
MAX_JSON_BODY_BYTES = 12 * MAX_IMAGE_BYTES  # ten base64 images of up to 20 MB each, plus slack
MAX_QUERY_CHARS = 2000
ConfigId = Annotated[str, Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,99}$", description="RAG config id")]


class _Request(BaseModel):
    model_config = ConfigDict(extra="forbid")


class SearchRequest(_Request):
    rag_config: ConfigId | None = None
    query: str | None = Field(None, min_length=1, max_length=MAX_QUERY_CHARS)
    image: str | None = Field(None, description="query image: base64 or a base64 data: URL")
    k: int = Field(5, ge=1, le=100)
    mode: SearchMode = "hybrid"
    documents: list[str] | None = Field(None, description="document ids, source paths or file names")
    kinds: list[Literal["text", "table", "image"]] | None = None
    metadata: dict[str, Any] | None = Field(None, description="chunk metadata must contain this (JSON)")


class SearchResponse(BaseModel):
    hits: list[Hit]


class ChatRequest(_Request):
    rag_config: ConfigId | None = None
    query: str = Field(min_length=1, max_length=MAX_QUERY_CHARS)
    image: str | None = Field(None, description="optional image: base64 or a base64 data: URL")
    k: int | None = Field(None, ge=1, le=50)


class EnrichmentImage(_Request):
    data: str | None = Field(None, description="base64 image bytes")
    url: str | None = Field(None, description="base64 data: URL")
    name: str | None = None
    mime: str | None = None


class MediaEnrichmentRequest(_Request):
    rag_config: ConfigId | None = None
    domain: str | None = None
    config_version: str | None = None
    images: list[EnrichmentImage] = Field(min_length=1, max_length=MAX_IMAGES_PER_REQUEST)
    features: dict[str, Any] = Field(default_factory=dict)


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
    header, sep, payload = value.partition(",")
    if value.startswith("data:"):
        if not (sep and header.endswith(";base64")):
            raise HTTPException(422, "image: a data: URL must be base64 encoded")
        value = payload
    try:
        data = base64.b64decode(value, validate=True)
    except binascii.Error as exc:
        raise HTTPException(422, f"image: invalid base64: {exc}") from None
    if len(data) > MAX_IMAGE_BYTES:
        raise HTTPException(413, f"image: {len(data):,} bytes is over the 20 MB limit")
    return data


class _Ingestor:
    """Ingests uploaded files one run at a time, off the request thread."""

    def __init__(self) -> None:
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="upload-ingest")
        self._lock = threading.Lock()
        self.pending = 0

    def submit(self, paths: list[str]) -> None:
        from vision_rag_pipeline.defs.runner import ingest_paths

        with self._lock:
            self.pending += 1

        def run() -> None:
            try:
                ingest_paths(paths)
            finally:
                with self._lock:
                    self.pending -= 1

        self._pool.submit(run)


def _save_upload(upload: UploadFile, inbox: Path) -> Path:
    """Stream one upload into the inbox: written aside, size-checked and sniffed, then renamed in."""
    name = Path(upload.filename or "").name
    if not name or name.startswith("."):
        raise HTTPException(422, f"upload: invalid file name {upload.filename!r}")
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
    app = FastAPI(
        title="vision-rag",
        summary="Multimodal RAG over MHTML and PDF: upload, search, cited answers, media enrichment.",
        version="1",
    )
    ingestor = _Ingestor() if ingest_on_upload else None
    app.state.ingestor = ingestor

    @app.middleware("http")
    async def limit_body_size(request: Request, call_next):  # noqa: ANN202 - starlette middleware
        limit = (
            MAX_UPLOAD_FILES * MAX_UPLOAD_FILE_BYTES if request.url.path == "/upload" else MAX_JSON_BODY_BYTES
        )
        length = request.headers.get("content-length")
        if length and length.isdigit() and int(length) > limit:
            return JSONResponse({"detail": f"request body over the {limit:,} byte limit"}, status_code=413)
        return await call_next(request)

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
        if request.image:
            from vision_rag_pipeline.query.image_query import describe_query_image

            description = describe_query_image(_decode_image(request.image), config)
            queries.append((description, config.retrieval.image_query_weight))
        if not queries:
            raise HTTPException(422, "give a query or an image")
        filters = Filters(documents=request.documents, kinds=request.kinds, metadata=request.metadata)
        try:
            hits = search_queries(queries, request.k, request.mode, filters=filters, config=config)
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
        except ValueError as exc:
            raise HTTPException(422, str(exc)) from None
        return MediaEnrichmentResponse.model_validate(result)

    return app


def serve(host: str = "127.0.0.1", port: int = 8000, ingest_on_upload: bool = True) -> None:
    import uvicorn

    uvicorn.run(create_app(ingest_on_upload), host=host, port=port)
