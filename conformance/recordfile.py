"""The record writer: journal entries in; the record the loader reads, and its evidence, out.

The record has exactly the fields of `torch_fl.platform.record.Record` and is validated against
that model before it replaces the old file, so what the loader reads is always what it accepts.
Every case goes to the evidence file beside it, which is written first: a record never names
evidence that is not there. A case id seen twice (a re-run after a crash, a resumed run) keeps
its last entry.
"""

from __future__ import annotations

import datetime
import gzip
import hashlib
import json
from collections import Counter
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from torch_fl.conformance.cost import cost
from torch_fl.conformance.zoo_calls import coverage
from torch_fl.conformance.zoo_calls import load as load_captured
from torch_fl.fileio import write_atomically
from torch_fl.platform.record import (
    FAILING,
    RECORD_FORMAT,
    Binding,
    Record,
    case_counts,
    checksum,
    evidence_path,
    gate_verdicts,
    load_evidence,
    load_raw,
    outside_constraints,
    proven_limits,
)

CASE_FIELDS = (
    "id", "suite", "op", "dtype", "path", "keys", "extents", "status", "message", "fingerprint", "duration_s", "item"
)  # fmt: skip
STATUSES = ("passed", "failed", "error", "crashed", "timeout", "unjudged", "skipped")
MAX_FAILURES = 300
CRITERION = 0.95
"""The issue's bar: of the op x dtype cases the CPU itself passes, this share must pass on flagos."""


def identity(descriptor: Any) -> dict[str, Any]:
    """What a record must share with this machine and checkout to stand for them: the platform,
    and the binding (descriptor, torch release, kernel libraries, platform sources)."""
    from torch_fl.platform.record import expected_binding, installed_kernel_versions, installed_version

    binding = expected_binding(
        descriptor, descriptor.directory, installed_version("torch") or "0", installed_kernel_versions(descriptor)
    )
    return {"platform": descriptor.name, "binding": binding.model_dump()}


_CASE_DEFAULTS: dict[str, Any] = {"keys": [], "extents": {}, "message": "", "duration_s": 0.0}


def _case_fields(entry: dict[str, Any]) -> dict[str, Any]:
    """A journal entry's record fields, absent ones at the record's defaults."""
    return {k: entry[k] if entry.get(k) is not None else _CASE_DEFAULTS.get(k) for k in CASE_FIELDS}


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
        self.item_seconds: dict[str, float] = {}
        self.case_items: dict[str, str] = {}  # case id -> its item (for the run's cost)
        self.imported: dict[str, set[str]] = {}  # vendor source -> the hashes workers imported of it

    def seed(self, record_file: Path, replaced: Callable[[dict[str, Any]], bool] | None = None) -> None:
        """Start from a record's cases (`--add`), less those `replaced` says this run re-runs (so a
        verdict it no longer reaches does not linger); the run's own header and cases follow."""
        for case in load_evidence(record_file):
            data = case.model_dump()
            if replaced is None or not replaced(data):
                self.cases[case.id] = data
        record = load_raw(Path(record_file))
        for session in record.get("machine", {}).get("sessions", []):
            self.sessions.append(session)

    def feed(self, entries: Iterable[dict[str, Any]]) -> int:
        """Take entries; returns how many were cases."""
        n = 0
        for entry in entries:
            kind = entry.get("kind")
            if kind == "case":
                self.cases[entry["id"]] = _case_fields(entry)
                if entry.get("item"):
                    self.case_items[entry["id"]] = entry["item"]
                n += 1
            elif kind == "item":
                self.items_done.add(entry["item"])
                if entry.get("s") is not None:
                    self.item_seconds[entry["item"]] = self.item_seconds.get(entry["item"], 0.0) + float(entry["s"])
            elif kind == "run":
                self.header = entry
            elif kind == "session":
                self.sessions.append(entry)
            elif kind == "worker" and entry.get("device"):
                self.devices.add(str(entry["device"]))
            elif kind == "imported":
                for source, digest in (entry.get("sources") or {}).items():
                    self.imported.setdefault(str(source), set()).add(str(digest))
        return n

    def changed_sources(self) -> list[str]:
        """The vendor sources the workers imported other than the run binds (edited during the run):
        its cases tested code its record would not name."""
        bound = ((self.header or {}).get("binding") or {}).get("sources") or {}
        return [
            f"{source} changed during the run: the workers imported {', '.join(sorted(digests))}, "
            f"the run binds {bound.get(source, 'no such source')}"
            for source, digests in sorted(self.imported.items())
            if digests != {bound.get(source)}
        ]


def _rate(counts: Counter[str]) -> float | None:
    judged = sum(counts.values()) - counts["skipped"]
    return round(counts["passed"] / judged, 4) if judged else None


def _table(cases: Iterable[dict[str, Any]], key: str) -> dict[str, dict[str, Any]]:
    groups: dict[str, Counter[str]] = {}
    for case in cases:
        name = case.get(key) or "-"
        groups.setdefault(name, Counter())[case["status"]] += 1
    return {
        name: {
            **{s: counts[s] for s in STATUSES if counts[s]},
            "total": sum(counts.values()),
            "pass_rate": _rate(counts),
        }
        for name, counts in sorted(groups.items())
    }


