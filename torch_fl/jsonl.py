"""Files of one JSON object per line, appended to by several processes and read as they grow.

Each entry is written with one `write()` on a file opened with O_APPEND, so concurrent entries never
interleave and a crash loses at most the entry being written (a partial last line is skipped by
readers). The conformance journal and the route tuner's workers use it.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any


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
            with open(self.path, "rb") as f:
                f.seek(self.offset)
                data = f.read()
        except FileNotFoundError:
            return []
        end = data.rfind(b"\n")
        if end < 0:
            return []
        self.offset += end + 1
        entries = []
        for line in data[: end + 1].splitlines():
            if not line.strip():
                continue
            try:
                entries.append(json.loads(line))
            except json.JSONDecodeError:
                continue  # a line torn by a crash mid-write: its case is reported by the crash path
        return entries
