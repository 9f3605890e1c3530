"""The README's demo and the benchmarks run (tiny sizes; no timing is asserted, only that they work
and that flagos and the plain backing agree where the scripts compare them)."""

from __future__ import annotations

import json
import re
import shutil
import statistics
from pathlib import Path

import pytest

import torch_fl

REPO = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.slow  # the demo and every benchmark script in fresh interpreters

# On a CUDA machine the child processes need the platform asked for, or flagos stays contained.
PLATFORM = {"FLAGOS_PLATFORM": torch_fl.active_platform().name} if torch_fl.is_active() else {}


def script(path: str, *args: str) -> str:
    return f"import runpy, sys; sys.argv = {[path, *args]!r}; runpy.run_path({path!r}, run_name='__main__')"


@pytest.mark.own_process
def test_train_demo(run_python):
    result = run_python(script("examples/train_demo.py", "--steps", "4"), env=PLATFORM)
    losses = [float(x) for x in re.findall(r"step +\d+ +loss ([0-9.]+)", result.stdout)]
    assert len(losses) == 4 and losses[-1] < losses[0], result.stdout
    assert re.search(r"routes: native \d+ calls", result.stdout), result.stdout


@pytest.mark.own_process
def test_dispatch_overhead_bench(run_python, tmp_path):
    out = tmp_path / "dispatch.json"
    result = run_python(script("bench/dispatch_overhead.py", "--quick", "--json", str(out)), env=PLATFORM)
    assert "native us" in result.stdout
    summary = json.loads(out.read_text())
    numbers = summary["us_per_op"]
    assert set(numbers) == {
        "add",
        "add 2+4d",
        "mm",
        "x[0]",
        "x.t()",
        "cast",
        "sdpa q1",
        "sdpa causal",
        "foreach",
        "foreach_",
    }
    assert set(numbers["add"]) == {"plain", "native", "python"}
    assert all(v > 0 for ways in numbers.values() for v in ways.values())
    # one round: each delta is that round's difference, with no interval to give
    for name, ways in summary["us_per_op_rounds"].items():
        assert summary["delta_us"][name] == {"median": ways["native"][0] - ways["plain"][0], "interval": None}
    # the backing's target for add (the host's or CUDA's), judged on that one difference
    target = {"cpu": r"0\.5", "cuda": r"0\.3"}[summary["backing"]]
    assert re.search(rf"^add .*<= {target} us: (met|MISSED)$", result.stdout, re.MULTILINE), result.stdout


def test_dispatch_overhead_bench_with_cold_caches(run_python, tmp_path):
    out = tmp_path / "dispatch.json"
    result = run_python(
        script("bench/dispatch_overhead.py", "--quick", "--evict-mib", "1", "--json", str(out)), env=PLATFORM
    )
    assert "caches cold (1 MiB evicted before each call" in result.stdout, result.stdout
    summary = json.loads(out.read_text())
    assert summary["evict_mib"] == 1
    assert all(v > 0 for ways in summary["us_per_op"].values() for v in ways.values())


@pytest.mark.own_process
def test_import_time_bench(run_python, tmp_path):
    out = tmp_path / "import.json"
    result = run_python(script("bench/import_time.py", "--rounds", "1", "--json", str(out)), env=PLATFORM)
    assert "flagos    adds" in result.stdout and "first use adds" in result.stdout, result.stdout
    summary = json.loads(out.read_text())
    assert all(m["wall_s"] > 0 and m["cpu_s"] > 0 for m in summary["medians"].values())
    assert set(summary["added"]) == {"flagos", "first use"}


@pytest.mark.own_process
def test_train_step_bench(run_python, tmp_path):
    out, prof = tmp_path / "train.json", tmp_path / "profile.json"
    args = ["--config", "tiny", "--variants", "native-only,tuned", "--steps", "2", "--rounds", "3", "--warmup", "1"]
    args += ["--processes", "2"]
    args += ["--json", str(out), "--profile", str(prof)]
    result = run_python(script("bench/train_step.py", *args), env=PLATFORM)
    assert "flagos native-only" in result.stdout and "flagos tuned" in result.stdout, result.stdout
    summary = json.loads(out.read_text())
    assert summary["all_agree"] and set(summary["ratios"]) == {"native-only", "tuned"}
    sides = summary["sides"]
    assert set(sides) == {"plain eager", "flagos native-only", "flagos tuned"}
    plain = sides["plain eager"]["losses"]
    for label in ("flagos native-only", "flagos tuned"):
        assert sides[label]["losses"] == pytest.approx(plain, rel=2e-2)
        assert sides[label]["calls_by_path"].get("native", 0) > 0
    # two processes per side, each taking every round; the ratio is the median of the rounds'
    # ratios, a side's time of a round being its processes' median (round i of every side: one turn)
    plain_rounds, mine_rounds = (sides[label]["ms_by_process"] for label in ("plain eager", "flagos native-only"))
    assert len(plain_rounds) == len(mine_rounds) == 2 and sides["plain eager"]["processes"] == 2
    per_round = [statistics.median(p) / statistics.median(m) for p, m in zip(zip(*plain_rounds), zip(*mine_rounds))]
    assert len(per_round) == 3
    assert summary["ratios"]["native-only"] == pytest.approx(statistics.median(per_round), abs=1e-4)
    for variant in ("native-only", "tuned"):  # three rounds: an interval, and the host CPU beside it
        low, high = summary["ratio_intervals"][variant]
        assert 0 < low <= high, summary["ratio_intervals"]
        assert summary["host_cpu_ratios"][variant] > 0
    profiles = json.loads(prof.read_text())
    for label in sides:  # every op of the profiled steps, each once, the step's matrix products among them
        ops = [row["op"] for row in profiles[label]]
        assert len(ops) == len(set(ops)) and "aten::mm" in ops, ops
        assert all(row["calls"] > 0 and row["total_host_us"] >= row["self_host_us"] >= 0 for row in profiles[label])


