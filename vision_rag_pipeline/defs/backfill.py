"""Re-enrich every (or some) partition on demand, through the one way in: the documents are
requested for runs of the `reenrich` job (defs/intake.py), which a Dagster daemon serving the
instance (its `ingest_requests` sensor) or `vision-rag backfill` itself executes in batches."""

from __future__ import annotations

import dagster as dg

from vision_rag_pipeline.defs.intake import request_documents
from vision_rag_pipeline.defs.jobs import reenrich_job
from vision_rag_pipeline.defs.partitions import documents_partitions


class UnknownPartitionError(ValueError):
    """A partition named on the command line is not a registered document."""


def backfill_partitions(instance: dg.DagsterInstance, wanted: list[str] | None) -> list[str]:
    """The partitions named (each once, in order), or every partition; an unknown one is an error."""
    known = instance.get_dynamic_partitions(documents_partitions.name)
    if not wanted:
        if not known:
            raise UnknownPartitionError("no document partitions to backfill yet")
        return list(known)
    unknown = sorted(set(wanted) - set(known))
    if unknown:
        raise UnknownPartitionError(f"no such document partition: {', '.join(unknown)}")
    return list(dict.fromkeys(wanted))


def request_backfill(instance: dg.DagsterInstance, partitions: list[str] | None = None) -> list[str]:
    """Request `reenrich` runs (enrichments, chunks, embeddings, indexes) for the partitions named,
    or all; returns them. One UPDATE in the registry however many: the sensor claims them in turns."""
    names = backfill_partitions(instance, partitions)
    request_documents(instance, names, "backfill", reenrich_job.name)
    return names