def summarize(cases: list[dict[str, Any]]) -> dict[str, Any]:
    """Counts by status, suite and path; the ops criterion; the distinct failures (by fingerprint)."""
    by_status = Counter(c["status"] for c in cases)
    ops = [c for c in cases if c["suite"] == "ops"]
    unjudged = sum(1 for c in ops if c["status"] == "unjudged")
    judged = [c for c in ops if c["status"] not in ("skipped", "unjudged")]
    passed = sum(1 for c in judged if c["status"] == "passed")
    failures: dict[str, dict[str, Any]] = {}
    for c in cases:
        if c["status"] in ("passed", "skipped", "unjudged"):
            continue
        f = failures.setdefault(
            c.get("fingerprint") or c["id"],
            {
                "fingerprint": c.get("fingerprint"),
                "status": c["status"],
                "op": c.get("op"),
                "count": 0,
                "example": c["id"],
                "message": c.get("message", ""),
            },
        )
        f["count"] += 1
    return {
        "total": len(cases),
        "by_status": {s: by_status[s] for s in STATUSES if by_status[s]},
        "by_suite": _table(cases, "suite"),
        "by_path": _table([c for c in cases if c.get("path")], "path"),
        "ops_criterion": {
            "description": "ops cases whose every part could be compared (the CPU baseline meets the float64 "
            "reference), passed on flagos",
            "judged": len(judged),
            "passed": passed,
            "rate": round(passed / len(judged), 4) if judged else None,
            "unjudged": unjudged,
            "target": CRITERION,
            "met": (passed / len(judged) >= CRITERION) if judged else None,
        },
        "distinct_failures": len(failures),
        # ops a gated path implements that the sweep suite has no generator for (only OpInfo proves them)
        "not_swept": sorted(
            f"{c.get('op')} on {c.get('path')}: {c.get('message', '')}"
            for c in cases
            if c["suite"] == "sweep" and c["id"].endswith("/not-swept")
        ),
        "failure_groups": sorted(failures.values(), key=lambda f: (-f["count"], f["example"]))[:MAX_FAILURES],
    }


def build(
    collector: Collector, complete: bool, finished: str | None, extra_summary: dict[str, Any] | None = None
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The record as a dict with exactly the loader's fields, and every case (its evidence)."""
    header = collector.header or {}
    cases = sorted(collector.cases.values(), key=lambda c: (c["suite"], c["id"]))
    constraints = header.get("constraints") or {}
    for case in cases:
        if case["status"] in FAILING and outside_constraints(case, constraints):
            case["outside_constraints"] = True
    summary = summarize(cases)
    summary.update(extra_summary or {})
    if collector.item_seconds:
        wall = sum(float(s.get("wall_s", 0.0)) for s in collector.sessions)
        workers = max((int(s.get("workers") or 0) for s in collector.sessions), default=0)
        with_items = ({**c, "item": collector.case_items.get(c["id"])} for c in cases)
        summary["cost"] = cost(with_items, collector.item_seconds, wall, workers)
    if any(c["suite"] == "captured" for c in cases):
        summary["captured_coverage"] = coverage(cases, load_captured()["calls"])
    machine = dict(header.get("machine", {}))
    machine["selection"] = header.get("selection", {})
    if collector.sessions:
        machine["sessions"] = collector.sessions
    if collector.devices:
        machine["device"] = ", ".join(sorted(collector.devices))
    record = {
        "format": RECORD_FORMAT,
        "platform": header.get("platform", ""),
        "binding": Binding.model_validate(header.get("binding") or {}).model_dump(),
        "started": header.get("started", now()),
        "finished": finished,
        "complete": complete,
        "machine": machine,
        "gate": gate_verdicts(cases),
        "limits": proven_limits(cases),
        # the item only serves a re-run (the evidence has it): the record the gate reads stays small
        "failures": [
            {k: v for k, v in c.items() if k != "item"}
            for c in cases
            if c["status"] not in ("passed", "skipped", "unjudged")
        ],
        "counts": case_counts(cases),
        "summary": summary,
        "sources_decide": header.get("sources_decide", {}),
    }
    return record, cases


def write_cases(
    path: Path, header: dict[str, Any], cases: Iterable[dict[str, Any]], complete: bool = True
) -> dict[str, Any]:
    """Write the record of a run whose header and cases are given (tools and tests that make records
    without running the suites); returns the record as written."""
    collector = Collector()
    collector.feed([{**header, "kind": "run"}, *({**c, "kind": "case"} for c in cases)])
    record, all_cases = build(collector, complete, now() if complete else None)
    write(path, record, all_cases)
    return json.loads(Path(path).read_text())


def write(path: Path, record: dict[str, Any], cases: list[dict[str, Any]]) -> dict[str, Any]:
    """Write the evidence, then the record naming it (checksummed, validated), each atomically;
    returns the record as written."""
    evidence = gzip.compress("".join(json.dumps(c, separators=(",", ":")) + "\n" for c in cases).encode(), mtime=0)
    evidence_file = evidence_path(path)
    write_atomically(evidence_file, evidence)
    record = {
        **record,
        "evidence": {
            "file": evidence_file.name,
            "sha256": "sha256:" + hashlib.sha256(evidence).hexdigest(),
            "cases": len(cases),
        },
    }
    record["checksum"] = checksum(record)
    Record.model_validate(record)
    write_atomically(path, json.dumps(record, indent=1) + "\n")
    return record


def partial_path(record: Path) -> Path:
    """`torch-2.13.json` -> `torch-2.13.partial.json`: where a subset run writes its record when a
    complete one is there, which it must not replace (the gate reads `torch-<line>.json` only)."""
    return record.with_name(record.stem + ".partial.json")
