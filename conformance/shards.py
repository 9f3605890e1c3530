"""Sharded runs: a board whose full run does not fit one sitting runs it as N shards, then merges them.

`--shard i/N` keeps the pytest items whose node id hashes (crc32) to shard i of N: every shard
collects the same items, so the N shards together are exactly the full run, with nothing run
twice. A shard writes `torch-<line>.shard-i-of-N.json` beside the record, with its own journal,
lock and run folder, so shards run one after another or on several boards at once, and each
resumes on its own. The gate never reads a shard's record; `torch-fl conformance merge NAME`
checks that all N are there, complete, of one binding and one selection, and writes the record.
"""

from __future__ import annotations

import json
import re
import zlib
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from torch_fl.conformance import recordfile
from torch_fl.conformance.summary import summary_path
from torch_fl.conformance.summary import write as write_summary
from torch_fl.filelock import hold
from torch_fl.platform.record import evidence_path

_SPEC = re.compile(r"(\d+)/(\d+)")


@dataclass(frozen=True)
class Shard:
    """Shard `index` (1-based) of `count`."""

    index: int
    count: int

    @classmethod
    def parse(cls, spec: str) -> Shard:
        match = _SPEC.fullmatch(spec.strip())
        if not match or not 1 <= int(match.group(1)) <= int(match.group(2)):
            raise ValueError(f"--shard takes i/N with 1 <= i <= N, e.g. 2/4; got {spec!r}")
        return cls(int(match.group(1)), int(match.group(2)))

    def __str__(self) -> str:
        return f"{self.index}/{self.count}"

    def holds(self, nodeid: str) -> bool:
        """Is this pytest item in the shard? (The same answer in every process and on every machine.)"""
        return zlib.crc32(nodeid.encode()) % self.count == self.index - 1

    def record_file(self, record: Path) -> Path:
        """`torch-2.11.json` -> `torch-2.11.shard-2-of-4.json`: the shard's record, beside the record."""
        return record.with_name(f"{record.stem}.shard-{self.index}-of-{self.count}.json")


def shard_files(record: Path) -> dict[int, list[Path]]:
    """N -> the records of the shards of N that lie beside `record`."""
    found: dict[int, list[Path]] = {}
    pattern = re.compile(re.escape(record.stem) + r"\.shard-(\d+)-of-(\d+)\.json")
    for path in sorted(record.parent.glob(f"{record.stem}.shard-*-of-*.json")):
        match = pattern.fullmatch(path.name)
        if match:
            found.setdefault(int(match.group(2)), []).append(path)
    return found


@dataclass
class Merged:
    """What a merge wrote: the record, from how many shards, with how many cases."""

    record_file: Path
    shards: int
    cases: int
    record: dict[str, Any]


def _read(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ValueError(f"{path}: cannot read the shard's record: {exc}") from None
    if not isinstance(data, dict):
        raise ValueError(f"{path}: not a record (a JSON object was expected)")
    return data


def _selection(record: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in record.get("machine", {}).get("selection", {}).items() if k != "shard"}


def _check(records: dict[Path, dict[str, Any]]) -> None:
    """Every shard complete, all of one platform, binding and selection."""
    first_path, first = next(iter(records.items()))
    for path, record in records.items():
        if record.get("complete") is not True:
            raise ValueError(f"{path}: the shard did not complete; finish it (--shard ... --resume) and merge again")
        for what, value in (
            ("platform", record.get("platform")),
            ("binding", record.get("binding")),
            ("selection", _selection(record)),
        ):
            expected = first.get(what) if what != "selection" else _selection(first)
            if value != expected:
                raise ValueError(
                    f"{path}: its {what} differs from {first_path.name}'s; re-run the shards of one checkout "
                    "with one selection"
                )


def selection_of(record: Path) -> dict[str, Any]:
    """The selection the shards beside `record` ran (without the shard itself), {} when none is there."""
    for paths in shard_files(record).values():
        return _selection(_read(paths[0]))
    return {}


def merge(record: Path, output: Path) -> Merged:
    """Merge the shards beside `record` into `output` (complete: the record, or the partial record
    beside a complete one for the shards of a subset run), then remove the shards' files."""
    found = shard_files(record)
    if not found:
        raise ValueError(f"no shard records beside {record}; run `torch-fl conformance run NAME --shard i/N` first")
    if len(found) > 1:
        raise ValueError(f"shards of several counts ({sorted(found)}) beside {record}; remove those not wanted")
    count, paths = next(iter(found.items()))
    missing = sorted(set(range(1, count + 1)) - {int(p.name.split(".shard-")[1].split("-")[0]) for p in paths})
    if missing:
        raise ValueError(f"shard(s) {missing} of {count} have no record beside {record}; run them and merge again")
    with ExitStack() as locks:
        locks.enter_context(hold(record.with_suffix(".lock"), f"a merge of {count} shards into {output}"))
        for path in paths:
            locks.enter_context(hold(path.with_suffix(".lock"), f"a merge of {path}"))
        records = {path: _read(path) for path in paths}
        _check(records)
        collector = recordfile.Collector()
        for path in paths:
            collector.seed(path)
        first = records[paths[0]]
        machine = {k: v for k, v in first.get("machine", {}).items() if k not in ("sessions", "selection")}
        collector.header = {
            "platform": first["platform"],
            "binding": first["binding"],
            "started": min(r.get("started", "") for r in records.values()),
            "sources_decide": first.get("sources_decide", {}),
            "machine": {**machine, "shards": count},
            "selection": _selection(first),
        }
        walls = [float(r.get("summary", {}).get("wall_s") or 0.0) for r in records.values()]
        finished = max(str(r.get("finished") or "") for r in records.values()) or recordfile.now()
        built, cases = recordfile.build(collector, True, finished, {"wall_s": max(walls), "shards": count})
        recordfile.write(output, built, cases)
        write_summary(output, built)
        for path in paths:
            for leftover in (evidence_path(path), summary_path(path), path):
                leftover.unlink(missing_ok=True)
    return Merged(output, count, len(cases), built)
