"""The sha256 of a directory's content (model files), remembered by the files' stat.

A model's directory is named by a path, and paths differ between hosts while the files do not (or
the other way round): what a host produces depends on the bytes, so the bytes are what gets hashed.
Hashing the 90 MB of all-MiniLM-L6-v2 takes ~0.2 s, paid by every process that loads the code
location; the digest is therefore kept in `$VISION_RAG_HOME/cache/content-sha256.json` under a key
made of each file's relative path, size, modification time and inode, so a process pays a few
`stat` calls instead, and any change to a file hashes it again.
"""

from __future__ import annotations

import hashlib
import json
import os
import threading
from pathlib import Path

from vision_rag_pipeline.core.config import home

_CACHE_NAME = "content-sha256.json"
_lock = threading.Lock()
_known: dict[str, str] = {}  # stat key -> digest, this process


def directory_sha256(directory: Path) -> str:
    """sha256 over every file under `directory` (relative path and content, in path order)."""
    files = sorted(path for path in directory.rglob("*") if path.is_file())
    stats = []
    for path in files:
        st = path.stat()
        stats.append([str(path.relative_to(directory)), st.st_size, st.st_mtime_ns, st.st_ino])
    key = hashlib.sha256(json.dumps([str(directory.resolve()), stats]).encode()).hexdigest()
    with _lock:
        if key in _known:
            return _known[key]
    cache_file = home() / "cache" / _CACHE_NAME
    digest = _read_cache(cache_file).get(key)
    if digest is None:
        total = hashlib.sha256()
        for path in files:
            total.update(str(path.relative_to(directory)).encode() + b"\0")
            total.update(_file_sha256(path).encode())
        digest = total.hexdigest()
        _write_cache(cache_file, key, digest)
    with _lock:
        _known[key] = digest
    return digest


def _file_sha256(path: Path) -> str:
    with path.open("rb") as handle:
        return hashlib.file_digest(handle, "sha256").hexdigest()


def _read_cache(cache_file: Path) -> dict[str, str]:
    try:
        return json.loads(cache_file.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}


def _write_cache(cache_file: Path, key: str, digest: str) -> None:
    """Best effort (a read-only home only costs the hashing again): replaced whole, so a process
    reading at the same moment sees the old file or the new one."""
    try:
        cache_file.parent.mkdir(parents=True, exist_ok=True)
        entries = _read_cache(cache_file) | {key: digest}
        partial = cache_file.with_name(f".{cache_file.name}.{os.getpid()}.{threading.get_ident()}")
        partial.write_text(json.dumps(entries), encoding="utf-8")
        os.replace(partial, cache_file)
    except OSError:
        pass
