"""The RAG config (one validated document) and every environment variable the package reads.

What this module holds: the pydantic `RagConfig` with every setting that shapes what the pipeline
produces, `config_in_effect` (the one config of this process: the file `VISION_RAG_CONFIG` names, else
`$VISION_RAG_HOME/config.yaml`, created on first use; read once, immutable), `load_config` (any
config file, JSON or YAML), and one reader per environment variable: where local state lives (`VISION_RAG_HOME`,
`DAGSTER_HOME`, `VISION_RAG_INBOX`), which servers hold the index (`VISION_RAG_PG_URL`,
`VISION_RAG_ES_*`), the vision endpoint (`OPENAI_*`, `AZURE_OPENAI_*`), how work is spread
(`VISION_RAG_THREADS`, `VISION_RAG_INGEST_WORKERS`, `VISION_RAG_EXECUTOR`, `VISION_RAG_MULTI_NODE`,
`VISION_RAG_CELERY_*`),
the sensor interval and reindex schedule read when the code location loads, and the API token.
Every other module asks here, so this file is the list of what a deployment can set.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import threading
import warnings
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any, Literal
from urllib.parse import urlsplit, urlunsplit

import yaml
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

CONFIG_ENV = "VISION_RAG_CONFIG"
PG_URL_ENV = "VISION_RAG_PG_URL"
ES_URL_ENV = "VISION_RAG_ES_URL"
INBOX_ENV = "VISION_RAG_INBOX"
EXECUTOR_ENV = "VISION_RAG_EXECUTOR"
INGEST_WORKERS_ENV = "VISION_RAG_INGEST_WORKERS"
MAX_BATCH_ENV = "VISION_RAG_MAX_BATCH"  # documents per run at most (batches of documents requested together)
# Set (to 1/true/yes) where more than one host runs the pipeline: a Kubernetes run launcher, several
# code servers. The deploy/ Helm values set it in every pod.
MULTI_NODE_ENV = "VISION_RAG_MULTI_NODE"
API_TOKEN_ENV = "VISION_RAG_API_TOKEN"
INBOX_SETTLE_ENV = "VISION_RAG_INBOX_SETTLE_SECONDS"


class _Strict(BaseModel):
    # Frozen: a process resolves its config once (`config_in_effect`) and every module reads that
    # one object; a variant is a copy (`model_copy(update=...)`), never an edit in place.
    model_config = ConfigDict(extra="forbid", frozen=True)


class LoaderConfig(_Strict):
    separate_docs_for_images: bool = False


class SplitterConfig(_Strict):
    chunk_size: int = Field(1000, gt=0)
    chunk_overlap: int = Field(100, ge=0)
    image_collection_in_metadata: bool = True

    @field_validator("chunk_overlap")
    @classmethod
    def _overlap_below_size(cls, v: int, info: Any) -> int:
        size = info.data.get("chunk_size", 1000)
        if v >= size:
            raise ValueError(f"chunk_overlap ({v}) must be smaller than chunk_size ({size})")
        return v


DEFAULT_VISION_PROMPT = (
    "Describe this image for a search index. Say what it shows (scene, objects, layout), "
    "transcribe every piece of text it contains exactly, and say what it means or is for. "
    "For a table, list every label with its value. For a chart, give its data one line per category "
    "as 'category: value' (several series: 'category: value (series) · value (series)'), reading each "
    "value off the category it stands over or beside and each series off the legend's colours."
)


class MllmFeature(_Strict):
    """Vision LLM; used only when an OpenAI-compatible endpoint is configured."""

    enabled: bool = True
    model: str = "gpt-4o"
    prompt: str = DEFAULT_VISION_PROMPT
    detail_mode: Literal["low", "high", "auto"] = "auto"
    llm_kwargs: dict[str, Any] = Field(default_factory=lambda: {"temperature": 0, "max_tokens": 800})


class ClassifierFeature(_Strict):
    enabled: bool = True
    threshold: float = Field(0.8, ge=0.0, le=1.0)


_EXPIRY = r"^([0-9]{1,5}):([0-9]{1,2}):([0-9]{1,2}):([0-9]{1,2})$"
# the placeholders a key may use (`{{` and `}}` write a brace), {hash} among them
_KEY_PART = r"(?:[^{}]|\{domain\}|\{config_version\}|\{hash\}|\{\{|\}\})"
_KEY_FORMAT = rf"^{_KEY_PART}*\{{hash\}}{_KEY_PART}*$"


class CacheFeature(_Strict):
    enabled: bool = True
    # the patterns say in the JSON Schema (the HTTP API's) what the validators accept
    expiry: str | None = Field("07:00:00:00", json_schema_extra={"pattern": _EXPIRY})
    key_format: str = Field("{domain}-{config_version}-{hash}", json_schema_extra={"pattern": _KEY_FORMAT})

    @field_validator("expiry")
    @classmethod
    def _expiry_format(cls, v: str | None) -> str | None:
        if v is not None:
            parse_expiry_seconds(v)
        return v

    @field_validator("key_format")
    @classmethod
    def _key_has_hash(cls, v: str) -> str:
        if "{hash}" not in v:
            raise ValueError("key_format must contain {hash}, or every image would share one cache entry")
        if not re.fullmatch(_KEY_FORMAT, v):
            raise ValueError(
                f"key_format {v!r}: only {{domain}}, {{config_version}} and {{hash}} are known ({{{{ and }}}} write a brace)"
            )
        return v


def parse_expiry_seconds(expiry: str) -> int:
    """`DD:HH:MM:SS` -> seconds (at most 99,999 days)."""
    match = re.fullmatch(_EXPIRY, expiry)
    if not match:
        raise ValueError(f"expiry must be DD:HH:MM:SS (days up to 99999), got {expiry!r}")
    days, hours, minutes, seconds = (int(p) for p in match.groups())
    return ((days * 24 + hours) * 60 + minutes) * 60 + seconds


class EnrichmentFeatures(_Strict):
    mllm: MllmFeature = Field(default_factory=MllmFeature)
    classifier: ClassifierFeature = Field(default_factory=ClassifierFeature)
    cache: CacheFeature = Field(default_factory=CacheFeature)


class OcrConfig(_Strict):
    """Tesseract settings. `languages`: `auto` (the default; an empty list means the same) reads English
    and every installed language of another script; a list (e.g. ["eng", "chi_sim", "rus"]) names
    the languages, and a host without one of them fails the enrichment step. Either way each image
    is read only in the languages of the scripts it holds (enrichment/languages.py)."""

    languages: list[str] | Literal["auto"] = "auto"
    max_workers: int | None = None

    @field_validator("languages")
    @classmethod
    def _empty_is_auto(cls, v: list[str] | str) -> list[str] | str:
        return v or "auto"


class FusionConfig(_Strict):
    """How OCR text and the VLM description become one Meta-Content chunk."""

    use_llm: bool = True
    model: str | None = None
    max_keywords: int = 12


class ProviderLimits(_Strict):
    """How long one run may wait on the vision/fusion endpoint before the offline path takes over.

    A hanging endpoint would otherwise cost `timeout_s` x `max_attempts` per image, and again for
    fusion. Each image gets `image_budget_s` in total (description + fusion, retries and backoff
    included); after `breaker_failures` failed calls in a row, or `document_budget_s` after its
    first call, the rest of the run (one document) goes offline without asking the endpoint again.
    Not part of any code version: the limits decide whether the endpoint answers, not what it says.
    """

    timeout_s: float = Field(60.0, gt=0)  # one HTTP attempt
    max_attempts: int = Field(4, gt=0)  # per call, retries included
    image_budget_s: float = Field(25.0, gt=0)
    document_budget_s: float = Field(300.0, gt=0)
    breaker_failures: int = Field(3, gt=0)


class MediaEnrichmentConfig(_Strict):
    features: EnrichmentFeatures = Field(default_factory=EnrichmentFeatures)
    ocr: OcrConfig = Field(default_factory=OcrConfig)
    fusion: FusionConfig = Field(default_factory=FusionConfig)
    provider: ProviderLimits = Field(default_factory=ProviderLimits)


# Texts per forward pass. Attention holds batch x heads x length^2 floats: 200 MB for 64 texts of
# 256 tokens, far outside any cache; 25 MB for 8. On the reference corpus' chunks 8 encodes in 0.96x
# the CPU time of 64 with half the peak memory (BENCHMARKS.md "Chunk embeddings").
EMBEDDING_BATCH_SIZE = 8


class EmbeddingConfig(_Strict):
    model: str = "all-MiniLM-L6-v2"
    batch_size: int = Field(EMBEDDING_BATCH_SIZE, gt=0)
    # `auto` is int8 (Linear weights quantized per channel): about half float32's CPU and less than
    # bfloat16's, with no lower retrieval quality; bfloat16 keeps float32's vectors (cosine 0.9999)
    # where the CPU computes it natively (embeddings/encoder.py).
    precision: Literal["auto", "float32", "bfloat16", "int8"] = "auto"


SearchMode = Literal["hybrid", "vector", "lexical"]
ResultUnit = Literal["chunk", "page"]
# Settings of the ranking before its fitted weights replaced them (query/ranker.py): a config that
# still sets them loads, with one warning naming them.
RETIRED_RETRIEVAL_SETTINGS = frozenset(
    {
        "fusion",
        "rrf_k",
        "vector_weight",
        "lexical_weight",
        "image_query_weight",
        "near_duplicate_bits",
        "near_duplicate_margin",
        "rerank_depth",
        "content_weight",
        "match_weight",
        "low_confidence_ocr_last",
        "page_weight",
        "page_units",
        "pages_opened",
        "pointer_weight",
        "named_weight",
        "period_weight",
        "other_period_factor",
        "pages_within_documents",
    }
)


class RetrievalConfig(_Strict):
    """What a search returns and how far it looks. How candidates are scored is not a setting: a
    ranker fitted on questions with known answers decides (query/ranker.py; `ranker` names a
    refitted weights file, `bench/fit_ranker.py --out FILE` writes one)."""

    k: int = Field(5, gt=0)  # hits per search
    mode: SearchMode = "hybrid"
    # a hit is a page of a paginated document, with its best passages ("page"), or a chunk ("chunk");
    # either way a picture is one hit however many chunks describe it, and a web archive, which has
    # no pages, gives chunks and pictures
    unit: ResultUnit = "page"
    candidates: int = Field(50, gt=0)  # passages each retriever proposes
    ef_search: int = Field(100, gt=0)  # HNSW search breadth (pgvector's hnsw.ef_search)
    ranker: str | None = None  # a weights file; None: the one shipped with the package

    @model_validator(mode="before")
    @classmethod
    def _retired(cls, data: Any) -> Any:
        if isinstance(data, dict) and (retired := sorted(RETIRED_RETRIEVAL_SETTINGS & data.keys())):
            warnings.warn(
                f"retrieval settings {', '.join(retired)} no longer apply (a fitted ranker scores"
                " candidates); remove them from the config",
                stacklevel=2,
            )
            data = {key: value for key, value in data.items() if key not in RETIRED_RETRIEVAL_SETTINGS}
        return data


class AnswerConfig(_Strict):
    """`ask`: retrieval for the context, the LLM (when an endpoint is configured) and its guards.

    Offline (no endpoint, or `use_llm: false`) the answer is extractive: the best-scoring
    sentences of the retrieved chunks, each cited.
    """

    k: int = Field(8, gt=0)  # chunks retrieved for the context
    use_llm: bool = True
    model: str = "gpt-4o-mini"
    llm_kwargs: dict[str, Any] = Field(default_factory=lambda: {"temperature": 0, "max_tokens": 800})
    max_attempts: int = Field(3, gt=0)  # structured-output attempts before giving up on the LLM
    retry_strategies: list[Literal["next_prompt", "next_interpretation"]] = Field(
        default_factory=lambda: ["next_prompt", "next_interpretation"]
    )
    validate_answer: bool = True  # every excerpt verbatim in its chunk, every chunk id in the context
    decompose: bool = False  # split "A and B?" questions into sub-questions, retrieve for each
    max_subquestions: int = Field(3, gt=0)
    relevance_filter: bool = True
    min_tokens: int = Field(3, ge=0)  # chunks with fewer words are dropped from the context
    min_similarity: float = Field(0.1, ge=-1.0, le=1.0)  # question-chunk cosine below this is dropped
    max_documents: int = Field(3, gt=0)  # context chunks come from at most this many documents
    context_token_budget: int = Field(3000, gt=0)  # approx. tokens (words x 1.3) of chunk text sent
    max_sentences: int = Field(2, gt=0)  # offline: sentences in the extractive answer
    min_sentence_score: float = Field(0.35, ge=0.0)  # offline: below this, "no answer"
    log_unresolved: bool = True  # questions without an answer go to $VISION_RAG_HOME/unresolved.jsonl


class DatabaseLimits(_Strict):
    """How long a call to the index database may take before it fails, so a hung or unreachable
    server costs a caller seconds (503 with Retry-After from the API, one line from the CLI) instead
    of hanging it. Each statement is bounded on the server (`statement_timeout`) and on the client
    (a server whose processes are stopped cancels nothing)."""

    connect_timeout_s: int = Field(3, ge=2)  # libpq counts whole seconds, 2 at least
    # each statement of an API request and of the CLI's queries (search, ask, status)
    request_timeout_s: float = Field(5.0, gt=0)
    # each statement of an ingest run, a reindex or a sensor; a rebuild's copy and index build are
    # bounded by nothing but the server (they take minutes on a large index)
    statement_timeout_s: float = Field(600.0, gt=0)


class DocumentLimits(_Strict):
    """What loading one document may cost. A file past a limit fails to load with a one-line error
    naming the setting, before the work it would cost: a 464 KB PDF of 2,000 blank pages took more
    than 400 s, a 1 MB PDF whose one stream inflates to 1 GB peaked at 2.5 GB, a 3,000-deep
    multipart MHTML exhausted the parser's stack."""

    max_pages: int = Field(1000, gt=0)  # pages of a PDF
    # bytes one PDF stream (content, image, font...) inflates to, or one image decodes to; one MHTML part
    max_stream_bytes: int = Field(128 * 2**20, gt=0)
    # bytes all of a document's streams (MHTML: parts) inflate to, together
    max_document_bytes: int = Field(4 * 2**30, gt=0)
    max_mhtml_depth: int = Field(32, gt=0)  # multipart bodies nested in each other


