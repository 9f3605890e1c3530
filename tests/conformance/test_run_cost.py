"""What a run spends (the record's `cost`), untimed autotuning in workers, and which call a crash is charged to."""

from __future__ import annotations

import json
import sys
import types
from pathlib import Path
from typing import Any

import pytest

from torch_fl.conformance import recordfile
from torch_fl.conformance.cost import cost
from torch_fl.conformance.recorder import Recorder, inflight_path


def _case(case_id: str, suite: str, path: str | None, op: str | None, seconds: float, item: str) -> dict[str, Any]:
    return {"id": case_id, "suite": suite, "path": path, "op": op, "duration_s": seconds, "item": item}


def test_cost_adds_case_time_by_suite_path_and_op_and_what_items_spent_outside() -> None:
    cases = [
        _case("a", "ops", "flaggems", "aten::mm", 2.0, "i1"),
        _case("b", "ops", "native", "aten::mm", 0.5, "i1"),
        _case("c", "sweep", "flaggems", "aten::add.Tensor", 1.0, "i2"),
        _case("d", "rng", None, None, 0.25, "i3"),
    ]
    out = cost(cases, {"i1": 3.0, "i2": 1.0, "i3": 0.25}, wall_s=2.5, workers=4)
    assert out["case_s"] == 3.8  # 3.75, rounded
    assert out["by_suite_s"] == {"ops": 2.5, "sweep": 1.0, "rng": 0.2}
    assert out["by_path_s"]["flaggems"] == 3.0
    assert out["mean_case_s_by_path"]["flaggems"] == 1.5
    assert list(out["top_ops_s"]) == ["aten::mm on flaggems", "aten::add.Tensor on flaggems", "aten::mm on native"]
    assert out["items_outside_cases_s"] == 0.5  # item i1 took 3.0 s, its cases 2.5 s
    assert out["worker_s"] == 10.0 and out["idle_or_starting_s"] == 5.8


def test_record_of_a_journal_with_item_times_carries_its_cost(tmp_path: Path) -> None:
    collector = recordfile.Collector()
    header = {
        "kind": "run",
        "platform": "p",
        "binding": {"descriptor_hash": "h", "torch": "2.13", "torch_version": "2.13.0"},
    }
    case = {"kind": "case", "id": "ops/x", "suite": "ops", "op": "aten::mm", "path": "native", "status": "passed"}
    collector.feed(
        [
            header,
            {**case, "duration_s": 1.5, "item": "t.py::x", "worker": "gw0", "t": 1.0},
            {"kind": "item", "item": "t.py::x", "worker": "gw0", "t": 1.0, "s": 2.0},
            {"kind": "session", "wall_s": 4.0, "workers": 2},
        ]
    )
    record, cases = recordfile.build(collector, True, recordfile.now())
    assert record["summary"]["cost"]["items_outside_cases_s"] == 0.5
    assert record["summary"]["cost"]["worker_s"] == 8.0
    assert all("worker" not in c and "t" not in c for c in cases)  # the evidence keeps the record's fields


class _FakeAutotuner:
    """The part of triton.runtime.autotuner.Autotuner that untimed autotuning relies on."""

    def __init__(self, configs: list[str], broken: set[str]) -> None:
        self.configs, self.broken, self.ran, self.nargs = configs, broken, [], None

    def do_bench(self, kernel_call: Any, quantiles: Any = None) -> list[float]:
        raise AssertionError("timed benchmarking must not run")

    def _bench(self, *args: Any, config: str, **meta: Any) -> list[float]:
        def kernel_call() -> None:
            self.ran.append(config)
            if config in self.broken:
                raise RuntimeError("out of resources")

        try:
            return list(self.do_bench(kernel_call, quantiles=(0.5, 0.2, 0.8)))
        except RuntimeError:
            return [float("inf")] * 3

    def run(self) -> str:
        self.nargs = {"x": object()}  # a new pass: triton sets nargs at the start of each run
        timings = {c: self._bench(config=c) for c in self.configs}
        return min(timings, key=lambda c: timings[c])


def test_untimed_autotuning_takes_the_first_configuration_that_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    from torch_fl.kernels.flaggems import untimed_autotuning

    autotuner_module = types.ModuleType("triton.runtime.autotuner")
    fake = type("Autotuner", (_FakeAutotuner,), {})
    autotuner_module.Autotuner = fake  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "triton", types.ModuleType("triton"))
    monkeypatch.setitem(sys.modules, "triton.runtime", types.ModuleType("triton.runtime"))
    monkeypatch.setitem(sys.modules, "triton.runtime.autotuner", autotuner_module)
    untimed_autotuning()
    untimed_autotuning()  # idempotent: the patch does not wrap itself

    tuner = fake(["big", "mid", "small"], broken={"big"})
    assert tuner.run() == "mid"
    assert tuner.ran == ["big", "mid"]  # "small" was never compiled or run, nothing was timed
    assert tuner.run() == "mid" and tuner.ran == ["big", "mid", "big", "mid"]  # each pass chooses anew


def test_a_crash_is_charged_to_the_key_of_the_call_in_flight(tmp_path: Path) -> None:
    journal_file = tmp_path / "j.jsonl"
    journal_file.write_text(json.dumps({"kind": "run"}) + "\n")
    recorder = Recorder(journal_file, tmp_path / "run", "gw0", 60.0, 600.0, 60.0)
    from torch_fl.conformance.recorder import CaseInfo

    recorder.begin_item("t.py::x", CaseInfo("item", "ops"))
    marker = inflight_path(tmp_path / "run", "gw0")
    with recorder.case("ops/x", "ops", op="aten::mm", path="flaggems"):
        recorder.note_key("aten::mm", "float32,float32@tiny", {})
        recorder.note_key("aten::mm", "float32,float32@large", {})
        recorder.note_key("aten::mm", "float32,float32@tiny", {})  # seen before, but it is the call running now
        assert json.loads(marker.read_text())["case"]["keys"] == ["float32,float32@tiny"]
    recorder.end_item(True)
    entries = [json.loads(line) for line in journal_file.read_text().splitlines()[1:]]
    assert entries[0]["worker"] == "gw0" and entries[0]["t"] > 0
    assert entries[-1]["kind"] == "item" and entries[-1]["s"] >= 0


def test_progress_under_json_is_count_lines_on_stderr(capsys: pytest.CaptureFixture[str]) -> None:
    from collections import Counter

    from torch_fl.conformance.progress import Progress

    progress = Progress("host_ref", plain=True)
    progress.start(3)
    progress.update(1, Counter(passed=5, failed=1))
    progress.close()
    err = capsys.readouterr()
    assert err.out == ""  # stdout is the --json document's
    lines = err.err.strip().splitlines()
    assert lines[0] == "conformance host_ref: 0/3 items; cases: 0 passed"
    assert lines[-1] == "conformance host_ref: 1/3 items; cases: 5 passed, 1 failed"
