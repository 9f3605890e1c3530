"""The record writer: journal entries in, the record JSON the loader reads out (written atomically).

The record has exactly the fields of `torch_fl.platform.record.Record` and is validated against
that model before it replaces the old file, so what the loader reads is always what it accepts.
A case id seen twice (a re-run after a crash, a resumed run) keeps its last entry.
"""
from __future__ import annotations

import datetime
import json
import os
from collections import Counter
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from torch_fl.platform.record import RECORD_FORMAT, Record

CASE_FIELDS = ("id", "suite", "op", "dtype", "path", "status", "message", "fingerprint", "duration_s")
STATUSES = ("passed", "failed", "error", "crashed", "timeout", "skipped")
MAX_FAILURES = 300
CRITERION = 0.95
"""The issue's bar: of the op x dtype cases the CPU itself passes, this share must pass on flagos."""


def identity(descriptor: Any) -> dict[str, Any]:
    """What a record must share with this machine to stand for it: the platform's descriptor, the
    torch release and the kernel libraries installed here."""
    from torch_fl.platform.record import descriptor_hash, installed_kernel_versions, installed_version
    from torch_fl.platform.versions import minor_line

    torch_version = installed_version("torch") or "0"
    return {
        "platform": descriptor.name,
        "descriptor_hash": descriptor_hash(descriptor),
        "torch": minor_line(torch_version),
        "torch_version": torch_version,
        "kernel_libraries": {k: v or "not installed" for k, v in installed_kernel_versions(descriptor).items()},
    }


def now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


class Collector:
    """Accumulates journal entries: the run header, the cases by id, the finished items."""

    def __init__(self) -> None:
        self.header: dict[str, Any] | None = None
        self.cases: dict[str, dict[str, Any]] = {}
        self.items_done: set[str] = set()
        self.sessions: list[dict[str, Any]] = []
        self.devices: set[str] = set()

    def seed(self, record: dict[str, Any]) -> None:
        """Start from a record's cases (`--add`); the run's own header and cases follow."""
        for case in record.get("cases", []):
            self.cases[case["id"]] = {k: case.get(k) for k in CASE_FIELDS}
        for session in record.get("machine", {}).get("sessions", []):
            self.sessions.append(session)

    def feed(self, entries: Iterable[dict[str, Any]]) -> int:
        """Take entries; returns how many were cases."""
        n = 0
        for entry in entries:
            kind = entry.get("kind")
            if kind == "case":
                self.cases[entry["id"]] = {k: entry.get(k) for k in CASE_FIELDS}
                n += 1
            elif kind == "item":
                self.items_done.add(entry["item"])
            elif kind == "run":
                self.header = entry
            elif kind == "session":
                self.sessions.append(entry)
            elif kind == "worker" and entry.get("device"):
                self.devices.add(str(entry["device"]))
        return n


def _rate(counts: Counter[str]) -> float | None:
    judged = sum(counts.values()) - counts["skipped"]
    return round(counts["passed"] / judged, 4) if judged else None


def _table(cases: Iterable[dict[str, Any]], key: str) -> dict[str, dict[str, Any]]:
    groups: dict[str, Counter[str]] = {}
    for case in cases:
        name = case.get(key) or "-"
        groups.setdefault(name, Counter())[case["status"]] += 1
    return {
        name: {**{s: counts[s] for s in STATUSES if counts[s]}, "total": sum(counts.values()), "pass_rate": _rate(counts)}
        for name, counts in sorted(groups.items())
    }


def summarize(cases: list[dict[str, Any]]) -> dict[str, Any]:
    """Counts by status, suite and path; the ops criterion; the distinct failures (by fingerprint)."""
    by_status = Counter(c["status"] for c in cases)
    ops = [c for c in cases if c["suite"] == "ops"]
    baseline = sum(1 for c in ops if c["status"] == "skipped" and str(c.get("message", "")).startswith("baseline"))
    judged = [c for c in ops if c["status"] != "skipped"]
    passed = sum(1 for c in judged if c["status"] == "passed")
    failures: dict[str, dict[str, Any]] = {}
    for c in cases:
        if c["status"] in ("passed", "skipped"):
            continue
        f = failures.setdefault(
            c.get("fingerprint") or c["id"],
            {"fingerprint": c.get("fingerprint"), "status": c["status"], "op": c.get("op"), "count": 0, "example": c["id"], "message": c.get("message", "")},
        )
        f["count"] += 1
    return {
        "total": len(cases),
        "by_status": {s: by_status[s] for s in STATUSES if by_status[s]},
        "by_suite": _table(cases, "suite"),
        "by_path": _table([c for c in cases if c.get("path")], "path"),
        "ops_criterion": {
            "description": "ops cases whose CPU baseline meets the float64 reference, passed on flagos",
            "judged": len(judged),
            "passed": passed,
            "rate": round(passed / len(judged), 4) if judged else None,
            "baseline_skipped": baseline,
            "target": CRITERION,
            "met": (passed / len(judged) >= CRITERION) if judged else None,
        },
        "distinct_failures": len(failures),
        "failures": sorted(failures.values(), key=lambda f: (-f["count"], f["example"]))[:MAX_FAILURES],
    }


def build(collector: Collector, complete: bool, finished: str | None, extra_summary: dict[str, Any] | None = None) -> dict[str, Any]:
    """The record as a dict with exactly the loader's fields."""
    header = collector.header or {}
    cases = sorted(collector.cases.values(), key=lambda c: (c["suite"], c["id"]))
    summary = summarize(cases)
    summary.update(extra_summary or {})
    machine = dict(header.get("machine", {}))
    machine["selection"] = header.get("selection", {})
    if collector.sessions:
        machine["sessions"] = collector.sessions
    if collector.devices:
        machine["device"] = ", ".join(sorted(collector.devices))
    return {
        "format": RECORD_FORMAT,
        "platform": header.get("platform", ""),
        "descriptor_hash": header.get("descriptor_hash", ""),
        "torch": header.get("torch", ""),
        "torch_version": header.get("torch_version", ""),
        "kernel_libraries": header.get("kernel_libraries", {}),
        "started": header.get("started", now()),
        "finished": finished,
        "complete": complete,
        "machine": machine,
        "cases": cases,
        "summary": summary,
    }


def write(path: Path, record: dict[str, Any]) -> None:
    """Validate against the loader's model, then replace the file atomically."""
    Record.model_validate(record)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with open(tmp, "w") as f:
        f.write(dumps(record))
    os.replace(tmp, path)


def partial_path(record: Path) -> Path:
    """`torch-2.13.json` -> `torch-2.13.partial.json`: where a subset run writes its record when a
    complete one is there, which it must not replace (the gate reads `torch-<line>.json` only)."""
    return record.with_name(record.stem + ".partial.json")


def dumps(record: dict[str, Any]) -> str:
    """Indented JSON with one case per line: readable, and diffs of a re-run stay line-sized."""
    placeholder = "\u0000cases\u0000"
    text = json.dumps({**record, "cases": placeholder}, indent=1)
    lines = ",\n".join("  " + json.dumps(c, separators=(",", ":")) for c in record["cases"])
    return text.replace(json.dumps(placeholder), "[\n" + lines + "\n ]" if lines else "[]") + "\n"