class ImageLimits(_Strict):
    """What decoding one image may cost. 16-bit and floating-point images are decoded at 8 bits, a
    strip at a time (their range stretched over 0-255): a 16-bit 6300 x 6300 PNG cost 1 GB decoded
    whole in 64-bit floats."""

    max_pixels: int = Field(40_000_000, gt=0)  # a 600 dpi A3 scan fits; a 50,000 x 50,000 "bomb" does not


class RequestLimits(_Strict):
    """What one media-enrichment request may cost, judged from its images' headers before any is
    decoded (413 past a limit): one 1.2 MB request of nine 16-bit 6300 x 6300 PNGs held 2.2 GB of
    the server for 110 s."""

    max_images: int = Field(10, ge=1, le=10)  # the operation takes ten at most
    max_pixels: int = Field(100_000_000, gt=0)  # all its images together
    # memory per request: what decoding and reading its images takes at most, all together, estimated
    # from their headers (enrichment/preprocess.py `image_memory`)
    max_memory_bytes: int = Field(2**30, gt=0)


class Limits(_Strict):
    """What one caller may cost: budgets on documents, images, requests and database calls. None is
    part of any code version: a limit decides whether something is processed, not what it gives."""

    documents: DocumentLimits = Field(default_factory=DocumentLimits)
    images: ImageLimits = Field(default_factory=ImageLimits)
    requests: RequestLimits = Field(default_factory=RequestLimits)
    database: DatabaseLimits = Field(default_factory=DatabaseLimits)


