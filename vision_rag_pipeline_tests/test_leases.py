"""A run's document leases stay alive while its process lives: another host tells a live holder from
a dead one only by the lease's renewals (documents/registry.py `process_gone`)."""

from __future__ import annotations

import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path

from vision_rag_pipeline.documents.registry import DocumentRegistry
from vision_rag_pipeline_tests.conftest import new_database

# One process holds a document in each database given, one run after the other (as a CLI or code
# server does when the index database in effect changes), then lives on. Renewals every 0.2 s
# instead of every 15 s keep the test short; nothing else differs.
_HOLDER = """
import logging, sys, time
import dagster as dg
from vision_rag_pipeline.defs import io_manager

io_manager.RENEW_SECONDS = 0.2
instance = dg.DagsterInstance.ephemeral()
for n, (url, key) in enumerate(zip(sys.argv[1::2], sys.argv[2::2])):
    io_manager.hold_documents([key], f"run-{n}", instance, logging.getLogger("holder"), url)
print("held", flush=True)
time.sleep(120)
"""


def _renewed_at(url: str, key: str) -> datetime:
    lease = DocumentRegistry(url).lease(key)
    assert lease is not None and lease.renewed_at is not None
    return lease.renewed_at


def test_a_process_renews_its_leases_in_every_database_it_took_them_in(pg_url: str, tmp_path: Path) -> None:
    databases = [new_database(pg_url), new_database(pg_url)]
    held: list[tuple[str, str]] = []
    for n, url in enumerate(databases):
        document = tmp_path / f"report-{n}.pdf"
        document.write_bytes(b"%PDF-1.4 report " + bytes([n]))
        held.append((url, DocumentRegistry(url).register(document).document_id))

    holder = subprocess.Popen(
        [sys.executable, "-c", _HOLDER, *[arg for pair in held for arg in pair]],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "held\n", holder.communicate()[1]
        taken = {pair: _renewed_at(*pair) for pair in held}
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            stale = [pair for pair in held if _renewed_at(*pair) <= taken[pair]]
            if not stale:
                break
            time.sleep(0.2)
        assert not stale, (
            "the holder lives, yet its lease in the database it used second is not renewed:"
            " another host would take it as abandoned after 60 s"
        )
        for url, key in held:
            lease = DocumentRegistry(url).lease(key)
            assert lease is not None and lease.owner is not None and f" {holder.pid} " in lease.owner
    finally:
        holder.kill()
        holder.wait()
