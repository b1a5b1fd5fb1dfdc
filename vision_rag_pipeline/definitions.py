"""The Dagster entry point (`dagster dev` in the repo root, or `-m vision_rag_pipeline.definitions`)."""

from vision_rag_pipeline.core.config import require_shared_stores

# A multi-node code server, daemon or run worker refuses to load before anything opens or creates a
# store on this host (an embedded Postgres, a tantivy index, a cache).
require_shared_stores()

from vision_rag_pipeline.defs.definitions import defs  # noqa: E402

__all__ = ["defs"]