class RagConfig(_Strict):
    id: str = "default"
    domain: str = "default"
    config_version: str = "1"
    loader: LoaderConfig = Field(default_factory=LoaderConfig)
    splitter: SplitterConfig = Field(default_factory=SplitterConfig)
    media_enrichment: MediaEnrichmentConfig = Field(default_factory=MediaEnrichmentConfig)
    embedding: EmbeddingConfig = Field(default_factory=EmbeddingConfig)
    retrieval: RetrievalConfig = Field(default_factory=RetrievalConfig)
    answer: AnswerConfig = Field(default_factory=AnswerConfig)
    limits: Limits = Field(default_factory=Limits)

    def with_settings(self, settings: dict[str, Any]) -> RagConfig:
        """A validated copy with `settings` (nested like the file, e.g. `{"splitter": {"chunk_size": 500}}`)
        merged over these: the config is frozen, a variant is a new object."""
        return RagConfig.model_validate(_merged(self.model_dump(), settings))


def _merged(base: dict[str, Any], settings: dict[str, Any]) -> dict[str, Any]:
    merged = dict(base)
    for key, value in settings.items():
        nested = isinstance(value, dict) and isinstance(base.get(key), dict)
        merged[key] = _merged(base[key], value) if nested else value
    return merged


class ConfigError(ValueError):
    """The config file is missing or invalid; the message names the file."""


