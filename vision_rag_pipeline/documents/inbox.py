"""The inbox directory: which MHTML/PDF files are in it, their content hashes, and why a file named
like a document is not one.

A file is read (hashed) only when its size or mtime moved since the state it was last
seen in; an unchanged inbox costs one `stat` per file. A file still being written is left alone: one
whose size and mtime moved is read only once they held still over one tick (the previous scan saw
the same, `settling`) or its mtime is at least `settle_ns` old (nothing wrote to it for that long),
so a slow copy starts one run, on its whole bytes, not one failed run per tick. At most `max_reads`
files are read per scan, oldest first: a drop of 100,000 files is taken in turns, the rest counted
as waiting. A scan given a deadline lists and reads only until it passes, directory by directory
and name by name, and says where it stopped (`ScanPosition`): the next scan goes on from there, so a
listing slower than a sensor tick (100,000 files under load) is done over several ticks, each file
listed once a pass; what a scan covered says which known files it can tell are gone. A file that is not a document (empty, a Word file
renamed `.pdf`) is read once and comes back with the reason; while its size and mtime hold it is
not read again. Paths are handled as bytes, so any file name
the file system allows (not only UTF-8) works. The inbox never reaches outside itself: a symbolic link
whose target lies outside is skipped with a reason, and linked directories are not descended into.
"""

from __future__ import annotations

import hashlib
import os
import stat
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple

from vision_rag_pipeline.core.deadline import Deadline
from vision_rag_pipeline.core.sniff import why_not_a_document
from vision_rag_pipeline.documents.registry import FileState, Rejected, display_path

DOCUMENT_SUFFIXES = (b".mhtml", b".mht", b".pdf")
_HASH_BLOCK = 1 << 20


