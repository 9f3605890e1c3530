"""Files of one JSON object per line, appended to by several processes and read as they grow.

Each entry is written with one `write()` on a file opened with O_APPEND, so concurrent entries never
interleave and a crash loses at most the entry being written (a partial last line is skipped by
readers). The conformance journal and the route tuner's workers use it. A reader skips any line
that is not a JSON object (torn, not UTF-8, nested past the stack) and refuses a file that is not a
regular one or grew past MAX_BYTES, naming it.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from torch_fl.fileio import RefusedFile, read_bounded

MAX_BYTES = 1 << 30  # the journal of a full sweep holds tens of megabytes


def append(path: Path, entry: dict[str, Any]) -> None:
    """Append one entry atomically (a single write on an O_APPEND descriptor)."""
    line = json.dumps(entry, separators=(",", ":"), default=str)
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (line + "\n").encode())
    finally:
        os.close(fd)


class Reader:
    """Reads a journal incrementally: each `new()` returns the complete lines added since the last."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.offset = 0

    def new(self) -> list[dict[str, Any]]:
        try:
            data = read_bounded(self.path, MAX_BYTES, self.offset)
        except RefusedFile:
            if not os.path.lexists(self.path):
                return []  # not started yet, or removed by a run that completed
            raise
        end = data.rfind(b"\n")
        if end < 0:
            return []
        self.offset += end + 1
        entries = []
        for line in data[: end + 1].splitlines():
            if not line.strip():
                continue
            try:
                entry = json.loads(line)
            except (ValueError, RecursionError):
                continue  # a line torn by a crash mid-write (its case is reported by the crash path), or garbage
            if isinstance(entry, dict):
                entries.append(entry)
        return entries
