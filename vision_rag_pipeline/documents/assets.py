"""raw_documents: the registered file, loaded into the document model."""

import dagster as dg

from vision_rag_pipeline.documents.loader import load_document
from vision_rag_pipeline.documents.model import LoadedDocument
from vision_rag_pipeline.partitions import documents_partitions
from vision_rag_pipeline.resources import IndexDatabase


@dg.asset(
    partitions_def=documents_partitions,
    group_name="documents",
    kinds={"python", "file"},
    description="The file as received (MHTML or PDF), parsed into ordered, located elements and images. "
    "Its data version is the file's sha256, so only changed files make downstream assets stale.",
)
def raw_documents(context: dg.AssetExecutionContext, index_db: IndexDatabase) -> dg.Output[LoadedDocument]:
    registered = index_db.registry().get(context.partition_key)
    context.log.info(f"loading {registered.source_path}")
    doc = load_document(registered.abs_path, source_path=registered.source_path)
    return dg.Output(
        doc,
        data_version=dg.DataVersion(doc.sha256),
        metadata={
            "source_path": registered.source_path,
            "sha256": doc.sha256,
            "size_bytes": doc.size,
            "mime": doc.mime,
            "title": doc.title,
            "pages": doc.pages or 0,
            "elements": len(doc.elements),
            "images": len(doc.images),
            "headers": dg.MetadataValue.json({k: str(v) for k, v in doc.metadata.items()}),
        },
    )
