"""Versions of the settings that shape each derived asset, so a config change re-runs only what it touched.

Each version is a short hash of exactly the settings that change an asset's output, and of the
revision of the code that computes it: the Dagster `code_version` of the asset. When it differs from
the one a partition was last materialized with, that partition is stale from this asset on, and
nothing upstream of it needs to run again.
Settings that change only speed (OCR workers, batch sizes) or bookkeeping (cache expiry) are left out.

No setting changes how a file loads, so raw_documents' version is the loaders' revision alone (an
upgrade that loads files differently re-runs every document), and extracted_images, which only stores
what raw_documents loaded, has none of its own; lexical_index's is the lexical analysis' revision (a
new analysis writes each document's entries again, nothing upstream). `version_sensor`
(defs/version_sensor.py) compares them with the versions each partition recorded.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any, NamedTuple

import dagster as dg
from dagster import DagsterEventType

from vision_rag_pipeline.chunks.build import CHUNKING_REVISION
from vision_rag_pipeline.core.config import RagConfig, config_in_effect
from vision_rag_pipeline.defs.host_inputs import embedding_model_sha256
from vision_rag_pipeline.defs.version_index import CODE_VERSION_TAG
from vision_rag_pipeline.documents.loader import LOADER_REVISION
from vision_rag_pipeline.embeddings.encoder import precision_settings
from vision_rag_pipeline.enrichment.batch import enrichment_engine
from vision_rag_pipeline.enrichment.cache import enrichment_settings
from vision_rag_pipeline.enrichment.classifier import CLASSIFIER_REVISION
from vision_rag_pipeline.enrichment.vlm import vision_client_from_env
from vision_rag_pipeline.indexes.lexical import LEXICAL_ANALYSIS_REVISION

VERSION_LENGTH = 12


def _short_hash(settings: dict) -> str:
    canonical = json.dumps(settings, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(canonical.encode()).hexdigest()[:VERSION_LENGTH]


def loading_version() -> str:
    """What a file loads as: only the loaders' code, no setting."""
    return _short_hash({"revision": LOADER_REVISION})


def classifier_version(config: RagConfig) -> str:
    """What decides IGNORE vs VISION: the classifier switch and threshold, and the classifier's revision."""
    return _short_hash(
        {
            "classifier": config.media_enrichment.features.classifier.model_dump(mode="json"),
            "revision": CLASSIFIER_REVISION,
        }
    )


def enrichment_version(config: RagConfig, engine: str) -> str:
    """What an image's Meta-Content depends on when `engine` computes it (`enrichment_settings`: no
    vision-model setting offline), plus `config_version`, the user's explicit "re-enrich everything"
    switch (it is also in the cache key). Switching from OCR-only to a real vision model re-enriches
    even when no setting changed.
    """
    return _short_hash({**enrichment_settings(config, engine), "config_version": config.config_version})


def chunking_version(config: RagConfig) -> str:
    """How a document becomes chunks: loader and splitter settings, and the chunk builder's revision."""
    return _short_hash(
        {
            "loader": config.loader.model_dump(mode="json"),
            "splitter": config.splitter.model_dump(mode="json"),
            "revision": CHUNKING_REVISION,
        }
    )


def embedding_version(config: RagConfig) -> str:
    """Which model files embed the chunks and at which precision (the batch size does not change a vector).

    The files by their content hash, never by the name or path that finds them: hosts that keep
    the same model under different paths agree, and a model replaced under the same name re-embeds.

    The precision as configured, never as resolved on this host: every node of a deployment must
    agree on what is stale, or mixed nodes would re-run each other's partitions forever. `auto` is
    one version everywhere, with what it stands for (`precision_settings`: int8, and the int8
    scheme); each materialization's `model` metadata names the variant it used. A change of what
    `auto` stands for, or of the int8 scheme, re-embeds once (through the embedding cache, keyed by
    variant); so does changing between any two configured values.
    """
    embedding = config.embedding
    return _short_hash(
        {"model_files": embedding_model_sha256(embedding.model), **precision_settings(embedding.precision)}
    )


