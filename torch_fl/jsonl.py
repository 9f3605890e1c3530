"""Files of one JSON object per line, appended to by several processes and read as they grow.

Each entry is written with one `write()` on a file opened with O_APPEND, so concurrent entries never
interleave and a crash loses at most the entry being written (a partial last line is skipped by
readers). The conformance journal and the route tuner's workers use it. A reader skips any line
that is not a JSON object (torn, not UTF-8, nested past the stack) and refuses a file that is not a
regular one or grew past MAX_BYTES, naming it.
"""

from __future__ import annotations

import errno
import json
import os
from pathlib import Path
from typing import Any

from torch_fl.fileio import RefusedFile, open_bounded

MAX_BYTES = 256 << 20  # the journal of a full sweep holds tens of megabytes
MAX_LINE = 1 << 20  # an entry; a longer line is skipped, read a piece at a time


def append(path: Path, entry: dict[str, Any]) -> None:
    """Append one entry atomically (a single write on an O_APPEND descriptor)."""
    line = json.dumps(entry, separators=(",", ":"), default=str)
    data = (line + "\n").encode()
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        written = os.write(fd, data)
    finally:
        os.close(fd)
    if written != len(data):  # a full disk or a file size limit: the entry is torn, and readers skip it
        raise OSError(errno.ENOSPC, f"only {written} of {len(data)} bytes of an entry were written", str(path))


class Reader:
    """Reads a journal incrementally: each `new()` returns the complete lines added since the last."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.offset = 0

    def new(self) -> list[dict[str, Any]]:
        entries = []
        try:
            with open_bounded(self.path, MAX_BYTES) as f:
                f.seek(self.offset)
                while line := f.readline(MAX_LINE + 1):
                    if not line.endswith(b"\n") and len(line) <= MAX_LINE:
                        break  # the last line, still being written: read again with the rest
                    self.offset += len(line)
                    entry = _entry(line)
                    if entry is not None:
                        entries.append(entry)
        except RefusedFile:
            if not os.path.lexists(self.path):
                return []  # not started yet, or removed by a run that completed
            raise
        return entries


def _entry(line: bytes) -> dict[str, Any] | None:
    """The object on a line; None for a line torn by a crash mid-write (its case is reported by the
    crash path), an overlong one (read in pieces) or garbage."""
    try:
        entry = json.loads(line)
    except (ValueError, RecursionError):
        return None
    return entry if isinstance(entry, dict) else None