@pytest.mark.own_process
@pytest.mark.slow
def test_model_zoo_bench(run_python, tmp_path):
    out = tmp_path / "zoo.json"
    args = [
        "--host",
        "--models",
        "llama,resnet50",
        "--decode-batch",
        "2",
        "--new-tokens",
        "3",
        "--steps",
        "1",
        "--rounds",
        "1",
        "--warmup",
        "2",
        "--json",
        str(out),
    ]
    result = run_python(script("bench/model_zoo.py", *args), env=PLATFORM)
    assert "flagos tuned" in result.stdout and "flagos native-only" in result.stdout, result.stdout
    summary = json.loads(out.read_text())
    assert summary["all_agree"], result.stdout
    cases = {(c["model"], c["mode"]): c for c in summary["cases"]}
    assert set(cases) == {
        ("llama", "train"),
        ("llama", "prefill"),
        ("llama", "decode-b2"),
        ("resnet50", "train"),
        ("resnet50", "prefill"),
    }
    for case in cases.values():
        assert set(case["sides"]) == {"plain", "flagos tuned", "flagos native-only"} and not case["failed"]
        plain = case["sides"]["plain"]["checks"]
        for variant in ("tuned", "native-only"):
            assert case["sides"][f"flagos {variant}"]["checks"] == plain  # bitwise on the host
            assert case["flagos"][variant]["agree"] and case["flagos"][variant]["ratio"] > 0
            # the host time flagos adds, spread over the calls it routed in one run
            assert isinstance(case["flagos"][variant]["host_us_per_routed_call"], float)
    assert "us/routed" in result.stdout, result.stdout
    assert len(cases[("llama", "train")]["sides"]["plain"]["checks"]) == 3  # 2 warm-up steps, 1 timed
    assert len(cases[("llama", "decode-b2")]["sides"]["plain"]["checks"][0]) == 2  # 2 rows of 3 tokens


@pytest.mark.own_process
def test_model_zoo_bench_against_a_baseline_checkout(run_python, tmp_path):
    """--baseline runs torch_fl from another checkout as one more side and compares each flagos
    side with it. The baseline here is this checkout seen through another folder."""
    base = tmp_path / "base"
    base.mkdir()
    for name in ("torch_fl", "platforms"):
        (base / name).symlink_to(REPO / name)
    out = tmp_path / "zoo.json"
    args = ["--host", "--models", "gpt2", "--modes", "prefill", "--variants", "tuned", "--rounds", "3"]
    args += ["--processes", "2"]  # each side in two processes, the intervals resampling them too
    result = run_python(script("bench/model_zoo.py", *args, "--baseline", str(base), "--json", str(out)), env=PLATFORM)
    assert "flagos baseline" in result.stdout and "x baseline [" in result.stdout, result.stdout
    summary = json.loads(out.read_text())
    assert summary["info"]["flagos baseline"]["torch_fl"] == str(base / "torch_fl")
    assert summary["info"]["flagos tuned"]["torch_fl"] == str(REPO / "torch_fl")
    (case,) = summary["cases"]
    assert set(case["sides"]) == {"plain", "flagos tuned", "flagos baseline"} and not case["failed"]
    tuned = case["flagos"]["tuned"]
    assert tuned["over_baseline"] > 0 and len(tuned["over_baseline_interval"]) == 2
    for side in case["sides"].values():
        assert side["processes"] == 2 and [len(r) for r in side["ms_by_process"]] == [3, 3]
        assert sorted(side["ms_per_run_rounds"]) == sorted(side["ms_by_process"][0] + side["ms_by_process"][1])
        assert sorted(side["host_cpu_ms_per_run_rounds"]) == sorted(sum(side["cpu_ms_by_process"], []))
    assert "over_baseline" not in case["flagos"]["baseline"]