def load_config(path: str | os.PathLike[str]) -> RagConfig:
    """Read and validate one config file (JSON by its suffix, else YAML; an empty file is the defaults)."""
    p = Path(path)
    try:
        raw = p.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"{p}: cannot read config: {exc.strerror}") from exc
    try:
        data = json.loads(raw) if p.suffix.lower() == ".json" else yaml.safe_load(raw)
        return RagConfig.model_validate(data or {})
    except (ValueError, yaml.YAMLError) as exc:
        raise ConfigError(f"{p}: invalid config: {exc}") from exc


CONFIG_FILE_NAME = "config.yaml"
_DEFAULT_CONFIG_FILE = """\
# The RAG config of vision-rag. Every process (the CLI, `dagster dev`, the daemon and its code server,
# `vision-rag serve`, run workers) reads this file unless VISION_RAG_CONFIG names another, once, when
# it starts. A setting left out takes its default; `vision-rag config show` prints them all.
# After an edit the version sensor re-runs what the changed settings shape (README, "Living with it").
id: default
"""


def config_path() -> Path:
    """The config file of this deployment: the one `VISION_RAG_CONFIG` names, else
    `$VISION_RAG_HOME/config.yaml`, written (the defaults, one comment) on first use, so that every
    process started with the same home, whatever its environment, reads the same file."""
    named = os.environ.get(CONFIG_ENV)
    if named:
        return Path(named).expanduser().resolve()
    path = home() / CONFIG_FILE_NAME
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        # one name per thread: a process's threads reach here together on a fresh home (the CLI
        # starts Postgres and the model on threads), and a shared name was unlinked under the other
        partial = path.with_name(f".{CONFIG_FILE_NAME}.{os.getpid()}.{threading.get_ident()}")
        partial.write_text(_DEFAULT_CONFIG_FILE, encoding="utf-8")
        try:
            os.link(partial, path)  # never replaces a file another process (or the user) wrote first
        except FileExistsError:
            pass
        finally:
            partial.unlink()
    return path


