"""Route a file to the loader for its kind, recording what identifies its content."""

from __future__ import annotations

import hashlib
import tempfile
from pathlib import Path

from vision_rag_pipeline.core.config import DocumentLimits
from vision_rag_pipeline.core.sniff import sniff_document_kind
from vision_rag_pipeline.documents.model import DocumentError, LoadedDocument

# Bump when a change to a loader (here, pdf.py, mhtml.py) changes what a file loads as: its elements,
# pages, boxes, images or their text layers. raw_documents' code version includes it, so documents
# loaded by older code are loaded again (version sensor, next ingest); their unchanged images and
# chunk texts are then served from the enrichment and embedding caches.
LOADER_REVISION = 3


def load_document(
    path: str | Path, source_path: str | None = None, limits: DocumentLimits | None = None
) -> LoadedDocument:
    """Load an MHTML or PDF file; `source_path` is the path as the user gave it, `limits` what loading
    it may cost (the defaults when None; past one: `DocumentBudgetError`)."""
    file = Path(path)
    if not file.is_file():
        raise DocumentError(f"{file}: no such file")
    kind = sniff_document_kind(file)
    if kind is None:
        raise DocumentError(f"{file.name}: not an MHTML web archive or a PDF")
    # The loaders are imported when a file of their kind comes: BeautifulSoup and pypdfium2 take ~0.25 s
    # to import, and everything that loads the Dagster definitions imports this module (an unchanged
    # ingest loads no file at all).
    if kind == "pdf":
        from vision_rag_pipeline.documents.pdf import load_pdf

        doc = load_pdf(file, limits)
    else:
        from vision_rag_pipeline.documents.mhtml import load_mhtml

        doc = load_mhtml(file, limits)
    data = file.read_bytes()
    return doc.model_copy(
        update={
            "source_path": source_path or str(path),
            "sha256": hashlib.sha256(data).hexdigest(),
            "size": len(data),
        }
    )


def load_document_bytes(
    data: bytes, name: str, source_path: str, limits: DocumentLimits | None = None
) -> LoadedDocument:
    """Load a document from its stored bytes; `name` is the original file name (messages, titles).

    The loaders read files (pdfium maps them), so the bytes go to a private temporary file first.
    """
    with tempfile.TemporaryDirectory(prefix="vision-rag-doc-") as folder:
        file = Path(folder) / Path(name).name
        file.write_bytes(data)
        return load_document(file, source_path=source_path, limits=limits)
