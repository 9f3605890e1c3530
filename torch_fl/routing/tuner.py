"""Per-op, per-shape-bucket route tuning on the device.

1. Record: run the workload once under a dispatch mode that notes every call of an op that has a
   candidate besides native, with a copy of its first inputs per shape bucket (replaying real
   values keeps index-taking ops in range).
2. Measure: replay each (op, bucket) through every candidate the conformance gate allows, with
   warm-up first (FlagGems autotunes and compiles on its first call per shape). The first call of
   each candidate, on fresh copies of the inputs, must agree with native's at the workload's own
   shapes (conformance samples are small; a kernel can pass them and still fail at the sizes a
   model uses, as FlagGems kernels did on the H200): one that does not is never chosen. The
   candidates are then timed in alternating rounds (median and spread of each).
3. Decide per op and bucket, counting the workload's calls: a candidate is timed through its
   Python route kernel, so its time includes that kernel's cost; the calls a bucket leaves native
   never enter Python (the core's route filter serves them), so they cost nothing. A win must
   exceed the minimum gain and the rounds' spread. A measured op whose order served another path
   first is put native first; the buckets it won go over that.
4. Check: time the workload native-only and tuned in alternating rounds (median of each); a tuned
   table that is not faster is not written. The same holds for every other step given to check
   (the model zoo's training steps, say): a table tuned on one model must not slow down another.
"""

from __future__ import annotations

import math
import statistics
import time
from collections import defaultdict
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from typing import Any, Optional

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_map

from torch_fl.kernels.base import op_name
from torch_fl.numerics import reduction_length, tolerances
from torch_fl.routing.gatekey import call_key
from torch_fl.routing.runtime import C_PATHS, Router, forced
from torch_fl.routing.table import Bucket, OpRoute, Provenance

# FlagGems GEMMs autotune on the first call of every shape (about 30 s each on the H200): tuning
# them costs minutes of device time per workload, so `tune` can skip them (and takes a time
# budget), but measures them by default: a GEMM is where a slow vendor kernel costs most.
GEMM_OPS = frozenset({"aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", "aten::mm.out", "aten::addmm.out"})


def bucket_bound(numel: int) -> int:
    """Buckets are powers of two of the largest input's element count."""
    return 1 << max(0, math.ceil(math.log2(max(numel, 1))))


def _tensors(value: Any) -> list[torch.Tensor]:
    return [t for t in torch.utils._pytree.tree_leaves(value) if isinstance(t, torch.Tensor)]


def _clones(value: Any) -> Any:
    """`value` with every tensor copied (recorded inputs; fresh inputs for each candidate)."""
    return tree_map(lambda a: a.clone() if isinstance(a, torch.Tensor) else a, value)


@dataclass
class Sample:
    op: str
    overload: Any
    bound: int
    dtype: Optional[str]
    key: str  # the gate key of the recorded call
    args: Any
    kwargs: Any
    calls: int = 0


class _Recorder(TorchDispatchMode):
    def __init__(self, tunable: Callable[[str], bool]) -> None:
        super().__init__()
        self.tunable = tunable
        self.samples: dict[tuple[str, int, Any], Sample] = {}

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        name = op_name(func)
        if self.tunable(name):
            call = call_key(func, args, kwargs)
            key = (name, bucket_bound(call.numel), call.text)
            sample = self.samples.get(key)
            if sample is None:
                copy = _clones((args, kwargs))
                sample = self.samples[key] = Sample(name, func, key[1], call.dtype, call.text, copy[0], copy[1])
            sample.calls += 1
        return func(*args, **kwargs)


def _synchronize() -> None:
    torch.accelerator.synchronize()


def time_call(fn: Callable[[], Any], repeats: int = 5, inner: int = 10) -> float:
    """Median microseconds per call of `fn`, device work included."""
    runs = []
    for _ in range(repeats):
        _synchronize()
        start = time.perf_counter()
        for _ in range(inner):
            fn()
        _synchronize()
        runs.append((time.perf_counter() - start) / inner * 1e6)
    return statistics.median(runs)


