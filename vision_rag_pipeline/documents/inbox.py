"""The inbox directory: which MHTML/PDF files are in it, and their content hashes.

A file is hashed only when its size or mtime moved since the previous scan (a `touch` costs nothing).
"""

import hashlib
import os
from pathlib import Path

from vision_rag_pipeline.core.config import home
from vision_rag_pipeline.core.sniff import sniff_document_kind

INBOX_ENV = "VISION_RAG_INBOX"
DOCUMENT_SUFFIXES = (".mhtml", ".mht", ".pdf")
_HASH_BLOCK = 1 << 20


def inbox_dir() -> Path:
    """`VISION_RAG_INBOX`, else `$VISION_RAG_HOME/inbox`."""
    configured = os.environ.get(INBOX_ENV)
    return Path(configured).expanduser().resolve() if configured else home() / "inbox"


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        while block := handle.read(_HASH_BLOCK):
            digest.update(block)
    return digest.hexdigest()


def scan_inbox(inbox: Path, seen: dict[str, dict]) -> dict[str, dict]:
    """{absolute path: {size, mtime_ns, sha256}} for every document file under `inbox`.

    `seen` is the previous scan: a file whose size and mtime did not move keeps its old hash unread.
    Files that are not MHTML/PDF by name and by their bytes are left out.
    """
    found: dict[str, dict] = {}
    for path in sorted(inbox.rglob("*")):
        if path.suffix.lower() not in DOCUMENT_SUFFIXES or path.name.startswith(".") or not path.is_file():
            continue
        try:
            stat = path.stat()
            key = str(path.resolve())
            previous = seen.get(key)
            if previous and (previous["size"], previous["mtime_ns"]) == (stat.st_size, stat.st_mtime_ns):
                found[key] = previous
                continue
            if sniff_document_kind(path) is None:
                continue
            found[key] = {"size": stat.st_size, "mtime_ns": stat.st_mtime_ns, "sha256": file_sha256(path)}
        except OSError:
            continue  # vanished or unreadable while we looked: the next tick sees the settled state
    return found
