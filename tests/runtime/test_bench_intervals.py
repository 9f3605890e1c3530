"""The benches' ratio intervals (bench/side_processes.py): paired bootstrap over interleaved rounds."""

from __future__ import annotations

import os
import random
import statistics
import sys
from collections.abc import Callable
from types import ModuleType

import pytest


@pytest.fixture(scope="module")
def sides(load_bench: Callable[[str], ModuleType]) -> ModuleType:
    return load_bench("side_processes")


def one_process(sides: ModuleType, reference: list[float], mine: list[float]) -> tuple[float, float] | None:
    """The interval of one process per side: the paired round bootstrap alone."""
    return sides.ratio_interval_by_process([reference], [mine])


def test_a_constant_ratio_has_a_point_interval(sides: ModuleType) -> None:
    plain = [10.0, 12.0, 11.0, 30.0, 10.5]
    assert one_process(sides, plain, [2 * x for x in plain]) == (0.5, 0.5)


def test_a_drift_shared_by_both_sides_does_not_widen_it(sides: ModuleType) -> None:
    board = [1.0, 2.0, 1.0, 1.5, 2.0, 1.0, 1.2]  # the machine's speed of each turn
    plain = [10 * b for b in board]
    mine = [10.5 * b for b in board]
    low, high = one_process(sides, plain, mine)
    assert low == high == pytest.approx(10 / 10.5, abs=1e-4)


def test_a_slow_stretch_in_one_sides_turn_moves_a_ratio_of_medians_not_the_paired_one(sides: ModuleType) -> None:
    # Rounds 2 and 5 slow for plain's turn only, round 3 for both: the medians compare plain's slow
    # state with flagos's fast one; within each round but the second the ratio is 10/11.
    plain = [10.0, 20.0, 20.0, 10.0, 20.0]
    mine = [11.0, 11.0, 22.0, 11.0, 22.0]
    assert statistics.median(plain) / statistics.median(mine) == pytest.approx(20 / 11)
    assert sides.paired_ratio([plain], [mine]) == pytest.approx(10 / 11)
    low, high = one_process(sides, plain, mine)
    assert low == pytest.approx(10 / 11, abs=1e-4) and high == pytest.approx(20 / 11, abs=1e-4)


def test_host_time_per_routed_call_is_paired_like_the_ratios(load_bench: Callable[[str], ModuleType]) -> None:
    # The same slow stretches: flagos adds 1 ms of host time in every round but the second, yet its
    # median over all rounds is below plain's. The time per routed call is taken within rounds, as
    # the cpu ratio beside it is, so the two cannot disagree in sign.
    zoo = load_bench("model_zoo")
    plain = {"cpu_ms_by_process": [[10.0, 20.0, 20.0, 10.0, 20.0]]}
    mine = {"cpu_ms_by_process": [[11.0, 11.0, 21.0, 11.0, 21.0]], "calls_by_path": {"native": 400, "flaggems": 100}}
    assert statistics.median(mine["cpu_ms_by_process"][0]) < statistics.median(plain["cpu_ms_by_process"][0])
    assert zoo.host_us_per_routed_call(mine, plain) == pytest.approx(1e3 / 500)
    assert zoo.host_us_per_routed_call({**mine, "calls_by_path": {}}, plain) is None


def test_noise_gives_an_interval_around_the_true_ratio_that_narrows_with_rounds(sides: ModuleType) -> None:
    rng = random.Random(1)

    def rounds(n: int, mean: float) -> list[float]:
        return [mean * rng.uniform(0.9, 1.1) for _ in range(n)]

    few = one_process(sides, rounds(5, 10.0), rounds(5, 11.0))
    many = one_process(sides, rounds(60, 10.0), rounds(60, 11.0))
    assert few[0] < 10 / 11 < few[1] and many[0] < 10 / 11 < many[1], (few, many)
    assert many[1] - many[0] < few[1] - few[0]


