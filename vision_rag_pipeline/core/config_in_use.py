"""Which config the runs of this deployment last used, and the one line a process whose own config
differs prints about it.

Every process reads one config (`config.config_in_effect`), but two processes can still read two:
`vision-rag ingest` started without the `VISION_RAG_CONFIG` the daemon has, or a daemon whose code
server loaded before an edit. Their runs then record other code versions, and the version sensor
re-runs the other side's documents with its own settings. Nothing stops that (either side may be
right), but neither side may be silent: each run records the config it executed with here (one row in
the index database, which every process of a deployment shares), and a process whose config differs
from the last one recorded says so once, naming both files.
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable
from typing import NamedTuple

from vision_rag_pipeline.core.config import ConfigInEffect
from vision_rag_pipeline.core.postgres import connect, ensure_schema

_SCHEMA = """
CREATE TABLE IF NOT EXISTS config_in_use (
    one_row boolean PRIMARY KEY DEFAULT true CHECK (one_row),
    path text NOT NULL,
    sha256 text NOT NULL,
    host text NOT NULL,
    used_at timestamptz NOT NULL DEFAULT now()
);
"""

_said_lock = threading.Lock()
_said = False


class ConfigUsed(NamedTuple):
    path: str
    sha256: str
    host: str


def last_config_used(url: str | None = None) -> ConfigUsed | None:
    """The config the latest run recorded, or None before the first run."""
    ensure_schema(_SCHEMA, url)
    with connect(url) as conn:
        row = conn.execute("SELECT path, sha256, host FROM config_in_use").fetchone()
    return ConfigUsed(*row) if row else None


def record_config_used(in_effect: ConfigInEffect, url: str | None = None) -> ConfigUsed | None:
    """Record that a run executes with `in_effect`; returns what was recorded before (the same row
    is rewritten only when the config changed, so a run costs one read)."""
    previous = last_config_used(url)
    if previous is None or previous.sha256 != in_effect.sha256 or previous.path != str(in_effect.path):
        with connect(url) as conn:
            conn.execute(
                "INSERT INTO config_in_use (path, sha256, host) VALUES (%s, %s, %s) ON CONFLICT (one_row)"
                " DO UPDATE SET path = EXCLUDED.path, sha256 = EXCLUDED.sha256, host = EXCLUDED.host,"
                " used_at = now()",
                (str(in_effect.path), in_effect.sha256, socket.gethostname()),
            )
    return previous


def difference(in_effect: ConfigInEffect, used: ConfigUsed | None) -> str | None:
    """The line saying that this process' config is not the one the last runs used, or None."""
    if used is None or used.sha256 == in_effect.sha256:
        return None
    where = "" if used.host == socket.gethostname() else f" on {used.host}"
    if used.path == str(in_effect.path):
        return (
            f"the config in effect here, {in_effect.describe()}, is not the one the last runs used{where} "
            f"(settings {used.sha256[:12]}): the file, or the defaults of the code reading it, changed since one "
            "of the two processes read it; a process keeps the settings it started with until it restarts"
        )
    return (
        f"the config in effect here, {in_effect.describe()}, differs from the one the last runs used{where}, "
        f"{used.path} (settings {used.sha256[:12]}): set VISION_RAG_CONFIG={used.path} to use the same, or runs from "
        "here and from there record different code versions and re-run each other's documents"
    )


def say_once_if_different(
    in_effect: ConfigInEffect, used: ConfigUsed | None, say: Callable[[str], None]
) -> None:
    """Call `say(line)` the first time in this process that its config differs from `used`."""
    global _said
    line = difference(in_effect, used)
    if line is None:
        return
    with _said_lock:
        if _said:
            return
        _said = True
    say(line)


def forget_said() -> None:
    """For a test that plays several processes in one: the next difference is said again."""
    global _said
    _said = False
