"""Chunk embedding speed and agreement per precision and batching, on the pipeline's real chunks.

    .venv/bin/python bench/bench_embeddings.py [--home DIR] [--docs 40]

Reads the `document_chunks` values a previous ingest stored in the index database of a
VISION_RAG_HOME (table asset_values; by default the home `bench/bench_ingest.py` writes), then encodes each document's chunks the way chunk_embeddings
does, one call per document on one torch thread, with every variant in turn (interleaved, so
load on the shared machine hits all alike). Variants, at each precision: sentence-transformers
itself with its fixed batches of 64, and the pipeline's encoder (`encoder.encode`: similar-length
batches, the model run by `embeddings/bert.py`) with batches of at most 64 and of the configured
default; sentence-transformers with similar-length batches
in bfloat16 (the same work through the library) and with dynamic int8 quantization of the Linear
layers, for comparison; the pipeline's int8 precision (per-channel weights, one text per call).
Prints one JSON
object: median ms per document, texts/s, padding share, and cosine to float32 vectors.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import pickle
import statistics
import time
import warnings
from pathlib import Path

import numpy as np

from vision_rag_pipeline.core.config import EMBEDDING_BATCH_SIZE
from vision_rag_pipeline.embeddings.encoder import (
    encode,
    load_encoder,
    model_directory,
    similar_length_batches,
)

MODEL = "all-MiniLM-L6-v2"
FIXED_BATCH = 64


def load_chunk_texts(home: Path, limit: int) -> list[list[str]]:
    os.environ["VISION_RAG_HOME"] = str(home)
    from vision_rag_pipeline.core.postgres import connect

    with connect() as conn:
        rows = conn.execute(
            "SELECT value FROM asset_values WHERE asset_key = 'document_chunks' ORDER BY partition_key LIMIT %s",
            (limit,),
        ).fetchall()
    if not rows:
        raise SystemExit(f"{home}: no document_chunks values; run bench/bench_ingest.py first")
    documents = [[chunk.text for chunk in pickle.loads(value)] for (value,) in rows]
    return [texts for texts in documents if texts]  # a document without text has nothing to embed


def padding_share(lengths: list[list[int]], batches_of) -> float:
    """Share of the tokens the model processes that are padding."""
    real = padded = 0
    for doc in lengths:
        for batch in batches_of(doc):
            real += sum(doc[i] for i in batch)
            padded += max(doc[i] for i in batch) * len(batch)
    return 1 - real / padded


def fixed_batches(lengths: list[int]) -> list[list[int]]:
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    return [order[i : i + FIXED_BATCH] for i in range(0, len(order), FIXED_BATCH)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--home", type=Path, default=Path("/tmp/bench_ingest/home"))
    parser.add_argument("--docs", type=int, default=40)
    args = parser.parse_args()

    import torch
    from sentence_transformers import SentenceTransformer

    torch.set_num_threads(1)
    docs = load_chunk_texts(args.home, args.docs)
    float_model = SentenceTransformer(str(model_directory(MODEL)), device="cpu")
    with warnings.catch_warnings():  # torch.ao.quantization is deprecated, still the offline option
        warnings.simplefilter("ignore")
        int8_model = torch.ao.quantization.quantize_dynamic(
            copy.deepcopy(float_model), {torch.nn.Linear}, dtype=torch.qint8
        )

    def token_counts(texts: list[str]) -> list[int]:
        return [len(ids) for ids in load_encoder(MODEL, "float32").token_ids(texts)]

    def similar_length_encode(model, texts: list[str]) -> np.ndarray:
        rows = np.zeros((len(texts), model.get_embedding_dimension()), dtype=np.float32)
        for batch in similar_length_batches(token_counts(texts), FIXED_BATCH):
            rows[batch] = model.encode(
                [texts[i] for i in batch],
                batch_size=len(batch),
                normalize_embeddings=True,
                show_progress_bar=False,
            )
        return rows

    def fixed(model):
        return lambda texts: model.encode(
            texts, batch_size=FIXED_BATCH, normalize_embeddings=True, show_progress_bar=False
        )

    bfloat16_model = copy.deepcopy(float_model).to(torch.bfloat16)
    variants = {
        "float32 fixed-64": fixed(float_model),
        "float32 similar-length, batches of 64": lambda texts: encode(texts, MODEL, FIXED_BATCH, "float32"),
        f"float32 similar-length, batches of {EMBEDDING_BATCH_SIZE} (pipeline)": lambda texts: encode(
            texts, MODEL, EMBEDDING_BATCH_SIZE, "float32"
        ),
        "bfloat16 fixed-64": fixed(bfloat16_model),
        "bfloat16 similar-length, batches of 64": lambda texts: encode(texts, MODEL, FIXED_BATCH, "bfloat16"),
        f"bfloat16 similar-length, batches of {EMBEDDING_BATCH_SIZE} (pipeline)": lambda texts: encode(
            texts, MODEL, EMBEDDING_BATCH_SIZE, "bfloat16"
        ),
        "bfloat16 similar-length, sentence-transformers": lambda texts: similar_length_encode(
            bfloat16_model, texts
        ),
        "int8 per tensor, similar-length, sentence-transformers": lambda texts: similar_length_encode(
            int8_model, texts
        ),
        "int8 per channel, one text per call (pipeline)": lambda texts: encode(
            texts, MODEL, EMBEDDING_BATCH_SIZE, "int8"
        ),
    }

    for run in variants.values():  # warm-up
        run(docs[0])
    seconds: dict[str, list[float]] = {name: [] for name in variants}
    vectors: dict[str, list[np.ndarray]] = {name: [] for name in variants}
    for texts in docs:
        for name, run in variants.items():
            start = time.perf_counter()
            vectors[name].append(np.asarray(run(texts), dtype=np.float32))
            seconds[name].append(time.perf_counter() - start)

    reference = np.concatenate(vectors["float32 fixed-64"])
    lengths = [token_counts(texts) for texts in docs]
    n_texts = sum(len(texts) for texts in docs)
    report = {
        "documents": len(docs),
        "texts": n_texts,
        "chunks_per_document_median": statistics.median(len(texts) for texts in docs),
        "tokens_median": statistics.median(n for doc in lengths for n in doc),
        "padding_share": {
            "fixed-64": round(padding_share(lengths, fixed_batches), 3),
            "similar-length": round(
                padding_share(lengths, lambda d: similar_length_batches(d, FIXED_BATCH)), 3
            ),
        },
        "load_average": [round(x, 2) for x in os.getloadavg()],
        "variants": {},
    }
    for name in variants:
        cosine = (np.concatenate(vectors[name]) * reference).sum(axis=1)
        report["variants"][name] = {
            "ms_per_document": round(statistics.median(seconds[name]) * 1000, 1),
            "texts_per_s": round(n_texts / sum(seconds[name]), 1),
            "cosine_to_float32_min": round(float(cosine.min()), 4),
            "cosine_to_float32_median": round(float(np.median(cosine)), 4),
        }
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
