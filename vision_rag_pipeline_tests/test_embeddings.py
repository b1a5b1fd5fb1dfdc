"""Chunk vectors: unit length, reproducible, the same at either precision, cached per precision, and
the vectors sentence-transformers computes for the same model."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from vision_rag_pipeline.embeddings.bert import BertSentenceEncoder, bert_layout
from vision_rag_pipeline.embeddings.cache import encode_cached
from vision_rag_pipeline.embeddings.encoder import (
    PRECISIONS,
    encode,
    load_encoder,
    model_directory,
    model_variant,
    resolve_precision,
    similar_length_batches,
)

MODEL = "all-MiniLM-L6-v2"
SENTENCES = [
    "Revenue rose 12% in the third quarter to $4.1 million.",
    "The board approved a dividend of 0.35 per share.",
    "Customer churn fell to 2.3 percent.",
    "| Region | Units |\n|---|---|\n| North | 1,204 |\n| South | 980 |",
    "![bar chart of quarterly revenue by segment](images/chart-3.png) Logistics grew fastest, "
    "warehousing was flat and retail declined for the second quarter in a row.",
    "ok",
]


@pytest.mark.parametrize("precision", PRECISIONS)
def test_vectors_are_unit_length_float32_rows(precision):
    vectors = encode(SENTENCES, MODEL, precision=precision)
    assert vectors.dtype == np.float32
    assert vectors.shape == (len(SENTENCES), 384)
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)


def test_no_texts_give_an_empty_matrix_of_the_model_dimension():
    assert encode([], MODEL).shape == (0, 384)


@pytest.mark.parametrize("precision", PRECISIONS)
def test_a_text_gets_the_same_vector_whatever_it_is_batched_with(precision):
    """The cache stores one vector per text, so a vector must not depend on its neighbours."""
    forward = encode(SENTENCES, MODEL, precision=precision)
    again = encode(SENTENCES, MODEL, precision=precision)
    alone = np.stack([encode([text], MODEL, precision=precision)[0] for text in SENTENCES])
    reversed_order = encode(SENTENCES[::-1], MODEL, precision=precision)[::-1]
    np.testing.assert_array_equal(forward, again)
    assert ((alone * forward).sum(axis=1) > 0.999).all()
    assert ((reversed_order * forward).sum(axis=1) > 0.999).all()


def test_bfloat16_vectors_agree_with_float32():
    cosine = (
        encode(SENTENCES, MODEL, precision="float32") * encode(SENTENCES, MODEL, precision="bfloat16")
    ).sum(axis=1)
    assert cosine.min() > 0.99


def test_int8_vectors_are_those_of_torch_dynamic_quantization_and_near_float32(sentence_transformers_models):
    """The int8 variant is MiniLM as `quantize_dynamic` (per-channel weights) makes it, which was
    measured on the dev set (BENCHMARKS.md); a text's vector stays near its float32 one."""
    quantized = sentence_transformers_models["int8"]
    expected = np.stack([quantized.encode([text], normalize_embeddings=True)[0] for text in SENTENCES])
    ours = encode(SENTENCES, MODEL, precision="int8")
    np.testing.assert_allclose(ours, expected, atol=2e-5)
    cosine = (ours * encode(SENTENCES, MODEL, precision="float32")).sum(axis=1)
    assert np.median(cosine) > 0.97 and cosine.min() > 0.9


def test_auto_is_int8_whatever_the_cpu(monkeypatch):
    from vision_rag_pipeline.embeddings import encoder

    for native in (True, False):
        monkeypatch.setattr(encoder, "_cpu_has_native_bfloat16", lambda native=native: native)
        assert resolve_precision("auto") == "int8"
        assert model_variant(MODEL, "auto") == f"{MODEL}@int8"


def test_related_sentences_are_closer_than_unrelated_ones():
    revenue, dividend, sales = encode(
        ["Quarterly revenue increased.", "A dividend was declared.", "Sales grew this quarter."], MODEL
    )
    assert revenue @ sales > revenue @ dividend


@given(st.lists(st.integers(min_value=1, max_value=256), max_size=40), st.integers(min_value=1, max_value=8))
def test_similar_length_batches_cover_every_text_once_with_little_padding(lengths, batch_size):
    batches = similar_length_batches(lengths, batch_size)
    assert sorted(i for batch in batches for i in batch) == list(range(len(lengths)))
    for batch in batches:
        longest = max(lengths[i] for i in batch)
        assert len(batch) <= batch_size
        assert min(lengths[i] for i in batch) >= 0.8 * longest


def test_precision_names_are_checked_and_auto_picks_a_real_one():
    assert resolve_precision("auto") in PRECISIONS
    assert resolve_precision("float32") == "float32"
    with pytest.raises(ValueError, match="float16"):
        resolve_precision("float16")


def test_a_model_loading_on_one_thread_is_waited_for_not_loaded_twice():
    """The one-file ingest loads the model on a thread while its first run reads the file; the run's
    own call must get that model, not build a second copy (memory, and seconds of torch import)."""
    from concurrent.futures import ThreadPoolExecutor

    from vision_rag_pipeline.embeddings import encoder

    encoder._load.cache_clear()
    with ThreadPoolExecutor(4) as threads:
        loaded = list(threads.map(lambda _: load_encoder(MODEL, "float32"), range(4)))
    assert all(model is loaded[0] for model in loaded)
    assert encoder._load.cache_info().misses == 1


