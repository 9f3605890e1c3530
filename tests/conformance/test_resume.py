"""--resume: a run killed midway continues from its journal, and the record has every case once.

The run is killed with SIGKILL (process group: the CLI, pytest and its worker), as a CI timeout or
a lost machine would; the resumed run must not repeat the journaled cases and must end with the
same cases as an uninterrupted run of the same selection.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
from conformance_helpers import cases_by_id, cli_command, conformance, run_env

pytestmark = pytest.mark.slow  # each test runs the conformance command in a subprocess

SELECTION = "float32 and (add or mul)"


def _journal(records: Path) -> Path | None:
    found = sorted(records.glob("*.journal.jsonl"))
    return found[0] if found else None


def _journaled_cases(journal: Path) -> dict[str, dict]:
    cases = {}
    for line in journal.read_text().splitlines():
        try:
            entry = json.loads(line)
        except json.JSONDecodeError:
            continue
        if entry.get("kind") == "case":
            cases[entry["id"]] = entry
    return cases


def test_killed_run_resumes_and_records_every_case_once(tmp_path: Path) -> None:
    records = tmp_path / "records"
    args = ["host_ref", "--suite", "ops", "-k", SELECTION, "-n", "1", "--record-dir", str(records)]
    proc = subprocess.Popen(
        [*cli_command(), "conformance", "run", *args, "--json"],
        env=run_env(),
        start_new_session=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 300
    before: dict[str, dict] = {}
    try:
        while time.monotonic() < deadline and proc.poll() is None:
            journal = _journal(records)
            if journal is not None:
                before = _journaled_cases(journal)
                if len(before) >= 5:
                    break
            time.sleep(0.05)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    assert len(before) >= 5, "the run finished or stalled before it could be interrupted"
    journal = _journal(records)
    assert journal is not None, "the journal of the interrupted run is gone"
    before = _journaled_cases(journal)
    record_file = journal.with_name(journal.name.replace(".journal.jsonl", ".json"))
    if record_file.exists():
        assert json.loads(record_file.read_text())["complete"] is False

    resumed = conformance([*args, "--resume"], run_env())
    assert resumed["ok"] and resumed["complete"], resumed
    after = cases_by_id(Path(resumed["record"]))  # asserts no id twice
    for case_id, entry in before.items():
        assert case_id in after, f"{case_id} was journaled before the kill but is missing"
        assert after[case_id]["duration_s"] == entry["duration_s"], f"{case_id} ran again after --resume"
    record = json.loads(Path(resumed["record"]).read_text())
    assert len(record["machine"].get("sessions", [])) >= 2, "the resumed session is not recorded"
    assert not _journal(records), "a complete run leaves no journal behind"

    fresh = conformance(
        ["host_ref", "--suite", "ops", "-k", SELECTION, "-n", "1", "--record-dir", str(tmp_path / "fresh")], run_env()
    )
    assert set(cases_by_id(Path(fresh["record"]))) == set(after), "the resumed run differs from an uninterrupted one"
