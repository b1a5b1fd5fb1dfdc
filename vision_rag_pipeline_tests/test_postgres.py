"""Connections to the index database: reused after a clean commit, never after a failure."""

from __future__ import annotations

import psycopg
import pytest

from vision_rag_pipeline.core.postgres import connect


def _backend(url: str) -> int:
    with connect(url) as conn:
        return conn.execute("SELECT pg_backend_pid()").fetchone()[0]


def test_a_committed_connection_is_reused_and_its_writes_are_kept(pg_url: str) -> None:
    with connect(pg_url) as conn:
        conn.execute("CREATE TABLE IF NOT EXISTS pool_probe (n int)")
        conn.execute("DELETE FROM pool_probe")
        conn.execute("INSERT INTO pool_probe VALUES (1)")
        first = conn.execute("SELECT pg_backend_pid()").fetchone()[0]
    assert _backend(pg_url) == first
    with psycopg.connect(pg_url) as other:  # committed: another session sees it
        assert other.execute("SELECT count(*) FROM pool_probe").fetchone()[0] == 1


def test_a_connection_whose_transaction_failed_is_dropped_and_its_writes_rolled_back(pg_url: str) -> None:
    with connect(pg_url) as conn:
        conn.execute("CREATE TABLE IF NOT EXISTS pool_probe (n int)")
        conn.execute("DELETE FROM pool_probe")
    with pytest.raises(psycopg.errors.DivisionByZero), connect(pg_url) as conn:
        failed = conn.execute("SELECT pg_backend_pid()").fetchone()[0]
        conn.execute("INSERT INTO pool_probe VALUES (2)")
        conn.execute("SELECT 1 / 0")
    assert _backend(pg_url) != failed
    with connect(pg_url) as conn:
        assert conn.execute("SELECT count(*) FROM pool_probe").fetchone()[0] == 0
