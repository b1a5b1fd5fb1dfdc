"""One dynamic partition per document (the key is `documents.registry.document_id_for(path)`), and
what every per-document asset does the same way: a run covers one document or a range of them (a
batch); an asset's value is `{partition key: the document's value}`; metadata and check results
are the document's own.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager

import dagster as dg

from vision_rag_pipeline.documents.model import DocumentError

documents_partitions = dg.DynamicPartitionsDefinition(name="documents")
FAILED_DOCUMENTS = "documents"  # the Failure metadata naming the documents a batch failed on, and why


class DocumentFailures:
    """The documents of a run's batch that cannot be read (`DocumentError`: the message names the
    file and why), collected while a step works through the others. `raise_if_any` then fails the
    step with a Dagster `Failure`: the UI shows its one line as the step's error, and its metadata
    names each document with its reason, so the rest of the batch can run again without them."""

    def __init__(self) -> None:
        self.reasons: dict[str, str] = {}

    @contextmanager
    def document(self, document_id: str) -> Iterator[None]:
        try:
            yield
        except DocumentError as exc:
            self.reasons[document_id] = str(exc)

    def raise_if_any(self) -> None:
        if not self.reasons:
            return
        reasons = list(self.reasons.values())
        said = (
            reasons[0]
            if len(reasons) == 1
            else f"{len(reasons)} documents cannot be read: " + "; ".join(reasons)
        )
        raise dg.Failure(
            description=said,
            metadata={FAILED_DOCUMENTS: dg.MetadataValue.json(self.reasons)},
            allow_retries=False,
        )


def batch_check(results: Mapping[str, dg.AssetCheckResult]) -> dg.AssetCheckResult:
    """One check's result for the run's documents. Dagster records one evaluation per check and step,
    for the run's partition: one document keeps its own result; a batch passes when every document's
    did, and names the documents that did not."""
    if len(results) == 1:
        return next(iter(results.values()))
    failed = [key for key, result in results.items() if not result.passed]
    first = next(iter(results.values()))
    return dg.AssetCheckResult(
        check_name=first.check_name,
        passed=not failed,
        metadata={"documents": len(results), "failed_documents": dg.MetadataValue.json(failed[:50])},
    )
