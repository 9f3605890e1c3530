"""Sides as live processes: what the side-by-side benchmarks share.

A *side* is one way of running a workload (plain on the backing device, or flagos with one route
configuration), each in a process of its own, so that no route table, compiled graph or allocator
state leaks from one side into another; the plain sides never import torch_fl (a process where
flagos is registered cannot run autograd over plain CUDA tensors; see torch_fl.activation). The
parent starts the sides, then drives them with commands on their stdin while they stay alive, so
that timed rounds can interleave across sides and the machine's drifts touch them alike. A side
whose process dies (a kernel that faults the device) is marked failed; the others go on.

This module imports torch and the standard library only: plain sides import it too.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import gc
import importlib.util
import json
import os
import random
import statistics
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType

import torch

# A route table with no entries: with FLAGOS_ROUTE_DEFAULTS it puts every op on the same paths.
EMPTY_TABLE = "format: 1\nops: {}\n"
# Protocol between the parent and a side's process: commands on stdin, one per line (a name, then
# optional JSON keyword arguments); replies on stdout, each a line starting with this marker
# (anything else a library prints is ignored).
MARK = "@@"
# Set to "1" in a side's environment: it sleeps on CUDA synchronisation (apply_sync_mode).
SLEEP_ON_SYNC = "BENCH_SLEEP_ON_SYNC"
# Set by Side in a side's environment: the cores its timed rounds run on (on_round_cpus).
ROUND_CPUS = "BENCH_ROUND_CPUS"


@dataclass(frozen=True)
class Variant:
    compiled: bool = False
    defaults: str | None = None  # FLAGOS_ROUTE_DEFAULTS over an empty table; None keeps routes.yaml
    env: dict[str, str] = field(default_factory=dict)
    flag_gems: bool = False  # plain sides: flag_gems.enable(), every op FlagGems has on FlagGems


VARIANTS = {
    "native-only": Variant(defaults="native"),
    "flaggems-first": Variant(defaults="flaggems,native"),
    "tuned": Variant(),
    "compiled": Variant(compiled=True),
}


def reply(message: dict) -> None:
    """Send one reply to the parent."""
    print(MARK + json.dumps(message), flush=True)


def serve(commands: Mapping[str, Callable[..., dict]], last: str) -> None:
    """Answer the parent's commands until `last` has been answered or stdin closes."""
    for line in sys.stdin:
        name, _, arguments = line.strip().partition(" ")
        if name not in commands:
            continue
        reply(commands[name](**(json.loads(arguments) if arguments else {})))
        if name == last:
            return


