"""The run journal: one JSON object per line, appended as results come in, read to resume.

Workers and the controller append to the same file. Each entry is written with one `write()` on
a file opened with O_APPEND, so concurrent entries never interleave and a crash loses at most the
entry being written (a partial last line is ignored by readers). Entry kinds:

- `run`: the first line: platform, descriptor hash, torch, kernel libraries, start time, selection;
- `resume`: a later session continued the run;
- `case`: one conformance case (the record's Case fields, plus `item`, the pytest node id);
- `item`: a pytest item finished every case it had (`--resume` does not run it again).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from torch_fl import jsonl
from torch_fl.jsonl import Reader

MAX_LINE = 64 * 1024


def journal_path(record: Path) -> Path:
    """`torch-2.13.json` -> `torch-2.13.journal.jsonl`, next to the record."""
    return record.with_name(record.stem + ".journal.jsonl")


def run_dir(record: Path) -> Path:
    """Scratch space of a run (in-flight markers, crash traces, the pytest log), next to the record."""
    return record.with_name(record.stem + ".run")


WRITTEN = "written.json"
"""In the run folder: the record a completed run wrote, and its checksum, read back after writing."""


def interim_record(record: Path) -> Path:
    """The record of a run in progress (its periodic merges, or where it stopped), in its run folder:
    the record itself is replaced only by a run that completes."""
    return run_dir(record) / "record.json"


def append(path: Path, entry: dict[str, Any]) -> None:
    """Append one entry atomically; an oversized message is cut so the entry stays one write."""
    if len(json.dumps(entry, separators=(",", ":"), default=str)) > MAX_LINE:
        entry = {**entry, "message": str(entry.get("message", ""))[: MAX_LINE // 2] + " [truncated]"}
    jsonl.append(path, entry)


def start(path: Path, header: dict[str, Any]) -> None:
    """Begin a fresh journal whose first line is the `run` header."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps({"kind": "run", **header}, separators=(",", ":"), default=str) + "\n")
    os.replace(tmp, path)


def read_all(path: Path) -> Iterator[dict[str, Any]]:
    yield from Reader(path).new()


def header(path: Path) -> dict[str, Any] | None:
    """The `run` entry of a journal, None when there is no readable journal."""
    for entry in read_all(path):
        return entry if entry.get("kind") == "run" else None
    return None