def file_sha256(path: str | bytes | Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while block := handle.read(_HASH_BLOCK):
            digest.update(block)
    return digest.hexdigest()


Observed = tuple[int, int]  # (size, mtime_ns) of a file seen changing, or seen not to be a document


class ScanPosition(NamedTuple):
    """Where a scan that ran out of time stopped: the directory it was listing, the last name it
    took there (directories' entries are taken in name order), and the directories still to list."""

    directory: bytes
    after: bytes
    pending: list[bytes]


@dataclass
class InboxScan:
    present: set[bytes] = field(default_factory=set)  # every document file now (known or read)
    read: dict[bytes, FileState] = field(
        default_factory=dict
    )  # read now, oldest first: new, changed or touched
    skipped: list[str] = field(default_factory=list)  # why a link or folder was left out, one line each
    settling: dict[bytes, Observed] = field(default_factory=dict)  # changing: read once they hold still
    rejected: dict[bytes, Rejected] = field(default_factory=dict)  # read now: not documents
    rejected_unchanged: set[bytes] = field(default_factory=set)  # known not to be documents, not read again
    waiting: int = 0  # files due a read left to later scans (over `max_reads`, or out of time)
    seen: int = 0  # files named like documents (links out and folders aside)
    root: bytes = b""
    # {directory: (names after this one, up to this one or None: to its end)} listed by this scan
    covered: dict[bytes, tuple[bytes, bytes | None]] = field(default_factory=dict)
    resume: ScanPosition | None = None  # where the next scan goes on; None: this one ended a pass
    _reachable: dict[bytes, bool] = field(default_factory=dict)

    def covers(self, path: bytes) -> bool:
        """Whether this scan can tell if the file is there: its name is in a stretch of its directory
        listed by this scan, or the scan ended a pass and its directory is gone from the inbox (a
        directory listed earlier in the pass and deleted since)."""
        directory, name = os.path.split(path)
        span = self.covered.get(directory)
        if span is not None:
            after, upto = span
            return name > after and (upto is None or name <= upto)
        return self.resume is None and not self._still_there(directory)

    def _still_there(self, directory: bytes) -> bool:
        """Whether the directory is one a pass lists: a real directory (not a link) in a real one, up to
        the inbox."""
        if directory == self.root:
            return True
        if directory not in self._reachable:
            parent = os.path.dirname(directory)
            try:
                real = stat.S_ISDIR(os.lstat(directory).st_mode)
            except OSError:
                real = False
            name = os.path.basename(directory)
            self._reachable[directory] = (
                real and not name.startswith(b".") and parent != directory and self._still_there(parent)
            )
        return self._reachable[directory]


def scan_inbox(
    inbox: Path,
    known: Mapping[bytes, Observed],
    settling: Mapping[bytes, Observed] | None = None,
    settle_ns: int = 0,
    rejected: Mapping[bytes, Observed] | None = None,
    max_reads: int | None = None,
    deadline: Deadline | None = None,
    resume: ScanPosition | None = None,
) -> InboxScan:
    """Every MHTML/PDF file under `inbox` (by name) with its state, or those listed before `deadline`
    from `resume` on (where the last scan stopped).

    `known` is the (size, mtime) each file was last seen with: a file whose size and mtime did not
    move is not read. `settling` is what the previous scan saw of files that were changing; a
    changed file is read when it matches that, or when nothing wrote to it for `settle_ns`. Until then
    it is in `settling` (and, when known, keeps its known state: it is not deleted). `rejected` holds
    the files found not to be documents before, as they were then. `max_reads` bounds the files read
    (and the files tracked as settling); the others wait, a known one keeping its known state.
    """
    root = os.fsencode(inbox.resolve())
    scan = InboxScan(root=root)
    due: list[tuple[int, bytes, Observed]] = []  # (mtime, path, observed): to read, oldest first
    pending = list(resume.pending) if resume else [root]
    current = (resume.directory, resume.after) if resume else None
    while current is not None or pending:
        directory, after = current or (pending.pop(), b"")
        current = None
        try:
            entries = sorted(os.scandir(directory), key=lambda entry: entry.name)  # names and types, no stat
        except OSError as exc:
            scan.skipped.append(f"{display_path(directory)}: cannot list ({exc.strerror})")
            scan.covered[directory] = (b"", None)
            continue
        done = after
        for entry in entries:
            if entry.name <= after:
                continue
            if deadline is not None and deadline.passed():
                scan.covered[directory] = (after, done)
                scan.resume = ScanPosition(directory, done, pending)
                break
            done = entry.name
            try:
                observed = _visit(entry, root, scan, pending)
            except OSError:
                continue  # vanished or unreadable while we looked: the next tick sees the settled state
            if observed is None:
                continue
            scan.seen += 1
            if known.get(entry.path) == observed:
                scan.present.add(entry.path)
            elif rejected and rejected.get(entry.path) == observed:
                scan.rejected_unchanged.add(entry.path)
            else:
                due.append((observed[1], entry.path, observed))
        if scan.resume is not None:
            break
        scan.covered[directory] = (after, None)
    _read_due(sorted(due), known, settling or {}, settle_ns, max_reads, scan, deadline)
    return scan


def _visit(entry: os.DirEntry[bytes], root: bytes, scan: InboxScan, pending: list) -> Observed | None:
    """(size, mtime) of a document-named file in the inbox; folders are queued, links judged."""
    name, path = entry.name, entry.path
    if name.startswith(b"."):  # hidden, or a partial download
        return None
    if entry.is_symlink():
        target = os.path.realpath(path)
        if not target.startswith(root + b"/"):
            scan.skipped.append(f"{display_path(path)}: links out of the inbox (to {display_path(target)})")
            return None
        if entry.is_dir():
            scan.skipped.append(f"{display_path(path)}: directory links are not followed")
            return None
    elif entry.is_dir(follow_symlinks=False):
        pending.append(path)
        return None
    if not name.lower().endswith(DOCUMENT_SUFFIXES) or not entry.is_file():
        return None
    info = entry.stat()
    return info.st_size, info.st_mtime_ns


def _read_due(
    due: list[tuple[int, bytes, Observed]],
    known: Mapping[bytes, Observed],
    settling: Mapping[bytes, Observed],
    settle_ns: int,
    max_reads: int | None,
    scan: InboxScan,
    deadline: Deadline | None,
) -> None:
    now_ns = time.time_ns()
    budget = len(due) if max_reads is None else max_reads
    reads = 0
    for mtime_ns, path, observed in due:
        if path in known:
            scan.present.add(path)  # until read, a changed known file keeps its state: not deleted
        recent = settle_ns > 0 and now_ns - mtime_ns < settle_ns
        if recent and settling.get(path) != observed:
            if len(scan.settling) < budget:
                scan.settling[path] = observed  # still being written, maybe: look again next tick
            else:
                scan.waiting += 1
            continue
        if reads >= budget or (deadline is not None and deadline.passed()):
            scan.waiting += 1
            continue
        reads += 1
        try:
            reason = why_not_a_document(path)
            if reason is not None:
                scan.present.discard(path)  # no longer a document: as good as deleted
                scan.rejected[path] = Rejected(*observed, reason)
                continue
            scan.read[path] = FileState(*observed, file_sha256(path))
        except OSError:
            continue  # vanished or unreadable while we looked: the next tick sees the settled state
        scan.present.add(path)
