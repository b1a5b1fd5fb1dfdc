"""The inbox directory: which MHTML/PDF files are in it, and their content hashes.

A file is read (sniffed and hashed) only when its size or mtime moved since the state it was last
seen in; an unchanged inbox costs one `stat` per file. A file still being written is left alone: one
whose size and mtime moved is read only once they held still over one tick (the previous scan saw
the same, `settling`) or its mtime is at least `settle_ns` old (nothing wrote to it for that long),
so a slow copy starts one run, on its whole bytes, not one failed run per tick. Paths are handled as bytes, so any file name
the file system allows (not only UTF-8) works. The inbox never reaches outside itself: a symbolic link
whose target lies outside is skipped with a reason, and linked directories are not descended into.
"""

from __future__ import annotations

import hashlib
import os
import time
from collections.abc import Mapping
from pathlib import Path
from typing import NamedTuple

from vision_rag_pipeline.core.sniff import sniff_document_kind
from vision_rag_pipeline.documents.registry import FileState, display_path

DOCUMENT_SUFFIXES = (b".mhtml", b".mht", b".pdf")
_HASH_BLOCK = 1 << 20


def file_sha256(path: str | bytes | Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while block := handle.read(_HASH_BLOCK):
            digest.update(block)
    return digest.hexdigest()


Observed = tuple[int, int]  # (size, mtime_ns) of a file seen changing


class InboxScan(NamedTuple):
    files: dict[bytes, FileState]  # every document file in the inbox now, by absolute path
    restated: list[bytes]  # those whose state differs from the known one (new, changed or touched)
    skipped: list[str]  # why a candidate was left out, one line each
    settling: dict[bytes, Observed]  # files changed since the last look: read once they hold still


def scan_inbox(
    inbox: Path,
    known: Mapping[bytes, FileState],
    settling: Mapping[bytes, Observed] | None = None,
    settle_ns: int = 0,
) -> InboxScan:
    """Every MHTML/PDF file under `inbox` (by name and by its bytes) with its state.

    `known` is the state each file was last seen in: a file whose size and mtime did not move keeps
    its known state unread. `settling` is what the previous scan saw of files that were changing; a
    changed file is read when it matches that, or when nothing wrote to it for `settle_ns`. Until then
    it is in `settling` (and, when known, keeps its known state: it is not deleted).
    """
    root = os.fsencode(inbox.resolve())
    scan = InboxScan({}, [], [], {})
    look = _Look(known, settling or {}, settle_ns, time.time_ns())
    pending = [root]
    while pending:
        directory = pending.pop()
        try:
            entries = list(os.scandir(directory))
        except OSError as exc:
            scan.skipped.append(f"{display_path(directory)}: cannot list ({exc.strerror})")
            continue
        for entry in entries:
            try:
                _visit(entry, root, look, scan, pending)
            except OSError:
                continue  # vanished or unreadable while we looked: the next tick sees the settled state
    return scan


class _Look(NamedTuple):
    known: Mapping[bytes, FileState]
    settling: Mapping[bytes, Observed]
    settle_ns: int
    now_ns: int


def _visit(entry: os.DirEntry[bytes], root: bytes, look: _Look, scan: InboxScan, pending: list) -> None:
    name, path = entry.name, entry.path
    if name.startswith(b"."):  # hidden, or a partial download
        return
    if entry.is_symlink():
        target = os.path.realpath(path)
        if not target.startswith(root + b"/"):
            scan.skipped.append(f"{display_path(path)}: links out of the inbox (to {display_path(target)})")
            return
        if entry.is_dir():
            scan.skipped.append(f"{display_path(path)}: directory links are not followed")
            return
    elif entry.is_dir(follow_symlinks=False):
        pending.append(path)
        return
    if not name.lower().endswith(DOCUMENT_SUFFIXES) or not entry.is_file():
        return
    stat = entry.stat()
    previous = look.known.get(path)
    observed = (stat.st_size, stat.st_mtime_ns)
    if previous and (previous.size, previous.mtime_ns) == observed:
        scan.files[path] = previous
        return
    recent = look.settle_ns > 0 and look.now_ns - stat.st_mtime_ns < look.settle_ns
    if recent and look.settling.get(path) != observed:
        scan.settling[path] = observed  # still being written, maybe: look again next tick
        if previous:
            scan.files[path] = previous
        return
    if sniff_document_kind(path) is None:
        return
    scan.files[path] = FileState(stat.st_size, stat.st_mtime_ns, file_sha256(path))
    scan.restated.append(path)