@pytest.mark.own_process
def test_model_zoo_adds_rounds_for_a_narrow_interval_and_says_where_it_stopped_short(run_python, tmp_path):
    out = tmp_path / "zoo.json"
    args = ["--host", "--models", "gpt2", "--modes", "prefill", "--variants", "tuned", "--rounds", "3"]
    args += ["--interval-width", "1e-9", "--max-rounds", "5", "--json", str(out)]
    result = run_python(script("bench/model_zoo.py", *args), env=PLATFORM)
    assert "at least 3 interleaved rounds, more until each ratio's 95% interval is at most 1e-09 wide" in result.stdout
    (case,) = json.loads(out.read_text())["cases"]
    assert case["rounds"] == 5 and case["narrow_enough"] is False, case
    assert len(case["sides"]["plain"]["ms_per_run_rounds"]) == 5
    assert f"WIDE gpt2 prefill: 5 rounds left an interval {case['widest_interval']} wide" in result.stdout


def test_model_zoo_refuses_a_baseline_that_is_not_a_checkout(run_python, tmp_path):
    result = run_python(script("bench/model_zoo.py", "--host", "--baseline", str(tmp_path)), check=False)
    assert result.returncode != 0
    assert f"--baseline {tmp_path}: expected a checkout of torch_fl" in result.stderr


@pytest.mark.skipif(shutil.which("callgrind_control") is None, reason="counting instructions needs valgrind")
def test_route_instructions_bench(run_python, tmp_path):
    out = tmp_path / "instructions.json"
    result = run_python(
        script("bench/route_instructions.py", "--ops", "add", "--calls", "50", "--top", "3", "--json", str(out))
    )
    # op, calls, plain, flagos, delta, its part in the core, native-route calls (one add: one), delta per routed call
    assert re.search(r"^add +50 +\d+ +\d+ +\+\d+ +\+\d+ +1 +\+\d+$", result.stdout, re.MULTILINE), result.stdout
    add = json.loads(out.read_text())["ops"]["add"]
    assert add["flagos"] > add["plain"] > 0 and add["delta"] == add["flagos"] - add["plain"]
    assert add["core"] == add["delta_by_object"]["torch_fl_core.so"] > 0  # the route itself is counted
    assert add["routed"] == 1 and add["delta_per_routed"] == add["delta"]
    assert len(add["top_functions"]) == 3


@pytest.mark.skipif(shutil.which("callgrind_control") is None, reason="counting instructions needs valgrind")
def test_route_instructions_bench_simulates_the_caches(run_python, tmp_path):
    out = tmp_path / "instructions.json"
    result = run_python(
        script("bench/route_instructions.py", "--ops", "add", "--calls", "50", "--cache-sim", "--json", str(out))
    )
    assert re.search(r"^add +I1 misses +\d+ +\d+ +\+\d+ +\+[\d.]+$", result.stdout, re.MULTILINE), result.stdout
    misses = json.loads(out.read_text())["ops"]["add"]["misses"]
    assert set(misses) == {"I1 misses", "D1 misses", "LL misses"}
    # the route's code is fetched on every call: flagos misses the instruction cache more than plain
    assert misses["I1 misses"]["flagos"] > misses["I1 misses"]["plain"] > 0


@pytest.mark.own_process
@pytest.mark.parametrize("evict", [[], ["--evict-mib", "1"]], ids=["warm", "evicted"])
def test_graph_boundary_bench(run_python, evict):
    result = run_python(
        script("bench/graph_boundary.py", "--inputs", "4", "--calls", "50", "--rounds", "1", *evict), env=PLATFORM
    )
    assert "graph boundary, 4 static + 4 other inputs, one output" in result.stdout, result.stdout
    assert ("each call after a 1 MiB eviction, median of 1 x 50" in result.stdout) == bool(evict), result.stdout
    for part in ("input conversion (GraphInputs)", "whole boundary, stand-in replay"):
        assert re.search(rf"{re.escape(part)} +[\d.]+ us per call", result.stdout), result.stdout


@pytest.mark.skipif(shutil.which("callgrind_control") is None, reason="counting instructions needs valgrind")
def test_route_instructions_bench_counts_a_training_step(run_python, tmp_path):
    out = tmp_path / "instructions.json"
    run_python(script("bench/route_instructions.py", "--ops", "train:bert", "--calls", "250", "--json", str(out)))
    step = json.loads(out.read_text())["ops"]["train:bert"]
    assert step["calls"] == 1  # a model's run counts as 250 calls
    # forward, backward and AdamW's foreach ops: many routed calls, and the route's code among them
    assert step["routed"] > 20 and step["delta_by_object"]["torch_fl_core.so"] > 0
    assert step["delta_per_routed"] == step["delta"] / step["routed"]


def test_route_instructions_bench_refuses_an_unknown_op(run_python):
    result = run_python(script("bench/route_instructions.py", "--ops", "add,nope,decode:bert"), check=False)
    assert result.returncode != 0
    # bert does not generate: only the zoo's decoders count as decode:ARCH
    assert "unknown op(s) decode:bert, nope; known: add, add 2+4d, mm," in result.stderr, result.stderr
    assert "decode:llama" in result.stderr and "decode:bert" not in result.stderr.split("known:")[1]
    assert "train:bert" in result.stderr.split("known:")[1]  # every architecture trains