def settings_sha256(config: RagConfig) -> str:
    """A hash of the validated settings: two files holding the same settings (comments, order and
    spelled-out defaults aside) have the same one."""
    canonical = json.dumps(config.model_dump(mode="json"), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()


@dataclass(frozen=True)
class ConfigInEffect:
    """The config a process works with, and the file it came from."""

    path: Path
    config: RagConfig
    sha256: str  # settings_sha256(config)

    def describe(self) -> str:
        return f"{self.path} (settings {self.sha256[:12]})"

    def file_now(self) -> ConfigInEffect:
        """The file as it reads now: another config when it was edited since this process read it."""
        return read_config_file(self.path)


def read_config_file(path: Path) -> ConfigInEffect:
    config = load_config(path)
    return ConfigInEffect(path, config, settings_sha256(config))


@cache
def config_in_effect() -> ConfigInEffect:
    """The config of this process, resolved once: code versions, host inputs, assets, sensors, the
    CLI and the API all read this object, so nothing in one process works with another config. An
    edited file takes effect in processes started after the edit (the daemon's code server is one:
    `dagster-daemon run` starts a new one every minute)."""
    return read_config_file(config_path())


def home() -> Path:
    """All local state (embedded Postgres, tantivy index, Dagster home, inbox)."""
    return Path(os.environ.get("VISION_RAG_HOME") or Path.home() / ".vision_rag").expanduser().resolve()


def dagster_home() -> Path:
    return Path(os.environ.get("DAGSTER_HOME") or home() / "dagster").expanduser().resolve()


def inbox_dir() -> Path:
    """The folder the inbox sensor watches: `VISION_RAG_INBOX`, else `$VISION_RAG_HOME/inbox`."""
    configured = os.environ.get(INBOX_ENV)
    return Path(configured).expanduser().resolve() if configured else home() / "inbox"


def postgres_url() -> str | None:
    """An external Postgres with pgvector (`VISION_RAG_PG_URL`), or None for the embedded server."""
    return os.environ.get(PG_URL_ENV) or None


def multi_node() -> bool:
    """Whether the deployment says more than one host runs (and writes from) the pipeline."""
    return os.environ.get(MULTI_NODE_ENV, "").strip().lower() in ("1", "true", "yes")


def cpu_threads() -> int:
    """Threads this process may keep busy (OCR, torch): its share of the cores when ingest runs
    several documents at once (`VISION_RAG_THREADS`), else every core."""
    return int(os.environ.get("VISION_RAG_THREADS") or os.cpu_count() or 1)


def ingest_workers() -> int | None:
    """Worker processes of `vision-rag ingest` (`VISION_RAG_INGEST_WORKERS`), or None: the default."""
    configured = os.environ.get(INGEST_WORKERS_ENV)
    return int(configured) if configured else None


def max_batch_documents(default: int) -> int:
    """Documents one run takes at most (`VISION_RAG_MAX_BATCH`), else `default`."""
    configured = os.environ.get(MAX_BATCH_ENV)
    return max(1, int(configured)) if configured else default


def executor_choice() -> str:
    """`VISION_RAG_EXECUTOR`: `k8s_job` for a pod per step, `celery` for steps on Celery workers, empty
    for Dagster's default executor."""
    return os.environ.get(EXECUTOR_ENV, "")


class SplitBrainError(ConfigError):
    """A multi-node deployment without the shared stores: each host would keep its own index."""


def require_shared_stores() -> None:
    """Refuse to start where `VISION_RAG_MULTI_NODE` is set and either shared store is not named.

    Called first by every process (CLI, API, code location load, Celery workers), before anything
    opens a store: without `VISION_RAG_PG_URL` a process would start its own embedded Postgres, and
    without `VISION_RAG_ES_URL` keep a tantivy index on its own disk; a step on another host would
    then miss the documents registered here ("document ... is not registered").
    """
    if not multi_node():
        return
    missing = [
        name for name, value in ((PG_URL_ENV, postgres_url()), (ES_URL_ENV, elasticsearch_url())) if not value
    ]
    if missing:
        raise SplitBrainError(
            f"{MULTI_NODE_ENV} is set but {' and '.join(missing)} {'is' if len(missing) == 1 else 'are'} not: "
            "every host must use the same Postgres and Elasticsearch; refusing to start"
        )


CELERY_BROKER_ENV = "VISION_RAG_CELERY_BROKER_URL"
CELERY_BACKEND_ENV = "VISION_RAG_CELERY_BACKEND_URL"
CELERY_VISIBILITY_ENV = "VISION_RAG_CELERY_VISIBILITY_TIMEOUT_SECONDS"


@dataclass(frozen=True, repr=False)
class CelerySettings:
    """Where the Celery executor sends steps and reads their results, the same for the launching
    run and every worker: `VISION_RAG_CELERY_BROKER_URL` (e.g. `redis://redis:6379/0`),
    `VISION_RAG_CELERY_BACKEND_URL` (default: the broker URL, which suits Redis) and
    `VISION_RAG_CELERY_VISIBILITY_TIMEOUT_SECONDS`: how long a step's message stays with a worker
    before the broker hands it to another, i.e. how soon a step of a worker that died is run again.
    It must exceed the longest step (Redis redelivers a step still running after it), so it
    defaults to Kombu's hour."""

    broker_url: str
    backend_url: str
    visibility_timeout_s: int = 3600

    @classmethod
    def from_env(cls) -> CelerySettings:
        broker = os.environ.get(CELERY_BROKER_ENV)
        if not broker:
            raise ConfigError(f"{EXECUTOR_ENV}=celery needs {CELERY_BROKER_ENV} (e.g. redis://redis:6379/0)")
        return cls(
            broker_url=broker,
            backend_url=os.environ.get(CELERY_BACKEND_ENV) or broker,
            visibility_timeout_s=int(os.environ.get(CELERY_VISIBILITY_ENV) or 3600),
        )

    def __repr__(self) -> str:
        return f"CelerySettings(broker={url_without_credentials(self.broker_url)!r})"


def url_without_credentials(url: str) -> str:
    """The URL without any user:password part (and query), fit for messages and logs."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    if parts.port:
        host = f"{host}:{parts.port}"
    return urlunsplit((parts.scheme, host, parts.path, "", ""))


SENSOR_INTERVAL_ENV = "VISION_RAG_SENSOR_INTERVAL_SECONDS"
SENSOR_RUNS_PER_TICK_ENV = "VISION_RAG_SENSOR_RUNS_PER_TICK"
REINDEX_CRON_ENV = "VISION_RAG_REINDEX_CRON"


def sensor_interval_seconds(default: int) -> int:
    """Seconds between a sensor's ticks: `VISION_RAG_SENSOR_INTERVAL_SECONDS` for every sensor (read
    when the code location loads), else the sensor's own default."""
    return int(os.environ.get(SENSOR_INTERVAL_ENV) or default)