def test_resampled_processes_keep_one_build_from_reading_as_two(sides: ModuleType) -> None:
    """One build on both sides, where a process may run 8% slower throughout (its memory layout,
    say): one process per side, a fast one against a slow one, gives a narrow interval that reads
    as a difference; two per side, resampled as processes, give one that holds 1."""
    rng = random.Random(2)

    def process(mean: float) -> list[float]:
        return [mean * rng.uniform(0.99, 1.01) for _ in range(40)]

    a_fast, a_slow, b_fast, b_slow = process(10.0), process(10.8), process(10.0), process(10.8)
    one = one_process(sides, a_fast, b_slow)
    assert one[1] < 0.95, one
    two = sides.ratio_interval_by_process([a_fast, a_slow], [b_fast, b_slow])
    assert two[0] < 1 < two[1], two


def test_rounds_count_their_processes_toward_the_width(sides: ModuleType) -> None:
    rounds = sides.InterleavedRounds(sides.RoundPlan(3, width=0.04, most=30), "plain")
    for _ in rounds:
        rounds.add("plain", 10.0)
        rounds.add("flagos", 10.0, process=0)
        rounds.add("flagos", 11.0, process=1)  # a slower process: no number of rounds narrows it
    assert rounds.count == 30 and rounds.summary()["narrow_enough"] is False
    assert rounds.times["flagos"][:2] == [10.0, 11.0]


def test_too_few_rounds_give_no_interval(sides: ModuleType) -> None:
    assert one_process(sides, [1.0, 2.0], [1.0, 2.0]) is None