def test_float32_keeps_the_bare_model_name_so_older_cache_rows_still_serve():
    assert model_variant(MODEL, "float32") == MODEL
    assert model_variant(MODEL, "bfloat16") != MODEL


def test_the_cache_never_hands_float32_vectors_to_a_bfloat16_run(pg_url):
    calls: list[list[str]] = []

    def fake_encode(texts: list[str]) -> np.ndarray:
        calls.append(texts)
        return np.ones((len(texts), 3), dtype=np.float32) / np.sqrt(3)

    texts = ["cached per precision", "cached per precision", "another chunk"]
    for precision in ("float32", "float32", "bfloat16"):
        vectors, _ = encode_cached(texts, "precision-test-model", fake_encode, pg_url, precision)
        assert vectors.shape == (3, 3)
    assert calls == [["cached per precision", "another chunk"]] * 2


@pytest.fixture(scope="module")
def sentence_transformers_models():
    """The bundled model as sentence-transformers itself runs it, at each precision."""
    from sentence_transformers import SentenceTransformer
    from torch.ao.quantization import per_channel_dynamic_qconfig, quantize_dynamic

    directory = str(model_directory(MODEL))
    float32 = SentenceTransformer(directory, device="cpu")
    return {
        "float32": float32,
        "bfloat16": SentenceTransformer(directory, device="cpu").to(torch.bfloat16),
        # what the int8 variant must equal: torch's dynamic quantization with per-channel weights
        "int8": quantize_dynamic(float32, {torch.nn.Linear: per_channel_dynamic_qconfig}, dtype=torch.qint8),
    }


@settings(max_examples=25, deadline=None)
@given(texts=st.lists(st.text(max_size=400), min_size=1, max_size=6), precision=st.sampled_from(PRECISIONS))
def test_the_bert_encoder_gives_exactly_the_vectors_of_sentence_transformers(
    sentence_transformers_models, texts, precision
):
    """Chunks embedded before (through sentence-transformers) and queries embedded now must meet."""
    expected = sentence_transformers_models[precision].encode(
        texts, batch_size=len(texts), convert_to_tensor=True
    )
    encoder = load_encoder(MODEL, precision)
    assert isinstance(encoder, BertSentenceEncoder)
    np.testing.assert_array_equal(encoder.encode(encoder.token_ids(texts)).float(), expected.float())


def _model_copy(tmp_path: Path, edit) -> Path:
    """The bundled model's directory with its JSON files edited by `edit(name, data)`."""
    copy = tmp_path / "model"
    shutil.copytree(model_directory(MODEL), copy)
    for path in copy.rglob("*.json"):
        name = str(path.relative_to(copy))
        data = json.loads(path.read_text(encoding="utf-8"))
        path.write_text(json.dumps(edit(name, data)), encoding="utf-8")
    return copy


@pytest.mark.parametrize(
    "edit",
    [
        lambda name, data: {**data, "model_type": "xlm-roberta"} if name == "config.json" else data,
        lambda name, data: (
            {**data, "pooling_mode_mean_tokens": False, "pooling_mode_max_tokens": True}
            if name == "1_Pooling/config.json"
            else data
        ),
        lambda name, data: (
            [*data, {"idx": 3, "name": "3", "path": "3_Dense", "type": "sentence_transformers.models.Dense"}]
            if name == "modules.json"
            else data
        ),
    ],
    ids=["not BERT", "max pooling", "a dense layer"],
)
def test_models_of_another_shape_are_left_to_sentence_transformers(tmp_path, edit):
    assert bert_layout(_model_copy(tmp_path, lambda name, data: data)) is not None
    assert bert_layout(_model_copy(tmp_path / "edited", edit)) is None


def test_a_model_of_another_shape_is_encoded_through_sentence_transformers(tmp_path):
    """Max pooling is not what bert.py computes: the same weights must give max-pooled vectors."""
    max_pooled = _model_copy(
        tmp_path,
        lambda name, data: (
            {**data, "pooling_mode_mean_tokens": False, "pooling_mode_max_tokens": True}
            if name == "1_Pooling/config.json"
            else data
        ),
    )
    vectors = encode(SENTENCES, str(max_pooled), precision="float32")
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)
    mean_pooled = encode(SENTENCES, MODEL, precision="float32")
    assert ((vectors * mean_pooled).sum(axis=1) < 0.99).all(), "max pooling, not the mean"
    assert not isinstance(load_encoder(str(max_pooled), "float32"), BertSentenceEncoder)


_GROWTH_SCRIPT = """
import psutil
from vision_rag_pipeline.embeddings.encoder import encode
encode(["ledger"], "all-MiniLM-L6-v2")
before = psutil.Process().memory_info().rss
for words in range(1, 81):  # 80 token lengths: 80 input shapes
    encode(["ledger " * words], "all-MiniLM-L6-v2")
print((psutil.Process().memory_info().rss - before) >> 20)
"""


def test_texts_of_ever_new_lengths_do_not_grow_the_process() -> None:
    """A worker embeds thousands of batches, each of its own size and length: with oneDNN's default
    caches (a kernel per shape, 1,024 kept) 80 lengths grew the process by ~150 MB; bounded, ~15."""
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("ONEDNN_PRIMITIVE_CACHE_CAPACITY", "LRU_CACHE_CAPACITY")
    }
    grown = subprocess.run(
        [sys.executable, "-c", _GROWTH_SCRIPT], env=env, capture_output=True, text=True, check=True
    ).stdout
    assert int(grown) < 60, f"{grown} MB"