@dataclass
class Measurement:
    op: str
    bound: int
    dtype: str
    calls: int
    us: dict[str, float] = field(default_factory=dict)
    first_call_s: dict[str, float] = field(default_factory=dict)
    errors: dict[str, str] = field(default_factory=dict)
    spread_us: dict[str, float] = field(default_factory=dict)  # median absolute deviation of the rounds

    def best(self) -> str:
        return min(self.us, key=lambda path: self.us[path]) if self.us else "native"


@dataclass
class TuneReport:
    platform: str
    workload: str
    measurements: list[Measurement]
    python_overhead_us: float
    chosen: dict[str, list[dict[str, Any]]]
    step_ms_native: float = 0.0
    step_ms_tuned: float = 0.0
    # other steps the tuned table was checked on: name -> [native-only ms, tuned ms]
    checked_ms: dict[str, list[float]] = field(default_factory=dict)
    kept: bool = False
    # measured ops where no candidate beat native but another path was first: native first now
    demoted: list[str] = field(default_factory=list)
    # (op <= bound) samples the time budget left unmeasured: their routes are as they were
    unmeasured: list[str] = field(default_factory=list)
    note: str = ""

    @property
    def changes_table(self) -> bool:
        return self.kept or bool(self.demoted)

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "changes_table": self.changes_table}


def disagreement(actual: Any, expected: Any, inputs: list[torch.Tensor]) -> Optional[str]:
    """How a candidate's results depart from native's on the same inputs, or None.

    Checked on the device, in float32, with conformance's tolerances doubled (both results carry
    rounding error); NaN must match NaN, integers and bool must be equal.
    """
    got, want = _tensors(actual), _tensors(expected)
    if len(got) != len(want):
        return f"{len(got)} results, native gave {len(want)}"
    for i, (a, e) in enumerate(zip(got, want)):
        if a.shape != e.shape:
            return f"result {i}: shape {list(a.shape)}, native {list(e.shape)}"
        if not (e.is_floating_point() or e.is_complex()):
            if not torch.equal(a, e.to(a.dtype)):
                return f"result {i}: values differ from native"
            continue
        rtol, atol = tolerances(e.dtype, reduction_length(inputs, e)) or (0.0, 0.0)
        a32, e32 = (torch.view_as_real(x) if x.is_complex() else x.float() for x in (a, e))
        ok = ((a32 - e32).abs() <= 2 * (atol + rtol * e32.abs())) | (a32 == e32) | (a32.isnan() & e32.isnan())
        if not bool(ok.all()):
            return f"result {i}: {int((~ok).sum())}/{ok.numel()} elements differ from native (rtol {2 * rtol:g}, atol {2 * atol:g})"
    return None


def measure(sample: Sample, paths: list[str], rounds: int = 7, inner: int = 10) -> Measurement:
    m = Measurement(sample.op, sample.bound, str(sample.dtype).replace("torch.", ""), sample.calls)
    # seeded random ops draw differently on every path; their values cannot be compared
    checked = torch.Tag.nondeterministic_seeded not in getattr(sample.overload, "tags", ())
    expected: Any = None
    timed = []
    for path in sorted(paths, key=lambda p: p != "native"):  # native first: the others are checked against it
        try:
            with forced(sample.op, path):
                args, kwargs = _clones((sample.args, sample.kwargs))  # in-place candidates see fresh inputs
                start = time.perf_counter()
                result = sample.overload(*args, **kwargs)
                _synchronize()
                m.first_call_s[path] = round(time.perf_counter() - start, 4)
                # what the call wrote into its arguments (in-place, out=) is compared too
                if path == "native":
                    expected = (result, args, kwargs)
                elif checked and expected is not None:
                    problem = disagreement((result, args, kwargs), expected, _tensors(args))
                    if problem is not None:
                        m.errors[path] = f"wrong values at this shape: {problem}"
                        continue
            timed.append(path)
        except Exception as exc:  # a candidate that fails here is simply not chosen
            m.errors[path] = f"{type(exc).__name__}: {str(exc)[:200]}"
    _time_rounds(sample, timed, rounds, inner, m)
    return m