def side_env(
    side: str, variant: str, table: Path, platform: str | None = None, sleep_on_sync: bool = False
) -> dict[str, str]:
    """The environment of a side's process: a plain side without flagos, a flagos side with the
    routes of `variant` (`table`: an empty route table) and, if given, FLAGOS_PLATFORM=`platform`;
    `sleep_on_sync`: the side calls `apply_sync_mode()` to sleep while it waits for the GPU."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    env[SLEEP_ON_SYNC] = "1" if sleep_on_sync else "0"
    if side == "plain":
        env["TORCH_DEVICE_BACKEND_AUTOLOAD"] = "0"
        env.pop("FLAGOS_PLATFORM", None)
        return env
    if platform is not None:
        env["FLAGOS_PLATFORM"] = platform
    spec = VARIANTS[variant]
    if spec.defaults is not None:
        env.update(FLAGOS_ROUTES=str(table), FLAGOS_ROUTE_DEFAULTS=spec.defaults)
    return {**env, **spec.env}


def apply_sync_mode() -> bool:
    """In a side started with `side_env(..., sleep_on_sync=True)`: CUDA synchronisation in this
    process sleeps until the GPU is done instead of spinning (CU_CTX_SCHED_BLOCKING_SYNC on every
    device's primary context). A spinning wait is CPU time, so by default a side's CPU time equals
    its wall time wherever the host waits for the GPU and says nothing of the host work; sleeping,
    it counts the host work alone, at the price of a wake-up (microseconds) per wait on both sides.
    Call before the side first uses CUDA. Whether the mode was set (False also without a driver)."""
    if os.environ.get(SLEEP_ON_SYNC) != "1":
        return False
    try:
        driver = ctypes.CDLL("libcuda.so.1")
        set_flags = driver.cuDevicePrimaryCtxSetFlags_v2
    except (OSError, AttributeError):  # no driver, or one older than CUDA 11
        return False
    count, device = ctypes.c_int(), ctypes.c_int()
    if driver.cuInit(0) != 0 or driver.cuDeviceGetCount(ctypes.byref(count)) != 0:
        return False
    blocking_sync = 0x4  # CU_CTX_SCHED_BLOCKING_SYNC
    for index in range(count.value):
        if driver.cuDeviceGet(ctypes.byref(device), index) != 0:
            return False
        if set_flags(device, blocking_sync) != 0:
            return False
    return True


@dataclass
class Timed:
    """What a timed block took: wall seconds, and the CPU seconds of this process's threads (the
    host work a side does, and its waits for the GPU unless it sleeps on them: apply_sync_mode)."""

    wall_s: float = 0.0
    cpu_s: float = 0.0


@contextlib.contextmanager
def timed_without_gc() -> Iterator[Timed]:
    """A timed block with Python's cyclic collector off (as `timeit` does), after a full collection;
    yields its Timed, filled in when the block ends.

    A full collection in a process holding a board-size transformers model takes about 160 ms (on
    the two-core host) and comes after enough allocations: it would land in some rounds and not in
    others. Every side is timed this way. (It is not what makes the H200's rounds vary by up to 2x:
    those varied as much with it off.)
    """
    gc.collect()
    was_enabled = gc.isenabled()
    gc.disable()
    timed = Timed()
    wall, cpu = time.perf_counter(), time.process_time()
    try:
        yield timed
    finally:
        timed.wall_s, timed.cpu_s = time.perf_counter() - wall, time.process_time() - cpu
        if was_enabled:
            gc.enable()


def paired_ratio(reference: Sequence[Sequence[float]], mine: Sequence[Sequence[float]]) -> float:
    """How much faster `mine` ran than `reference`: the median over interleaved rounds of each
    round's ratio, reference time over mine (each side's time of a round: the median of its
    processes' times in that round). Round i of every side ran in one turn, under the machine's
    state of that moment, and on the board that state moves within a call (one plain llama prefill
    took 8.7 to 17.8 ms): a ratio of each side's median over all rounds mixes those states, a
    ratio within a round compares the sides under one."""
    return statistics.median(_round_ratio(reference, mine, i) for i in _paired_rounds(reference, mine))


def paired_difference(reference: Sequence[Sequence[float]], mine: Sequence[Sequence[float]]) -> float:
    """What `mine` took more than `reference`: the median over interleaved rounds of each round's
    difference, paired as paired_ratio pairs its ratios."""
    return statistics.median(_round_time(mine, i) - _round_time(reference, i) for i in _paired_rounds(reference, mine))


def _paired_rounds(reference: Sequence[Sequence[float]], mine: Sequence[Sequence[float]]) -> range:
    """The rounds every process of both sides ran."""
    return range(min(len(rounds) for rounds in (*reference, *mine)))


def _round_time(processes: Sequence[Sequence[float]], i: int) -> float:
    """A side's time of round i: the median of its processes' times in that round."""
    return statistics.median(p[i] for p in processes)


def _round_ratio(reference: Sequence[Sequence[float]], mine: Sequence[Sequence[float]], i: int) -> float:
    return _round_time(reference, i) / _round_time(mine, i)


def pooled_processes(replies: Sequence[dict], unit: str) -> dict:
    """What a side's processes measured together, from their replies (each holding its rounds'
    times as `ms_per_<unit>_rounds` and `host_cpu_ms_per_<unit>_rounds`): every process's rounds
    (`ms_by_process`, `cpu_ms_by_process`, for the ratios), all rounds pooled under the replies' own
    keys, and the medians of the pooled rounds."""
    ms = [r[f"ms_per_{unit}_rounds"] for r in replies]
    cpu = [r[f"host_cpu_ms_per_{unit}_rounds"] for r in replies]
    all_ms, all_cpu = [x for rounds in ms for x in rounds], [x for rounds in cpu for x in rounds]
    return {
        "processes": len(replies),
        f"ms_per_{unit}": statistics.median(all_ms),
        f"ms_per_{unit}_rounds": all_ms,
        f"host_cpu_ms_per_{unit}": statistics.median(all_cpu),
        f"host_cpu_ms_per_{unit}_rounds": all_cpu,
        "ms_by_process": ms,
        "cpu_ms_by_process": cpu,
    }


def ratio_interval_by_process(
    reference: Sequence[Sequence[float]],
    mine: Sequence[Sequence[float]],
    level: float = 0.95,
    draws: int = 4000,
) -> tuple[float, float] | None:
    """A bootstrap interval of paired_ratio (None for fewer than 3 rounds). Rounds are resampled as
    pairs, so a slow moment of the board weighs on both sides alike. Where a side ran in several
    processes, each with its own rounds (round i of every process in one turn), each draw also
    resamples each side's processes: a process's speed moves with its memory layout by more than
    its own rounds vary (two processes of one build differed by 2-8% on the host, with round
    intervals of +-0.01). With one process per side this is the paired round bootstrap alone."""
    n = len(_paired_rounds(reference, mine))

    def pick(processes: Sequence[Sequence[float]], rng: random.Random) -> list[Sequence[float]]:
        if len(processes) == 1:
            return list(processes)
        return [processes[rng.randrange(len(processes))] for _ in processes]

    rng = random.Random(1)  # the processes' draws: the same rounds give the same interval

    def statistic(picked: list[int]) -> float:
        ref, own = pick(reference, rng), pick(mine, rng)
        return statistics.median(_round_ratio(ref, own, i) for i in picked)

    return _bootstrap(n, statistic, level, draws)


def median_interval(values: Sequence[float], level: float = 0.95, draws: int = 4000) -> tuple[float, float] | None:
    """A bootstrap interval of the median of `values` (one per round; None for fewer than 3)."""
    return _bootstrap(len(values), lambda picked: statistics.median(values[i] for i in picked), level, draws)


def _bootstrap(n: int, statistic: Callable[[list[int]], float], level: float, draws: int) -> tuple[float, float] | None:
    """The `level` percentile interval of `statistic` over `draws` resamplings of rounds 0..n-1."""
    if n < 3:
        return None
    rng = random.Random(0)  # the same rounds give the same interval
    values = sorted(statistic([rng.randrange(n) for _ in range(n)]) for _ in range(draws))
    tail = (1 - level) / 2
    return round(values[int(tail * draws)], 4), round(values[min(draws - 1, int((1 - tail) * draws))], 4)


@dataclass(frozen=True)
class RoundPlan:
    """How many interleaved rounds a case gets: `least` always; where `width` is set, more until
    every ratio's 95% interval is at most `width` wide (upper minus lower bound), or `most` rounds
    were run, or `seconds` passed since the case's first round. A fixed count suits no machine: on
    a steady one a few rounds decide, on a shared board whose rounds vary by up to 2x the same count
    leaves intervals wider than a target's margin."""

    least: int
    width: float | None = None
    most: int = 60
    seconds: float = 240.0

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> RoundPlan:
        return cls(args.rounds, args.interval_width, max(args.max_rounds, args.rounds), args.case_seconds)

    def describe(self) -> str:
        if self.width is None:
            return f"{self.least} interleaved rounds"
        return (
            f"at least {self.least} interleaved rounds, more until each ratio's 95% interval is at most "
            f"{self.width:g} wide (at most {self.most} rounds or {self.seconds:g} s per case)"
        )