def inbox_settle_seconds(default: float) -> float:
    """How long an inbox file must stay unchanged before it is ingested: `VISION_RAG_INBOX_SETTLE_SECONDS`,
    else `default` (the inbox sensor's interval: stable over one tick)."""
    return float(os.environ.get(INBOX_SETTLE_ENV) or default)


def sensor_runs_per_tick(default: int) -> int:
    """How many files the inbox sensor takes a tick at most (`VISION_RAG_SENSOR_RUNS_PER_TICK`, read when
    the code location loads): the files beyond it are taken by the following ticks, so no tick
    outlasts Dagster's 60 s however large the drop."""
    return int(os.environ.get(SENSOR_RUNS_PER_TICK_ENV) or default)


def reindex_cron() -> str:
    """When `daily_reindex` runs: `VISION_RAG_REINDEX_CRON` (read when the code location loads), else
    03:00 every night."""
    return os.environ.get(REINDEX_CRON_ENV) or "0 3 * * *"


MIN_API_TOKEN_CHARS = 16


def api_token() -> str | None:
    """The bearer token the HTTP API requires (`VISION_RAG_API_TOKEN`), or None: loopback use only.
    A token anyone could guess (shorter than 16 characters, a space) is refused, naming the variable."""
    token = os.environ.get(API_TOKEN_ENV)
    if not token:
        return None
    if len(token) < MIN_API_TOKEN_CHARS or not (token.isascii() and token.isprintable()) or " " in token:
        raise ConfigError(
            f"{API_TOKEN_ENV} must be at least {MIN_API_TOKEN_CHARS} printable ASCII characters without "
            f"spaces (it has {len(token)}); e.g. `openssl rand -hex 24`"
        )
    return token


