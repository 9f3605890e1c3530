"""--shard i/N and `conformance merge`: N shard runs together are the full run, merged into one record."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from conformance_helpers import cases_by_id, cli_command, conformance, run_env

from torch_fl.conformance.shards import Shard

SELECTION = "float32 and (add or mul or neg)"


def test_every_item_falls_in_exactly_one_shard() -> None:
    ids = [f"suites/ops.py::test_op[op{i}-float32]" for i in range(500)]
    for count in (1, 2, 3, 7):
        owners = [[i for i in range(1, count + 1) if Shard(i, count).holds(nodeid)] for nodeid in ids]
        assert all(len(o) == 1 for o in owners), count
        if count > 1:
            assert len({o[0] for o in owners}) == count  # no shard is empty


@pytest.mark.parametrize("spec", ["0/2", "3/2", "1/0", "2", "a/b", "1/2/3"])
def test_a_bad_shard_is_refused_with_the_expected_form(spec: str) -> None:
    with pytest.raises(ValueError, match="i/N"):
        Shard.parse(spec)


def _merge(records: Path) -> tuple[int, dict]:
    proc = subprocess.run(
        [*cli_command(), "conformance", "merge", "host_ref", "--record-dir", str(records), "--json"],
        env=run_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    return proc.returncode, json.loads(proc.stdout)


@pytest.mark.slow
def test_shards_merge_into_the_record_of_the_whole_run(tmp_path: Path) -> None:
    shards = tmp_path / "shards"
    base = ["host_ref", "--suite", "ops", "-k", SELECTION, "-n", "1"]
    first = conformance([*base, "--shard", "1/2", "--record-dir", str(shards)], run_env())
    assert first["complete"] and first["record"].endswith(".shard-1-of-2.json"), first
    assert [p.name for p in shards.glob("*.json")] == [Path(first["record"]).name], "only the shard's record"

    code, early = _merge(shards)
    assert code == 1 and not early["ok"] and "shard(s) [2] of 2" in early["error"], early

    second = conformance([*base, "--shard", "2/2", "--record-dir", str(shards)], run_env())
    assert second["complete"], second
    one, two = cases_by_id(Path(first["record"])), cases_by_id(Path(second["record"]))
    assert one and two and not set(one) & set(two), "a case ran in both shards"

    code, merged = _merge(shards)
    assert code == 0 and merged["ok"] and merged["shards"] == 2, merged
    record = json.loads(Path(merged["record"]).read_text())
    assert record["complete"] and record["machine"]["shards"] == 2
    assert len(record["machine"]["sessions"]) >= 2  # each shard's session, kept
    assert set(cases_by_id(Path(merged["record"]))) == set(one) | set(two)
    assert sorted(p.name for p in shards.iterdir() if ".shard-" in p.name) == []  # shards merged away

    whole = conformance([*base, "--record-dir", str(tmp_path / "whole")], run_env())
    assert set(cases_by_id(Path(whole["record"]))) == set(cases_by_id(Path(merged["record"])))
    assert record["gate"] == json.loads(Path(whole["record"]).read_text())["gate"]
