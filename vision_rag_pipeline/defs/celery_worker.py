"""The Celery app of a step worker: `dagster-celery worker start -A vision_rag_pipeline.defs.celery_worker`.

Built from the same environment as the launching run's executor (`VISION_RAG_CELERY_*`), so no
separate worker config file can drift from it. Loading it refuses a multi-node worker without the
shared stores, then loads the code location once, in the worker's main process: its pool processes
fork from it with Dagster and the project imported, as the code server's run workers do.
"""

from __future__ import annotations

from celery import Celery
from dagster_celery.make_app import make_app
from dagster_celery.tasks import create_task

from vision_rag_pipeline.core.config import CelerySettings, require_shared_stores


def worker_app() -> Celery:
    require_shared_stores()
    from vision_rag_pipeline.defs.celery_executor import celery_app_args
    from vision_rag_pipeline.defs.definitions import defs  # noqa: F401  (loaded once, before the pool forks)

    return make_app(celery_app_args(CelerySettings.from_env()))


app = worker_app()
execute_plan = create_task(app)