def add_round_options(parser: argparse.ArgumentParser, rounds: int | None, rounds_help: str) -> None:
    """The options that make a RoundPlan (RoundPlan.from_args)."""
    parser.add_argument("--rounds", type=int, default=rounds, help=rounds_help)
    parser.add_argument(
        "--interval-width",
        type=float,
        help="after --rounds, add rounds until every ratio's 95%% interval is at most this wide (0.04: "
        "about +-0.02); a case that stops short of it says so",
    )
    parser.add_argument("--max-rounds", type=int, default=60, help="with --interval-width: rounds per case at most")
    parser.add_argument(
        "--case-seconds", type=float, default=240.0, help="with --interval-width: no round starts after this long"
    )


def add_processes_option(parser: argparse.ArgumentParser) -> None:
    """--processes N (1 or more): each side runs in N processes, every one taking every round."""

    def count(text: str) -> int:
        n = int(text)
        if n < 1:
            raise argparse.ArgumentTypeError(f"{n}: expected 1 or more")
        return n

    parser.add_argument(
        "--processes",
        type=count,
        default=1,
        help="processes per side; with 2 or more each interval also resamples the processes (a process's "
        "speed moves with its memory layout by more than its rounds vary)",
    )


class InterleavedRounds:
    """The timed rounds of one case: each side's time per round (any unit, the same for all), run for
    as long as the plan asks, and the width of the ratios' intervals against `reference`'s times."""

    def __init__(self, plan: RoundPlan, reference: str) -> None:
        self.plan, self.reference = plan, reference
        self.by_process: dict[str, dict[int, list[float]]] = {}  # each side's rounds, per process
        self.count = 0

    def __iter__(self) -> Iterator[int]:
        """The round numbers to run: the caller records each side's time with add()."""
        start = time.monotonic()
        while self.count < self.plan.least or self._wants_more(time.monotonic() - start):
            yield self.count
            self.count += 1

    @property
    def times(self) -> dict[str, list[float]]:
        """Every side's rounds, round by round (each round's processes in order)."""
        return {label: [x for turn in zip(*rounds.values()) for x in turn] for label, rounds in self.by_process.items()}

    def add(self, label: str, value: float, process: int = 0) -> None:
        """A round of side `label` (of its process `process`, where a side runs in several)."""
        self.by_process.setdefault(label, {}).setdefault(process, []).append(value)

    def drop(self, label: str) -> None:
        """A side that failed: its rounds no longer count."""
        self.by_process.pop(label, None)

    def widest(self) -> float | None:
        """The widest interval of a side's ratio to the reference (None: too few rounds, or no side)."""
        reference = list(self.by_process.get(self.reference, {0: []}).values())
        widths = []
        for label, mine in self.by_process.items():
            if label == self.reference:
                continue
            bounds = ratio_interval_by_process(reference, list(mine.values()))
            if bounds is None:
                return None
            widths.append(bounds[1] - bounds[0])
        return max(widths, default=None)

    def summary(self) -> dict:
        """The rounds run and, where the plan has a width, whether the intervals came within it."""
        result: dict = {"rounds": self.count}
        if self.plan.width is not None:
            widest = self.widest()
            result["widest_interval"] = None if widest is None else round(widest, 4)
            result["narrow_enough"] = widest is not None and widest <= self.plan.width
        return result

    def _wants_more(self, elapsed: float) -> bool:
        if self.plan.width is None or self.count >= self.plan.most or elapsed >= self.plan.seconds:
            return False
        if self.reference not in self.by_process or len(self.by_process) < 2:  # nothing left to compare
            return False
        widest = self.widest()
        return widest is None or widest > self.plan.width