def lexical_version() -> str:
    """How the lexical index analyses a chunk's text: only its code, no setting."""
    return _short_hash({"revision": LEXICAL_ANALYSIS_REVISION})


def code_versions(config: RagConfig | None = None) -> dict[str, str]:
    """Each derived asset's version: a hash of the settings that shape it (default: the config in effect)."""
    config = config or config_in_effect().config
    engine = enrichment_engine(config, vision_client_from_env())
    return {
        "raw_documents": loading_version(),
        "image_verdicts": classifier_version(config),
        "image_enrichments": enrichment_version(config, engine),
        "document_chunks": chunking_version(config),
        "chunk_embeddings": embedding_version(config),
        "lexical_index": lexical_version(),
    }


_FETCH_BATCH = 500


class Recorded(NamedTuple):
    storage_id: int  # of the latest materialization: changes with every new one
    version: str | None  # its code version; None when it was made before versioning
    sha256: str | None = None  # raw_documents: the sha256 of the bytes it read (its metadata)


def recorded_versions(
    instance: dg.DagsterInstance, asset_key: dg.AssetKey, partitions: set[str] | None = None
) -> dict[str, Recorded]:
    """{partition (of `partitions`, default all): what its latest materialization of `asset_key` recorded}."""
    latest = instance.event_log_storage.get_latest_storage_id_by_partition(
        asset_key, DagsterEventType.ASSET_MATERIALIZATION, partitions
    )
    storage_ids = sorted(latest.values())
    seen: dict[int, tuple[str | None, str | None]] = {}  # storage id -> (code version, sha256)
    for start in range(0, len(storage_ids), _FETCH_BATCH):
        batch = storage_ids[start : start + _FETCH_BATCH]
        records = instance.fetch_materializations(
            dg.AssetRecordsFilter(asset_key=asset_key, storage_ids=batch), limit=len(batch)
        ).records
        for record in records:
            event = record.asset_materialization
            sha256 = event.metadata.get("sha256")
            seen[record.storage_id] = (
                (event.tags or {}).get(CODE_VERSION_TAG),
                sha256.value if isinstance(sha256, dg.TextMetadataValue) else None,
            )
    return {
        partition: Recorded(storage_id, *seen.get(storage_id, (None, None)))
        for partition, storage_id in latest.items()
    }


def up_to_date_partitions(
    instance: dg.DagsterInstance,
    assets: Any,  # Dagster's asset graph: Definitions.resolve_asset_graph(), a sensor's repository_def's
    selection: dg.AssetSelection,
    file_sha256: dict[str, str],
) -> set[str]:
    """The partitions (given with their file's sha256 now) that materializing `selection` would not change.

    Dagster's own notion of fresh: each asset was materialized after each of its parents, with the
    code version in effect now, and the first asset read the file's sha256 (its metadata). A run that
    failed or was killed half-way leaves an asset older than its parent, so that partition runs again.
    """
    keys = selection.resolve(assets)
    current = {dg.AssetKey(name): version for name, version in code_versions().items()}
    parents = {key: assets.get(key).parent_keys & keys for key in keys}
    recorded = {key: recorded_versions(instance, key, set(file_sha256)) for key in keys}

    def fresh(partition: str, sha256: str) -> bool:
        latest = {key: recorded[key].get(partition) for key in keys}
        return all(
            (record := latest[key]) is not None
            and (key not in current or record.version == current[key])
            and (parents[key] or record.sha256 == sha256)
            and all(
                (up := latest[parent]) is not None and up.storage_id < record.storage_id
                for parent in parents[key]
            )
            for key in keys
        )

    return {partition for partition, sha256 in file_sha256.items() if fresh(partition, sha256)}