def _time_rounds(sample: Sample, paths: list[str], rounds: int, inner: int, m: Measurement) -> None:
    """Time `paths` in alternating rounds, so that the machine's drifts (another process taking the
    cores for milliseconds) touch every path alike; each path's time is the median of its rounds,
    which a single outlier cannot move, and its spread the median absolute deviation."""
    per_path: dict[str, list[float]] = {path: [] for path in paths}
    for _ in range(rounds):
        for path in list(per_path):
            try:
                with forced(sample.op, path):
                    per_path[path].append(time_call(lambda: sample.overload(*sample.args, **sample.kwargs), 1, inner))
            except Exception as exc:
                m.errors[path] = f"{type(exc).__name__}: {str(exc)[:200]}"
                del per_path[path]
    for path, times in per_path.items():
        middle = statistics.median(times)
        m.us[path] = round(middle, 2)
        m.spread_us[path] = round(statistics.median(abs(t - middle) for t in times), 2)


def python_route_overhead() -> float:
    """What serving an op through a Python route kernel costs over the C++ native route (us)."""
    x = torch.ones(8, device="flagos")
    native = time_call(lambda: torch.ops.aten.neg.default(x), inner=200)
    with forced("aten::neg", "native", python=True):
        routed = time_call(lambda: torch.ops.aten.neg.default(x), inner=200)
    return max(0.0, routed - native)


def _beats_native(m: Measurement, path: str, min_gain: float) -> bool:
    """`path` is faster than native by `min_gain` of native's time and by more than the two
    spreads together: a difference the rounds themselves scatter over is not a measured win."""
    native, other = m.us["native"], m.us[path]
    noise = m.spread_us.get("native", 0.0) + m.spread_us.get(path, 0.0)
    return native - other > max(min_gain * native, noise)