@dataclass(frozen=True)
class VisionEndpoint:
    """The OpenAI-compatible endpoint for image descriptions, as the environment names it.

    Azure OpenAI: `AZURE_OPENAI_ENDPOINT` + `AZURE_OPENAI_API_KEY` (+ `OPENAI_API_VERSION`).
    Otherwise `OPENAI_API_KEY` and/or `OPENAI_BASE_URL` (Ollama and vLLM need only the base URL).
    """

    azure_endpoint: str | None
    azure_api_key: str | None
    api_version: str
    api_key: str | None
    base_url: str | None

    @classmethod
    def from_env(cls) -> VisionEndpoint:
        return cls(
            azure_endpoint=os.environ.get("AZURE_OPENAI_ENDPOINT") or None,
            azure_api_key=os.environ.get("AZURE_OPENAI_API_KEY") or None,
            api_version=os.environ.get("OPENAI_API_VERSION") or "2024-10-21",
            api_key=os.environ.get("OPENAI_API_KEY") or None,
            base_url=os.environ.get("OPENAI_BASE_URL") or None,
        )

    def __repr__(self) -> str:
        from vision_rag_pipeline.core.redact import redact_url  # a repr reaches logs: no password in it

        base_url = redact_url(self.base_url) if self.base_url else None
        return f"VisionEndpoint(azure_endpoint={self.azure_endpoint!r}, base_url={base_url!r})"


