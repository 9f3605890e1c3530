"""--add: a short run adds its cases to a complete record, and leaves an unfit one alone."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conformance_helpers import cases_by_id, conformance, run_env

pytestmark = pytest.mark.slow  # each test runs the conformance command in a subprocess


def test_add_keeps_the_record_and_adds_the_suite(tmp_path: Path) -> None:
    records = ["--record-dir", str(tmp_path)]
    # with no record, --add starts it from this subset (a plain subset run would write a partial one)
    first = conformance(["host_ref", "--suite", "rng", "-n", "1", "--add", *records], run_env())
    assert first["complete"] and not first["partial"], first
    record_file = Path(first["record"])
    before = cases_by_id(record_file)
    added = conformance(["host_ref", "--suite", "workload", "-n", "1", "--add", *records], run_env())
    assert added["ok"] and added["complete"], added
    after = cases_by_id(record_file)
    assert {i: c["status"] for i, c in before.items()} == {i: after[i]["status"] for i in before}
    workload = [i for i in after if i.startswith("workload/")]
    assert workload and len(after) == len(before) + len(workload)
    record = json.loads(record_file.read_text())
    assert record["complete"] and set(record["summary"]["by_suite"]) == {"rng", "workload"}
    assert record["machine"]["selection"]["suites"] == ["workload"]
    base = record["machine"]["added_to"]
    assert base["machine"]["selection"]["suites"] == ["rng"] and base["started"] < record["started"]
    summary = record_file.with_suffix(".md").read_text()
    assert "- added to the run started" in summary and "  - selection: suites rng;" in summary


def test_add_needs_a_complete_record_made_here(tmp_path: Path) -> None:
    first = conformance(["host_ref", "--suite", "rng", "-n", "1", "--add", "--record-dir", str(tmp_path)], run_env())
    record_file = Path(first["record"])
    record = json.loads(record_file.read_text())
    record["binding"]["descriptor_hash"] = "sha256:other"
    record_file.write_text(json.dumps(record))
    other = conformance(["host_ref", "--suite", "workload", "--add", "--record-dir", str(tmp_path)], run_env())
    assert not other["ok"] and "descriptor changed" in other["error"]
    assert json.loads(record_file.read_text()) == record  # left as it was
