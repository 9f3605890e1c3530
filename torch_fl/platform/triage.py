"""Triage of a conformance record: what kind of failure each is, deduplicated, and what changed.

Reads record files and their evidence (torch_fl.platform.record); never imports the conformance runner.
A failure is one of:
  crash            the case crashed its worker or timed out (status crashed/timeout);
  missing-feature  a device feature is absent: autocast, generators, streams, distributed, compile,
                   profiler... (an AttributeError/NotImplementedError naming one, or such a suite);
  unsupported-op   no kernel for the op (NotImplementedError, "could not run", missing kernel);
  precision        the result differs beyond tolerance (mismatch / allclose / tolerance);
  other            anything else (read the message).
Cases with the same fingerprint are one problem: they are grouped, so ten dtypes failing the same
way count once. Against an older record (or an older triage report) it lists new failures, fixed
cases and those still failing, so a fix can be shown to fix and to break nothing. Where one limit
on a named extent would put a group's failures outside what the kernel serves, the group carries it
(torch_fl.platform.proposal).
"""

from __future__ import annotations

import hashlib
import re
import shlex
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from torch_fl.fileio import RefusedFile, load_json
from torch_fl.platform.errors import RecordError
from torch_fl.platform.proposal import proposals
from torch_fl.platform.record import (
    FAILING,
    MAX_RECORD_BYTES,
    PYTORCH_PATHS,
    Case,
    Record,
    installed_version,
    load_evidence,
    load_record_file,
    record_lines,
    record_path,
)
from torch_fl.platform.versions import minor_line

SCRATCH_DIR = ".conformance-runs"
"""Where re-runs of single cases write their records, below the working directory."""
CATEGORIES = ("unsupported-op", "precision", "crash", "missing-feature", "other")

HINTS = {
    "unsupported-op": "no kernel serves the op on this path: add one (torch-fl kernel add NAME --op OP) or leave the op on native",
    "precision": "results differ beyond tolerance: check the kernel's accumulation dtype and reduction order against the CPU float64 reference",
    "crash": "the case killed its worker or hung: run it alone (the group's rerun command) and fix the kernel before anything else",
    "missing-feature": "a device feature is not provided: implement it in the runtime or drop the claim from capabilities in platform.yaml",
    "other": "read the message: it fits no known kind",
}
NOT_OWNED_HINT = (
    "PyTorch's own kernel fails here (path native or cpu), not one the platform brings: nothing to fix in the "
    "platform, and not counted in summary.failing_owned"
)

_FEATURE_WORDS = re.compile(
    r"autocast|\bamp\b|gradscaler|generator|manual_seed|rng_state|\bstream|\bevent|distributed|process.?group|"
    r"\bddp\b|fsdp|\bnccl|\bgloo|\bc10d|torch\.compile|inductor|dynamo|profiler|kineto|pin_memory|pinned",
    re.IGNORECASE,
)
_FEATURE_SUITES = frozenset(
    {
        "amp",
        "rng",
        "streams",
        "events",
        "ddp",
        "fsdp",
        "fsdp2",
        "distributed",
        "compile",
        "profiler",
        "sharing",
        "memory",
    }
)
_ABSENT = re.compile(
    r"AttributeError|NotImplemented|not supported|unsupported|has no attribute|not available|not implemented",
    re.IGNORECASE,
)
_UNSUPPORTED = re.compile(
    r"NotImplementedError|could not run|not implemented for|no kernel|missing kernel|does not implement|"
    r"is not implemented|unsupported (op|operator|dtype)|lacks",
    re.IGNORECASE,
)
_PRECISION = re.compile(
    r"tolerance|mismatch|allclose|not close|greatest (absolute|relative) difference|assert_close|elements differ|\brtol\b",
    re.IGNORECASE,
)