@contextlib.contextmanager
def on_round_cpus() -> Iterator[None]:
    """Runs the block (a side's round, its untimed warm-up run included) on the cores the parent
    named for rounds (Side's `cpus`), then on the cores it had before. Only the rounds: a side's
    start and each case's build and warm-up (importing, a model's initialisation, compilation, the
    core's build for a --baseline side) ran on the one shared core for minutes on the board,
    every side at once. Pins the calling thread, the one that runs the round."""
    named = os.environ.get(ROUND_CPUS)
    if not named or not hasattr(os, "sched_setaffinity"):
        yield
        return
    before = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {int(c) for c in named.split(",")})
    try:
        yield
    finally:
        os.sched_setaffinity(0, before)


def shared_cpus() -> set[int] | None:
    """The cores every side runs its timed rounds on, where the machine has cores to spare (None:
    no pinning).

    Sides take turns, so they never compete for them; what pinning removes is the drift between
    cores (clock, cache, interrupts). The last core alone: on the H200 board (KVM, 16 vCPUs) sides
    pinned to the last two cores ran bimodal rounds (one plain mixtral generate took 147 or 265 ms)
    and gave intervals of +-0.2, while pinned to the last core the same cases in the same call gave
    +-0.04 (2026-12-06). BENCH_CPUS (comma-separated core numbers) names the cores instead.
    """
    named = os.environ.get("BENCH_CPUS", "").strip()
    if named:
        try:
            return {int(c) for c in named.split(",")}
        except ValueError:
            raise SystemExit(f"BENCH_CPUS: expected comma-separated core numbers, got {named!r}") from None
    cpus = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
    return {cpus[-1]} if len(cpus) >= 4 else None