def test_sides_sleep_on_sync_only_when_asked(sides: ModuleType, tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    asked = sides.side_env("plain", "tuned", tmp_path / "routes.yaml", sleep_on_sync=True)
    default = sides.side_env("flagos", "tuned", tmp_path / "routes.yaml")
    assert asked[sides.SLEEP_ON_SYNC] == "1" and default[sides.SLEEP_ON_SYNC] == "0"
    monkeypatch.setenv(sides.SLEEP_ON_SYNC, "0")
    assert sides.apply_sync_mode() is False  # not asked: the driver is not touched


def test_a_median_interval_holds_the_median_and_needs_three_rounds(sides: ModuleType) -> None:
    assert sides.median_interval([0.4, 0.4, 0.4]) == (0.4, 0.4)
    low, high = sides.median_interval([0.30, 0.35, 0.40, 0.45, 0.50, 2.0])
    assert low <= 0.425 <= high and high <= 2.0
    assert sides.median_interval([0.3, 0.4]) is None


def test_a_dispatch_target_is_judged_by_the_whole_interval(load_bench: Callable[[str], ModuleType]) -> None:
    dispatch = load_bench("dispatch_overhead")
    assert dispatch.verdict({"median": 0.25, "interval": (0.2, 0.29)}, 0.3) == "met"
    assert dispatch.verdict({"median": 0.4, "interval": (0.31, 0.5)}, 0.3) == "MISSED"
    assert dispatch.verdict({"median": 0.25, "interval": (0.2, 0.5)}, 0.3) == "undecided"
    assert dispatch.verdict({"median": 0.35, "interval": None}, 0.3) == "MISSED"  # one round: its difference
    assert dispatch.target_us("cuda", "foreach") == pytest.approx(0.8) and dispatch.target_us("cpu", "add") == 0.5
    assert dispatch.target_us("cpu", "mm") is None and dispatch.target_us("cuda", "x[0]") == 0.2


def test_sides_share_the_last_core_or_the_named_ones(sides: ModuleType, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sides.os, "sched_getaffinity", lambda pid: {0, 1, 2, 3, 5}, raising=False)
    monkeypatch.delenv("BENCH_CPUS", raising=False)
    assert sides.shared_cpus() == {5}
    monkeypatch.setenv("BENCH_CPUS", "2, 3")
    assert sides.shared_cpus() == {2, 3}
    monkeypatch.setenv("BENCH_CPUS", "last")
    with pytest.raises(SystemExit, match="BENCH_CPUS: expected comma-separated core numbers, got 'last'"):
        sides.shared_cpus()


def run_rounds(sides: ModuleType, plan: object, time_of: Callable[[int], tuple[float, float]]) -> dict:
    """Runs InterleavedRounds with `time_of(round)` giving (plain, flagos); its summary."""
    rounds = sides.InterleavedRounds(plan, "plain")
    for r in rounds:
        plain, flagos = time_of(r)
        rounds.add("plain", plain)
        rounds.add("flagos", flagos)
    return rounds.summary()


def test_a_fixed_plan_runs_its_rounds_and_no_more(sides: ModuleType) -> None:
    summary = run_rounds(sides, sides.RoundPlan(4), lambda r: (10.0, 11.0 + r))
    assert summary == {"rounds": 4}


def test_rounds_are_added_until_the_interval_is_narrow_enough(sides: ModuleType) -> None:
    rng = random.Random(3)

    def noisy(r: int) -> tuple[float, float]:
        return 10.0 * rng.uniform(0.9, 1.1), 11.0 * rng.uniform(0.9, 1.1)

    steady = run_rounds(sides, sides.RoundPlan(3, width=0.04, most=50), lambda r: (10.0, 11.0))
    assert steady == {"rounds": 3, "widest_interval": 0.0, "narrow_enough": True}
    summary = run_rounds(sides, sides.RoundPlan(3, width=0.12, most=200), noisy)
    assert 3 < summary["rounds"] < 200 and summary["narrow_enough"], summary
    assert summary["widest_interval"] <= 0.12


def test_a_plan_stops_short_at_its_most_rounds_or_seconds_and_says_so(sides: ModuleType) -> None:
    swinging = run_rounds(sides, sides.RoundPlan(3, width=0.01, most=6), lambda r: (10.0, 5.0 + 10 * (r % 2)))
    assert swinging["rounds"] == 6 and swinging["narrow_enough"] is False and swinging["widest_interval"] > 0.01
    timed_out = run_rounds(sides, sides.RoundPlan(3, width=0.01, seconds=0.0), lambda r: (10.0, 5.0 + 10 * (r % 2)))
    assert timed_out["rounds"] == 3 and timed_out["narrow_enough"] is False


def test_a_side_that_fails_stops_counting(sides: ModuleType) -> None:
    rounds = sides.InterleavedRounds(sides.RoundPlan(3, width=0.01, most=100), "plain")
    for r in rounds:
        rounds.add("plain", 10.0)
        if r < 2:
            rounds.add("flagos", 10.0 + r)
        else:
            rounds.drop("flagos")  # nothing is left to compare: no more rounds
    assert rounds.count == 3 and "flagos" not in rounds.times


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="no CPU affinity on this platform")
def test_only_the_rounds_run_on_the_named_cores(sides: ModuleType, tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    everywhere = os.sched_getaffinity(0)
    core = max(everywhere)
    probe = "import json, os; print('@@' + json.dumps({'named': os.environ.get('BENCH_ROUND_CPUS'), 'on': sorted(os.sched_getaffinity(0))}))"
    side = sides.Side([sys.executable, "-c", probe], dict(os.environ), tmp_path / "side.log", cpus={core})
    assert side.ready == {"named": str(core), "on": sorted(everywhere)}  # started on every core
    monkeypatch.setenv(sides.ROUND_CPUS, str(core))
    with sides.on_round_cpus():
        assert os.sched_getaffinity(0) == {core}
    assert os.sched_getaffinity(0) == everywhere
    monkeypatch.delenv(sides.ROUND_CPUS)
    with sides.on_round_cpus():  # no cores named: where it was
        assert os.sched_getaffinity(0) == everywhere
