"""One dynamic partition per document; the key is `documents.registry.document_id_for(path)`."""

import dagster as dg

documents_partitions = dg.DynamicPartitionsDefinition(name="documents")