def decide(measurements: list[Measurement], min_gain: float) -> dict[str, list[Bucket]]:
    """Per op, the buckets to write (empty: leave the op on the C++ native route)."""
    by_op: dict[str, list[Measurement]] = defaultdict(list)
    for m in measurements:
        by_op[m.op].append(m)
    chosen: dict[str, list[Bucket]] = {}
    for op, ms in by_op.items():
        gain = 0.0
        buckets: list[Bucket] = []
        for m in sorted(ms, key=lambda m: (m.dtype, m.bound)):
            dtype = None if m.dtype == "None" else m.dtype  # a call without tensors: any dtype
            native = m.us.get("native")
            best = m.best()
            if native is None:
                continue
            if best != "native" and _beats_native(m, best, min_gain):
                gain += m.calls * (native - m.us[best])
                choice = best
                if not any(b.dtype == dtype for b in buckets) and m.bound > 1:
                    # sizes below the smallest one measured were not measured: they stay native
                    buckets.append(Bucket(max_numel=m.bound // 2, dtype=dtype, choice="native"))
            else:
                choice = "native"  # served by the route filter in C++: no Python entry
            buckets.append(Bucket(max_numel=m.bound, dtype=dtype, choice=choice, measured_us=dict(m.us)))
        if gain > 0 and any(b.choice != "native" for b in buckets):
            chosen[op] = buckets
    return chosen


def tune(
    router: Router,
    step: Callable[[], Any],
    workload: str,
    steps: int = 5,
    paths: Optional[list[str]] = None,
    include_gemm: bool = True,
    min_gain: float = 0.05,
    progress: Callable[[str], None] = lambda message: None,
    isolate: bool = True,
    check_rounds: int = 7,
    also_check: Mapping[str, Callable[[], Callable[[], Any]]] | None = None,
    budget_s: Optional[float] = None,
) -> TuneReport:
    """Record, measure, decide and check; installs the tuned buckets in `router` when they win.

    Every measured op whose table order served another path first is put native first, with its
    winning buckets over that when the check keeps them: what the report says native keeps is
    then what the table serves, and a vendor kernel is served first only where it measured faster.
    `isolate` measures in worker processes (torch_fl.routing.tuner_worker), so that a candidate
    that crashes or poisons the device costs only its own sample. `also_check`: other steps, by
    name, that the tuned table must not slow down either, each given as the function that makes it
    (called only once the table has passed its own workload, one step alive at a time).
    `budget_s`: seconds of measuring after which the remaining samples are left as they are."""

    def tunable(op: str) -> bool:
        if op in GEMM_OPS and not include_gemm:
            return False
        return any(p not in C_PATHS and (paths is None or p in paths) for p in router.plan(op).candidates)

    samples = _record(step, tunable)
    progress(f"recorded {len(samples)} (op, shape bucket) samples")
    pending = _pending(router, samples, paths)
    deadline = None if budget_s is None else time.time() + budget_s
    measurements = _measure_all(router, pending, isolate, progress, deadline)
    unmeasured = [f"{s.op} <= {s.bound}" for s, _ in pending[len(measurements) :]]  # measured in order
    overhead = python_route_overhead()
    chosen = decide(measurements, min_gain)
    # every measured op starts native first: where nothing won that is the answer, and where a
    # candidate won in some buckets the check compares them with native-only, as it says
    native_first = _native_first(router, sorted({m.op for m in measurements}), workload)
    _use(router, native_first)
    saved = {op: router.table.ops.get(op) for op in chosen}
    tuned = _tuned_routes(router, chosen, workload)
    native_ms, tuned_ms = _step_times(router, step, steps, saved, tuned, check_rounds)
    kept = bool(chosen) and tuned_ms <= native_ms
    note = ""
    if chosen and not kept:
        note = f"tuned step {tuned_ms:.3f} ms was not faster than native-only {native_ms:.3f} ms: not written"
    elif not chosen:
        note = "no candidate beat native on this workload; the table keeps native"
    checked: dict[str, list[float]] = {}
    if kept and also_check:
        checked, refusal = _check_elsewhere(router, also_check, steps, saved, tuned, check_rounds, progress)
        kept, note = not refusal, refusal or note
    demoted = sorted(op for op in native_first if not (kept and op in chosen))
    if demoted:
        note += f"; native first now for {', '.join(demoted)}"
    if unmeasured:
        note += f"; the time budget left {len(unmeasured)} samples unmeasured (their routes are unchanged)"
    _use(router, tuned if kept else saved)
    return TuneReport(
        platform=router.descriptor.name,
        workload=workload,
        measurements=measurements,
        python_overhead_us=round(overhead, 2),
        chosen={op: [b.model_dump(exclude_none=True) for b in bs] for op, bs in chosen.items()} if kept else {},
        step_ms_native=round(native_ms, 3),
        step_ms_tuned=round(tuned_ms, 3),
        checked_ms=checked,
        kept=kept,
        demoted=demoted,
        unmeasured=unmeasured,
        note=note,
    )


def _native_first(router: Router, ops: list[str], workload: str) -> dict[str, OpRoute]:
    """Table entries putting native first for each of `ops` whose table order serves another path
    first (a vendor kernel `kernel add` put first, say), without their old buckets: this
    measurement replaces them. API and environment routes are the process's, not the table's."""
    routes = {}
    for op in ops:
        current = router.table.ops.get(op)
        candidates = (
            list(current.candidates)
            if current
            else list(router.descriptor.routes.overrides.get(op) or router.default_candidates())
        )
        if candidates[0] == "native":
            continue
        routes[op] = OpRoute(
            candidates=["native"] + [c for c in candidates if c != "native"],
            provenance=Provenance(
                source="tune", workload=workload, note="measured against native", record=router.gate.state
            ),
        )
    return routes


def _check_elsewhere(
    router: Router,
    makers: Mapping[str, Callable[[], Callable[[], Any]]],
    steps: int,
    saved: Mapping[str, Optional[OpRoute]],
    tuned: Mapping[str, OpRoute],
    rounds: int,
    progress: Callable[[str], None],
) -> tuple[dict[str, list[float]], str]:
    """Times each other step native-only and tuned: ({name: [native ms, tuned ms]}, why the table
    is refused, or ""). A step that cannot be made or fails native-only too is left out (the table
    is not what breaks it); one that fails or runs slower only with the tuned table refuses it."""
    checked: dict[str, list[float]] = {}
    refused, left_out = [], []
    for name, make in makers.items():
        progress(f"checking the tuned table on {name}")
        _use(router, saved)
        try:
            other = make()
            other()
        except Exception as exc:
            left_out.append(f"{name} (fails native-only too: {type(exc).__name__})")
            continue
        try:
            native_ms, tuned_ms = _step_times(router, other, steps, saved, tuned, rounds)
        except Exception as exc:
            refused.append(f"{name} fails with it ({type(exc).__name__}: {str(exc)[:160]})")
            continue
        checked[name] = [round(native_ms, 3), round(tuned_ms, 3)]
        if tuned_ms > native_ms:
            refused.append(f"{name} slower with it ({tuned_ms:.3f} against {native_ms:.3f} ms native-only)")
    if left_out:
        progress("not checked: " + ", ".join(left_out))
    return checked, ("tuned table refused: " + "; ".join(refused) + ": not written") if refused else ""


def _record(step: Callable[[], Any], tunable: Callable[[str], bool]) -> list[Sample]:
    """The (op, shape bucket) samples of one step, after two warm-up steps (allocator, autotuning)."""
    for _ in range(2):
        step()
    _synchronize()
    recorder = _Recorder(tunable)
    with recorder:
        step()
    _synchronize()
    return list(recorder.samples.values())


def _pending(router: Router, samples: list[Sample], paths: Optional[list[str]]) -> list[tuple[Sample, list[str]]]:
    """Each sample with the paths that may serve it (native always), where there is a choice."""
    pending = []
    for sample in samples:
        allowed = [
            p
            for p in router.plan(sample.op).candidates
            if p != "cpu"
            and (paths is None or p in paths or p == "native")
            and p in router.kernel_sets
            and router.kernel_sets[p].implements(sample.op)
            and router.gate.allows(sample.op, sample.key, p)
        ]
        if len(allowed) > 1:
            pending.append((sample, allowed))
    return pending


def _measure_all(
    router: Router,
    pending: list[tuple[Sample, list[str]]],
    isolate: bool,
    progress: Callable[[str], None],
    deadline: Optional[float] = None,
) -> list[Measurement]:
    """The measurements of `pending`, in order, as many as fit before `deadline` (time.time())."""
    if isolate and pending:
        from torch_fl.routing.tuner_worker import measure_isolated

        return measure_isolated(pending, router.descriptor.name, progress, deadline)
    measurements = []
    for i, (sample, allowed) in enumerate(pending):
        if deadline is not None and time.time() > deadline:
            break
        measurements.append(measure(sample, allowed))
        progress(f"measured {i + 1}/{len(pending)} {sample.op} <= {sample.bound}")
    return measurements


def _tuned_routes(router: Router, chosen: dict[str, list[Bucket]], workload: str) -> dict[str, OpRoute]:
    """The table entries that install `chosen` (an op without an entry gets one, with its reason)."""
    now = datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    routes = {}
    for op, buckets in chosen.items():
        route = router.table.ops.get(op) or OpRoute(
            candidates=router.plan(op).candidates, provenance=Provenance(source="tune", note="tuned shape buckets")
        )
        for b in buckets:
            b.provenance = Provenance(source="tune", workload=workload, at=now, record=router.gate.state)
        routes[op] = route.model_copy(update={"buckets": buckets})
    return routes


def _use(router: Router, routes: Mapping[str, Optional[OpRoute]]) -> None:
    for op, route in routes.items():
        if route is None:
            router.table.ops.pop(op, None)
        else:
            router.table.ops[op] = route
        router.refresh(op)


def _step_times(
    router: Router,
    step: Callable[[], Any],
    steps: int,
    saved: Mapping[str, Optional[OpRoute]],
    tuned: Mapping[str, OpRoute],
    rounds: int,
) -> tuple[float, float]:
    """Median ms per step with the saved entries and with the tuned ones (the same when none).

    The two alternate round by round, so that the machine's drifts touch both alike: a gain of a
    fraction of a percent is then told from the noise between rounds."""

    def step_ms() -> float:
        return time_call(step, repeats=1, inner=steps) / 1e3

    native_rounds, tuned_rounds = [], []
    if tuned:
        _use(router, tuned)
        step()  # the tuned kernels' first calls in this process (compilation) stay out of the rounds
    for _ in range(rounds if tuned else 1):
        _use(router, saved)
        native_rounds.append(step_ms())
        if tuned:
            _use(router, tuned)
            tuned_rounds.append(step_ms())
    native_ms = statistics.median(native_rounds)
    return native_ms, statistics.median(tuned_rounds) if tuned else native_ms