class Side:
    """The parent's handle on one side's process. Its first reply says it is ready (`ready`; None if
    it failed): awaited here, or with `wait()` where sides start concurrently. A side whose process
    dies (a kernel that faults the device, say) is marked failed; the others go on. `cpus`: the
    cores its timed rounds run on (on_round_cpus, in the side). `session`: the process leads a process
    group of its own, so that killing the group ends what it started too (compile workers that
    hold its output open)."""

    def __init__(
        self,
        command: list[str],
        env: dict[str, str],
        log: Path,
        wait: bool = True,
        cpus: set[int] | None = None,
        session: bool = False,
    ) -> None:
        self.log = log
        self.failed: str | None = None
        self.ready: dict | None = None
        if cpus:
            env = {**env, ROUND_CPUS: ",".join(str(c) for c in sorted(cpus))}
        with open(log, "w") as out:  # a file, not a pipe: a chatty side never blocks
            self.proc = subprocess.Popen(
                command,
                env=env,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=out,
                text=True,
                start_new_session=session,
            )
        if wait:
            self.wait()

    def wait(self) -> dict | None:
        """Await the side's first reply (it is ready)."""
        self.ready = self.receive()
        return self.ready

    def send(self, command: str, **arguments: object) -> None:
        """Send `command` with `arguments`; its reply comes with `receive()`."""
        if self.failed is not None:
            return
        try:
            assert self.proc.stdin is not None
            self.proc.stdin.write(command + (" " + json.dumps(arguments) if arguments else "") + "\n")
            self.proc.stdin.flush()
        except BrokenPipeError:
            pass  # the process is gone: receive() says why

    def receive(self) -> dict | None:
        """The side's next reply; None once it has failed."""
        if self.failed is not None:
            return None
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            if line.startswith(MARK):
                return json.loads(line[len(MARK) :])
        code = self.proc.wait()
        tail = " | ".join(self.log.read_text(errors="replace").strip().splitlines()[-4:])
        self.failed = f"exit {code}: {tail[-600:]}"
        return None

    def ask(self, command: str, **arguments: object) -> dict | None:
        """Send `command` with `arguments` and return the side's reply; None once it has failed."""
        self.send(command, **arguments)
        return self.receive()

    def close(self) -> None:
        """End the process (its stdin closes; it exits after its current command)."""
        if self.proc.stdin is not None and not self.proc.stdin.closed:
            try:
                self.proc.stdin.close()
            except BrokenPipeError:
                pass
        self.proc.wait()


def device_api(
    device: str,
) -> tuple[Callable[[], None], Callable[..., object] | None, Callable[[], int], Callable[[], None]]:
    """(synchronize, Event factory or None, peak memory, reset peak) for `device`."""
    if device == "cpu":
        return (lambda: None), None, (lambda: -1), (lambda: None)
    module = torch.cuda if device == "cuda" else getattr(torch, device)
    return module.synchronize, module.Event, module.max_memory_allocated, module.reset_peak_memory_stats


def calls_by_path(run: Callable[[], object]) -> dict[str, int]:
    """How many op calls of one `run()` each route path served (flagos sides only)."""
    from torch_fl import routing

    routing.reset_stats()
    run()
    counts: Counter[str] = Counter()
    for row in routing.stats():
        counts[row.path] += row.calls
    return dict(counts)


def profile(run: Callable[[], object], sync: Callable[[], None], repeats: int) -> list[dict]:
    """CPU-side time per op over `repeats` calls of `run`, every op (sides are compared op by op, and
    an op one side calls rarely is still listed), by total host time."""
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    with torch_profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(repeats):
            run()
        sync()
    rows = [
        {"op": e.key, "calls": e.count, "self_host_us": e.self_cpu_time_total, "total_host_us": e.cpu_time_total}
        for e in prof.key_averages()
    ]
    rows.sort(key=lambda r: -r["total_host_us"])
    return rows


def agreement(flagos: list[float], plain: list[float], rtol: float, steps: int | None = None) -> tuple[bool, float]:
    """Do the per-step losses agree (relative `rtol`) over the first `steps` steps (None: all), and
    the largest relative difference over all steps."""
    diffs = [abs(a - b) / max(abs(a), 1e-12) for a, b in zip(plain, flagos)]
    judged = diffs if steps is None else diffs[:steps]
    return len(flagos) == len(plain) and max(judged, default=0.0) <= rtol, max(diffs, default=0.0)


def fmt(value: float | None, digits: int = 3) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def mib(value: int | None) -> str:
    return "-" if value is None else f"{value / 2**20:.0f}"


def zoo_module() -> ModuleType:
    """torch_fl/workloads/zoo.py loaded by path: a plain side must not import torch_fl."""
    return workload_module("zoo")


def workload_module(name: str) -> ModuleType:
    """torch_fl/workloads/NAME.py loaded by path: a plain side must not import torch_fl
    (importing the package activates flagos), and the workloads need only torch."""
    path = Path(__file__).resolve().parents[1] / "torch_fl" / "workloads" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(f"flagos_bench_{name}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module