def classify(case: Case) -> str:
    """The failure kind of a failing case (see the module docstring for the rules, in order)."""
    if case.status in ("crashed", "timeout"):
        return "crash"
    message = case.message or ""
    feature_suite = case.suite.lower() in _FEATURE_SUITES
    if _ABSENT.search(message) and (_FEATURE_WORDS.search(message) or (feature_suite and case.op is None)):
        return "missing-feature"
    if _UNSUPPORTED.search(message):
        return "unsupported-op"
    if _PRECISION.search(message):
        return "precision"
    if feature_suite and _ABSENT.search(message):
        return "missing-feature"
    return "other"


def fingerprint(case: Case) -> str:
    """The runner's fingerprint, else one made from the message with numbers and addresses blanked."""
    if case.fingerprint:
        return case.fingerprint
    first = (
        (case.message or case.status).strip().splitlines()[0] if (case.message or case.status).strip() else case.status
    )
    normal = re.sub(r"0x[0-9a-fA-F]+|\d+(\.\d+)?(e[-+]?\d+)?", "N", first)
    return "msg:" + hashlib.sha256(f"{case.suite}|{case.path}|{normal}".encode()).hexdigest()[:16]


def rerun_command(case: Case, platform: str) -> str:
    """The `torch-fl conformance run` that repeats just this case's item (ids: <suite>/<op>/<dtype>/<path>...).

    Its record goes to a scratch folder: a partial run must not replace the platform's full record.
    The folder is absolute (below the working directory) and every word shell-quoted, so the command
    works as printed from anywhere.
    """
    parts = case.id.split("/")
    scratch = Path(SCRATCH_DIR, f"rerun-{platform}").resolve()
    words = ["torch-fl", "conformance", "run", platform, "--suite", case.suite, "--record-dir", str(scratch)]
    if case.suite in ("ops", "sweep") and len(parts) >= 3:
        # the pytest item is test_op[<opinfo>-<dtype>] or test_sweep[<aten overload>-<dtype>]
        words += ["-k", f"{parts[1]}-{parts[2]}"]
    if case.path:
        words += ["--paths", case.path if case.path == "native" else f"native,{case.path}"]
    return shlex.join(words + ["--json"])


@dataclass
class Group:
    """Failing cases that share one fingerprint: one problem."""

    fingerprint: str
    category: str
    cases: list[Case] = field(default_factory=list)

    @property
    def owned(self) -> bool:
        """Whether the group is the platform's to fix: a case of it ran off PyTorch's own kernels."""
        return any(c.path not in PYTORCH_PATHS for c in self.cases)

    def as_dict(self, platform: str) -> dict[str, Any]:
        first = self.cases[0]
        return {
            "fingerprint": self.fingerprint,
            "category": self.category,
            "count": len(self.cases),
            "ops": sorted({c.op for c in self.cases if c.op}),
            "dtypes": sorted({c.dtype for c in self.cases if c.dtype}),
            "paths": sorted({c.path for c in self.cases if c.path}),
            "suites": sorted({c.suite for c in self.cases}),
            "statuses": dict(sorted(Counter(c.status for c in self.cases).items())),
            "message": (first.message or "")[:500],
            "example": first.id,
            "case_ids": [c.id for c in self.cases],
            "rerun": rerun_command(first, platform),
            "owned": self.owned,
            "hint": HINTS[self.category] if self.owned else NOT_OWNED_HINT,
        }


def group_failures(cases: list[Case]) -> list[Group]:
    """Failing cases grouped by fingerprint, largest group first (ties by fingerprint, for stable output)."""
    groups: dict[str, Group] = {}
    for case in cases:
        if case.status not in FAILING:
            continue
        key = fingerprint(case)
        if key not in groups:
            groups[key] = Group(key, classify(case))
        groups[key].cases.append(case)
    return sorted(groups.values(), key=lambda g: (-len(g.cases), g.fingerprint))


@dataclass(frozen=True)
class Baseline:
    """What an older run said: the status of each case id, and the failing fingerprints."""

    source: str
    statuses: dict[str, str]
    fingerprints: frozenset[str]


def read_record(path: Path) -> tuple[Record, list[Case]]:
    """A record and every case of its run (its evidence)."""
    return load_record_file(Path(path)), load_evidence(Path(path))


