"""Inputs a step reads from its own host that change what it produces, and the check that the host
executing a step has the ones of the host that launched its run.

On one machine these can never differ; across hosts they can: the embedding model's files (a path
or a package of another version on one node), and the OCR languages installed. A host whose inputs
differ would write different output and record a different code version, which the version sensor
on the launching host would take for stale and re-run, possibly on that host again, forever. So:

- `host_inputs()` fingerprints each input by content (the model files' sha256, never their path;
  the OCR languages OCR may read with and their traineddata's sha256, checked by image_enrichments).
- The asset jobs carry the launching process' map in the run tag `vision_rag/host_inputs` (job run
  tags reach every run of them: UI launches, sensors, backfills, the CLI, `ingest --submit`).
- A step that depends on an input calls `require_launching_host_inputs`, which fails it, naming
  the input, this host and both fingerprints, when this host's value differs from the tag's. The
  run fails instead of writing; its materialization (and so the sensor's run key) is unchanged.
Runs without the tag (Dagster's ad-hoc asset job, runs made before it existed) are not checked;
each materialization still records its fingerprint in metadata.
"""

from __future__ import annotations

import json
import socket
from functools import cache

import dagster as dg

from vision_rag_pipeline.core.config import RagConfig, config_in_effect
from vision_rag_pipeline.core.content_hash import directory_sha256
from vision_rag_pipeline.embeddings.encoder import model_directory
from vision_rag_pipeline.enrichment.languages import language_fingerprint

HOST_INPUTS_TAG = "vision_rag/host_inputs"
EMBEDDING_MODEL = "embedding_model"
OCR_LANGUAGES = "ocr_languages"


class HostInputMismatch(RuntimeError):
    """This host's copy of an input differs from the launching host's."""


@cache
def embedding_model_sha256(model_name: str) -> str:
    """The sha256 of the model's files on this host, or `missing:<name>` where it has none."""
    directory = model_directory(model_name)
    return directory_sha256(directory) if directory else f"missing:{model_name}"


def host_inputs(config: RagConfig) -> dict[str, str]:
    """{input: fingerprint on this host} for every per-host input that changes outputs."""
    return {
        EMBEDDING_MODEL: embedding_model_sha256(config.embedding.model),
        OCR_LANGUAGES: language_fingerprint(config.media_enrichment.ocr.languages),
    }


def host_input_tags() -> dict[str, str]:
    """The run tag recording this process' per-host inputs, for runs launched from here."""
    return {
        HOST_INPUTS_TAG: json.dumps(
            host_inputs(config_in_effect().config), sort_keys=True, separators=(",", ":")
        )
    }


def require_launching_host_inputs(context: dg.AssetExecutionContext, config: RagConfig, *names: str) -> None:
    """Fail the step when one of `names` differs here from the launching host's (run tag)."""
    recorded = context.run.tags.get(HOST_INPUTS_TAG)
    if not recorded:
        return
    launching = json.loads(recorded)
    here = host_inputs(config)
    for name in names:
        if name in launching and launching[name] != here[name]:
            raise HostInputMismatch(
                f"{name} on host {socket.gethostname()} differs from the launching host's "
                f"({here[name][:16]} here, {launching[name][:16]} there): install the same files on "
                "every host, or this host would write different output under the same version"
            )
