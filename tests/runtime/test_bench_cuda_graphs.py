"""bench/cuda_graphs.py's host-side logic: its cases' code on the CPU (eager), the summary and the
verdict from given numbers, and the deadline that kills a hung side. The timed run is the board's."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"


@pytest.fixture(scope="module")
def bench(load_bench: Callable[[str], ModuleType]) -> ModuleType:
    return load_bench("cuda_graphs")


def test_cases_run_their_code_on_the_cpu(bench: ModuleType) -> None:
    pytest.importorskip("transformers")
    side = bench.GraphSide("plain", compiled=False, device="cpu")
    dims = {"width": 32, "layers": 2, "batch": 4, "hidden": 64, "lm_layers": 1, "prompt": 5, "new_tokens": 3}
    mlp = side.build("mlp", dims)
    assert mlp["work"] == 1 and len(mlp["check"]) == 64 and mlp["recorded"] == 0 and mlp["skips"] == 0
    assert side.round(2)["wall_s"] > 0
    decode = side.build("decode", dims)
    assert decode["work"] == 3 and len(decode["check"]) == 3  # exactly new_tokens tokens, batch 1
    assert bench.agree("decode", decode["check"], side.build("decode", dims)["check"])  # greedy: repeatable


def _built(recorded: int = 2, skips: int = 0, check: list | None = None) -> list[dict]:
    """One process's build reply, as a side of one process."""
    return [{"work": 32, "recorded": recorded, "skips": skips, "check": check or [1.0, 2.0]}]


def test_summary_ratios_and_verdicts(bench: ModuleType) -> None:
    rounds = {"plain": [[1.0, 1.1, 0.9, 1.0]], "flagos": [[2.0, 2.2, 1.8, 2.0]]}
    mlp = bench.summarize("mlp", {"plain": _built(), "flagos": _built()}, rounds, runs=100)
    assert mlp["ok"] and mlp["ratio"] == 2.0 and mlp["interval"] == (2.0, 2.0)
    assert mlp["sides"]["plain"]["value"] == pytest.approx(1e4)  # 1 s over 100 calls: 10,000 us/call
    decode = bench.summarize("decode", {"plain": _built(), "flagos": _built()}, rounds, runs=2)
    assert decode["ratio"] == 0.5 and decode["sides"]["plain"]["value"] == pytest.approx(64.0)  # tokens/s
    failed = bench.summarize(
        "decode", {"plain": _built(), "flagos": _built(recorded=0, skips=1, check=[1, 3])}, rounds, runs=2
    )
    assert not failed["ok"]
    assert failed["problems"] == [
        "flagos: no CUDA graph recorded",
        "flagos: 1 cudagraph skips",
        "outputs differ between plain and flagos",
    ]
    recorded = _built()[0]["recorded"]
    both = {side: [{**_built()[0], "recorded_after_rounds": recorded + 1}] for side in ("plain", "flagos")}
    assert bench.summarize("decode", both, rounds, runs=2)["ok"]  # one more on each side: a new cache's addresses
    rerecorded = bench.summarize(
        "decode",
        {"plain": _built(), "flagos": [{**_built()[0], "recorded_after_rounds": recorded + 5}]},
        rounds,
        runs=2,
    )
    assert rerecorded["problems"] == ["flagos: 5 graphs recorded during the timed rounds (plain: 0)"]
    text = bench.report({"gpu": "H200", "torch": "2.11"}, [mlp, failed, {"case": "decode", "error": "boom"}])
    assert "FAILED: flagos: no CUDA graph recorded" in text and "FAILED: boom" in text


def test_summary_over_several_processes_per_side(bench: ModuleType) -> None:
    # Two processes per side: the values pool every round, the interval resamples the processes,
    # and every process must have recorded graphs and computed plain's tokens.
    rounds = {"plain": [[1.0, 1.0, 1.0], [1.2, 1.2, 1.2]], "flagos": [[2.0, 2.0, 2.0], [2.0, 2.0, 2.0]]}
    two = {"plain": _built() * 2, "flagos": _built() * 2}
    summary = bench.summarize("mlp", two, rounds, runs=1)
    assert summary["ok"] and summary["sides"]["plain"]["processes"] == 2
    assert summary["ratio"] == round(2.0 / 1.1, 4)  # medians over both processes' rounds
    low, high = summary["interval"]
    assert (low, high) == (round(2.0 / 1.2, 4), 2.0)  # a draw may take one process twice
    odd = bench.summarize(
        "decode", {"plain": _built() * 2, "flagos": _built() + _built(recorded=0, check=[9])}, rounds, runs=1
    )
    assert odd["problems"] == ["flagos: no CUDA graph recorded", "outputs differ between plain and flagos"]


def test_graph_calls_are_timed_whole_and_inside_the_tree_manager(bench: ModuleType) -> None:
    timer = bench.GraphCallTimer()  # not installed: its wrapper alone
    slow = timer.timed(lambda x: time.sleep(0.002) or x + 1, "outer")
    fast = timer.timed(lambda x: x * 2, "inner")
    assert slow(1) == 2 and slow(2) == 3 and fast(3) == 6
    taken = timer.take()
    assert taken["outer"] >= 2000 and 0 <= taken["inner"] < taken["outer"]  # us per call
    assert timer.take() == {"outer": None, "inner": None}  # each take starts over
    rounds = {"plain": [[1.0, 1.0, 1.0]], "flagos": [[1.2, 1.2, 1.2]]}
    calls = {
        "plain": [{"outer": 100.0, "inner": 98.0}] * 3,
        "flagos": [{"outer": 130.0, "inner": 99.0}, {"outer": 120.0, "inner": 97.0}, {}],
    }
    summary = bench.summarize("decode", {"plain": _built(), "flagos": _built()}, rounds, runs=2, calls=calls)
    assert summary["sides"]["flagos"]["graph_call_us"] == {"outer": 125.0, "inner": 98.0}  # rounds with calls
    assert "plain 100.00 (98.00), flagos 125.00 (98.00)" in bench.report({}, [summary])


def test_mlp_outputs_agree_within_bf16_tolerance(bench: ModuleType) -> None:
    assert bench.agree("mlp", [1.0, -4.0], [1.05, -4.0])
    assert not bench.agree("mlp", [1.0, -4.0], [1.2, -4.0])


def test_deadline_kills_a_hung_side(bench: ModuleType, tmp_path: Path) -> None:
    # The side starts a child that holds its output open, as inductor's compile workers do.
    code = "import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); time.sleep(60)"
    hung = bench.Side([sys.executable, "-c", code], {}, tmp_path / "hung.log", wait=False, session=True)
    started = time.perf_counter()
    deadline = bench.Deadline(0.5, [hung])
    assert hung.wait() is None and deadline.expired
    assert time.perf_counter() - started < 30 and hung.failed.startswith("exit -9")


def test_help_and_refusal_without_a_platform(bench: ModuleType) -> None:
    script = str(BENCH / "cuda_graphs.py")
    assert (
        "reduce-overhead" in subprocess.run([sys.executable, script, "--help"], capture_output=True, text=True).stdout
    )
    refused = subprocess.run([sys.executable, script], capture_output=True, text=True, env={"PATH": "/usr/bin:/bin"})
    assert refused.returncode == 2 and "FLAGOS_PLATFORM" in refused.stderr
