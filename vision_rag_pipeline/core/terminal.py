"""What the terminal shows of the doors' errors, and the library noise kept off it (no heavy import:
`vision-rag status` starts with this alone)."""

from __future__ import annotations

import errno
import os


def exception_line(exc: BaseException) -> str:
    """`Type: first line of the message`: what the terminal shows of an unexpected exception; a
    full disk says so first, with the file it could not write."""
    if isinstance(exc, OSError) and exc.errno == errno.ENOSPC:
        return str(exc) if str(exc).startswith("disk full") else f"disk full: {exc.filename or exc}"
    lines = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {lines[0]}" if lines else type(exc).__name__


def quiet_library_noise() -> None:
    """Keep the terminal for our own lines: the missing XDG_RUNTIME_DIR notice and the model-loading
    progress bar say nothing a user can act on. (Dagster's preview and beta notices about our
    definitions are silenced where they arise, by message: defs/checks.py, defs/definitions.py.)"""
    from vision_rag_pipeline.core.postgres import quiet_embedded_server_notice

    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")
    quiet_embedded_server_notice()
