"""The Dagster entry point (`dagster dev` in the repo root, or `-m vision_rag_pipeline.definitions`)."""

from vision_rag_pipeline.defs.definitions import defs

__all__ = ["defs"]