DEFAULT_ES_ALIAS = "vision-rag-chunks"


@dataclass(frozen=True, repr=False)
class ElasticsearchSettings:
    """Where the Elasticsearch lexical index lives and how to log in: `VISION_RAG_ES_URL`,
    `VISION_RAG_ES_API_KEY` or `VISION_RAG_ES_USERNAME`/`VISION_RAG_ES_PASSWORD`,
    `VISION_RAG_ES_CA_CERTS`, `VISION_RAG_ES_VERIFY_CERTS` and `VISION_RAG_ES_INDEX` (the alias).
    Secrets never reach a message: `safe_url` and the repr drop them."""

    url: str
    alias: str = DEFAULT_ES_ALIAS
    api_key: str | None = None
    username: str | None = None
    password: str | None = None
    ca_certs: str | None = None
    verify_certs: bool = True

    @classmethod
    def from_env(cls) -> ElasticsearchSettings:
        url = elasticsearch_url()
        if not url:
            raise ConfigError(f"{ES_URL_ENV} is not set")
        verify = os.environ.get("VISION_RAG_ES_VERIFY_CERTS", "true").strip().lower()
        return cls(
            url=url,
            alias=os.environ.get("VISION_RAG_ES_INDEX") or DEFAULT_ES_ALIAS,
            api_key=os.environ.get("VISION_RAG_ES_API_KEY") or None,
            username=os.environ.get("VISION_RAG_ES_USERNAME") or None,
            password=os.environ.get("VISION_RAG_ES_PASSWORD") or None,
            ca_certs=os.environ.get("VISION_RAG_ES_CA_CERTS") or None,
            verify_certs=verify not in {"0", "false", "no", "off"},
        )

    @property
    def safe_url(self) -> str:
        """The URL without any user:password part, fit for messages and logs."""
        return url_without_credentials(self.url)

    def __repr__(self) -> str:
        return f"ElasticsearchSettings(url={self.safe_url!r}, alias={self.alias!r})"


def elasticsearch_url() -> str | None:
    """`VISION_RAG_ES_URL`: set, the lexical index is Elasticsearch instead of tantivy."""
    return os.environ.get(ES_URL_ENV) or None
