"""The dagster-celery executor with the broker, backend and delivery settings from the environment.

The run's own process (on whichever host launched it) only orchestrates: each step is a Celery
task that any `dagster-celery worker start -A vision_rag_pipeline.defs.celery_worker` picks up, on
any host that reaches the broker, Postgres and Elasticsearch. The worker app is built from the same
`celery_app_args`, so the two sides cannot disagree on the broker or on delivery.

Delivery is at-least-once: a task is acknowledged when its step ends (`task_acks_late`), so a
worker killed mid-step (kill -9, OOM, a lost host) leaves the message with the broker, which hands
it to another worker: at once when only the worker's pool process died
(`task_reject_on_worker_lost`), after the visibility timeout when the whole worker went (Redis has
no other way to tell). Every asset here replaces its partition's rows, so a step run twice leaves
what one run leaves.
"""

from __future__ import annotations

from typing import Any

import dagster as dg
from dagster_celery import celery_executor
from dagster_celery.executor import CeleryExecutor

from vision_rag_pipeline.core.config import CelerySettings

# Seconds between a worker's sweeps for messages whose worker went silent past the visibility timeout.
RESTORE_SWEEP_SECONDS = 5


def celery_config_source(settings: CelerySettings) -> dict[str, Any]:
    """Celery settings shared by the launching run and the workers (beside broker and backend)."""
    return {
        "task_acks_late": True,
        "task_reject_on_worker_lost": True,
        "worker_prefetch_multiplier": 1,  # a worker holds no step it is not running
        "broker_connection_retry_on_startup": True,
        "broker_transport_options": {
            "visibility_timeout": settings.visibility_timeout_s,
            "unacked_restore_interval": RESTORE_SWEEP_SECONDS,
            "unacked_restore_throttle": 1,
            "max_retries": 3,  # dagster-celery's defaults for publishing
            "interval_start": 0,
            "interval_step": 0.2,
            "interval_max": 0.5,
        },
    }


def celery_app_args(settings: CelerySettings) -> dict[str, Any]:
    """What dagster-celery builds its Celery app from, as its own CLI does for a worker."""
    return CeleryExecutor.for_cli(
        broker=settings.broker_url,
        backend=settings.backend_url,
        config_source=celery_config_source(settings),
    ).app_args()


def celery_executor_from_env() -> dg.ExecutorDefinition:
    """dagster-celery's executor, configured from `VISION_RAG_CELERY_*` (core/config.py)."""
    settings = CelerySettings.from_env()
    return celery_executor.configured(
        {
            "broker": settings.broker_url,
            "backend": settings.backend_url,
            "config_source": celery_config_source(settings),
        },
        name="celery",
    )