def default_record(directory: Path) -> Path:
    """The record for the installed torch line, else the newest one the platform has."""
    torch_version = installed_version("torch")
    if torch_version is not None and record_path(directory, minor_line(torch_version)).is_file():
        return record_path(directory, minor_line(torch_version))
    lines = record_lines(directory)
    if not lines:
        raise RecordError(
            f"{directory} has no conformance record yet; make one with torch-fl conformance run {Path(directory).name}"
        )
    return record_path(directory, lines[0])


def read_baseline(path: Path) -> Baseline:
    """An older record, or an older `torch-fl triage --json` report (what an agent saves before a fix)."""
    try:
        data = load_json(Path(path), MAX_RECORD_BYTES)
    except RefusedFile as exc:
        raise RecordError(f"cannot read the baseline: {exc}") from None
    if isinstance(data, dict) and data.get("kind") == "triage":
        groups = data.get("groups", [])
        statuses = {cid: "passed" for cid in data.get("passed_ids", [])}
        statuses.update({cid: "failed" for g in groups for cid in g.get("case_ids", [])})
        return Baseline(str(path), statuses, frozenset(g["fingerprint"] for g in groups))
    cases = load_evidence(path)
    failing = frozenset(fingerprint(c) for c in cases if c.status in FAILING)
    return Baseline(str(path), {c.id: c.status for c in cases}, failing)


def compare(cases: list[Case], baseline: Baseline) -> dict[str, Any]:
    now = {c.id: c.status for c in cases}
    failing_now = {cid for cid, s in now.items() if s in FAILING}
    failing_before = {cid for cid, s in baseline.statuses.items() if s in FAILING}
    fingerprints_now = {fingerprint(c) for c in cases if c.status in FAILING}
    return {
        "against": baseline.source,
        "new_failures": sorted(failing_now - failing_before),
        "fixed": sorted(cid for cid in failing_before - failing_now if now.get(cid) == "passed"),
        "still_failing": sorted(failing_now & failing_before),
        "not_run_now": sorted(cid for cid in failing_before if cid not in now),
        "new_fingerprints": sorted(fingerprints_now - baseline.fingerprints),
        "gone_fingerprints": sorted(baseline.fingerprints - fingerprints_now),
    }


def triage(record: Record, cases: list[Case], source: str, baseline: Baseline | None = None) -> dict[str, Any]:
    """The triage report of `record` and its `cases` (read from `source`), compared with `baseline` when given."""
    groups = group_failures(cases)
    statuses = Counter(c.status for c in cases)
    by_category = {name: 0 for name in CATEGORIES}
    for group in groups:
        by_category[group.category] += len(group.cases)
    failing = sum(len(g.cases) for g in groups)
    by_path = Counter(c.path or "none" for g in groups for c in g.cases)
    report: dict[str, Any] = {
        "ok": failing == 0,
        "kind": "triage",
        "platform": record.platform,
        "record": source,
        "torch": record.torch,
        "complete": record.complete,
        "summary": {
            "cases": len(cases),
            "passed": statuses.get("passed", 0),
            "skipped": statuses.get("skipped", 0),
            "failing": failing,
            # failing cases per path ("none": device features), and those the platform owns (all but
            # PyTorch's own kernels): what exit criteria count
            "failing_by_path": dict(sorted(by_path.items())),
            "failing_owned": sum(n for path, n in by_path.items() if path not in PYTORCH_PATHS),
            "groups": len(groups),
            "by_status": dict(sorted(statuses.items())),
            "by_category": by_category,
        },
        # each group with the declared limits that would exclude it, for the vendor to accept or not
        "groups": [{**g.as_dict(record.platform), "constraints": proposals(g.cases, cases)} for g in groups],
        # Kept so this report can itself be the baseline of a later triage (--against).
        "passed_ids": sorted(c.id for c in cases if c.status == "passed"),
    }
    if baseline is not None:
        report["comparison"] = compare(cases, baseline)
    return report
