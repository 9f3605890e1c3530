"""ops: every OpInfo of PyTorch's op_db, in every dtype the platform declares, on every route path.

One pytest item per OpInfo x dtype (dtypes: the descriptor's, intersected with what the OpInfo
supports on the CPU). Its first few samples are built on the CPU, then run:

1. on the CPU in float64 (inputs upcast): the reference; on the CPU in the dtype: the baseline.
   A part (forward, backward, in-place, out=) whose baseline misses the reference is not judged
   on flagos either ("baseline"): the bar is what PyTorch's own CPU kernels meet;
2. on flagos, plain: case `ops/<op>/<dtype>/native` (op: the OpInfo's main aten overload). Every
   routed op is pinned to native in the worker, so this is the native route. A dispatch mode
   records each aten overload the run reaches on flagos (forward, backward, in-place, out=);
3. for each reached overload and each of its candidate paths other than native, the same run
   with that overload forced onto that path: case `ops/<op>/<dtype>/<path>/<overload>` with
   op = the overload and dtype = the dtype the route gate sees for it. Forcing native is not run
   again: the plain run is exactly that.

Checked in each flagos run: values against the reference (FlagGems tolerances), output dtype,
shape and strides against PyTorch's (the CPU's for the plain run, the native run's for a forced
path), storage aliasing as PyTorch's kernels do it, the in-place variant really in place, out=
honoured, the schema's alias contract of the overloads under test, and for random ops the same
results for the same seed (on a CPU backing, also the CPU generator's exact numbers).
"""

from __future__ import annotations

import contextlib
import itertools
import zlib
from collections.abc import Iterator
from typing import Any

import pytest
import torch

from torch_fl.conformance import compare
from torch_fl.conformance.fingerprint import normalize
from torch_fl.conformance.opcheck import (
    Run,
    Variant,
    Verdict,
    baseline_health,
    evaluate,
    run_sample,
    seed_all,
    summarize,
)
from torch_fl.conformance.opdb import full_name, op_db
from torch_fl.conformance.recorder import CaseInfo
from torch_fl.conformance.watch import Watch
from torch_fl.routing.constraints import refusal

SUITE = "ops"

# OpInfos not run, and why. Everything else in op_db runs.
EXCLUDED: dict[str, str] = {
    "jiterator_unary": "CUDA jiterator test op (no CPU kernel)",
    "jiterator_binary": "CUDA jiterator test op (no CPU kernel)",
    "jiterator_4inputs_with_extra_args": "CUDA jiterator test op (no CPU kernel)",
    "jiterator_binary_return_by_ref": "CUDA jiterator test op (no CPU kernel)",
    "jiterator_2inputs_2outputs": "CUDA jiterator test op (no CPU kernel)",
}

# Values of these are uninitialised memory: only dtype, shape, strides and aliasing are judged.
UNINITIALIZED = frozenset({"empty", "empty_like", "new_empty", "new_empty_strided", "empty_strided", "empty_permuted"})


def not_forced(op: str, overload: torch._ops.OpOverload, path: str) -> str | None:
    """Why `op` is never forced onto `path` (None: it is): the router's own refusals."""
    return refusal(op, path)


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _declared_dtypes(config: pytest.Config) -> list[str]:
    worker = config.pluginmanager.get_plugin("fl-worker")
    if worker is None:
        return []
    return list(worker.session.descriptor.capabilities.dtypes)


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "opinfo" not in metafunc.fixturenames:
        return
    declared = set(_declared_dtypes(metafunc.config))
    params, ids = [], []
    for opinfo in op_db():
        name = full_name(opinfo)
        if name in EXCLUDED or opinfo.name in EXCLUDED:
            continue
        for dtype in sorted(opinfo.supported_dtypes("cpu"), key=_dtype_name):
            if _dtype_name(dtype) in declared:
                params.append((opinfo, dtype))
                ids.append(f"{name}-{_dtype_name(dtype)}")
    metafunc.parametrize(("opinfo", "dtype"), params, ids=ids)


def _seed(name: str, dtype: torch.dtype) -> int:
    return zlib.crc32(f"{name}/{dtype}".encode()) % (2**31)


def _samples(opinfo: Any, dtype: torch.dtype, backward: bool, seed: int, count: int) -> tuple[list[Any], str]:
    """The first `count` samples and the device they were made on.

    Made on flagos like PyTorch's device tests make them on the device under test (so tensors a
    sample keeps on the CPU on purpose stay there); on the CPU where the sample function cannot
    run on flagos. The sample function is called directly, not through opinfo.sample_inputs():
    that wraps it in PyTorch's test tracker, which inspects the call stack per OpInfo (0.5 s each).
    """
    errors = []
    for home in ("flagos", "cpu"):
        seed_all(seed)
        try:
            return list(itertools.islice(iter(opinfo.sample_inputs_func(opinfo, home, dtype, backward)), count)), home
        except Exception as exc:
            errors.append(f"{home}: {type(exc).__name__}: {str(exc)[:300]}")
    pytest.skip("the OpInfo cannot make samples here: " + "; ".join(errors))


def main_overload(opinfo: Any, seen: dict[str, Any]) -> str:
    """The OpInfo's own aten overload among those reached, else `opinfo:<name>`."""
    wanted = {opinfo.aten_name, opinfo.name.split(".")[-1], opinfo.name.replace(".", "_")}
    wanted |= {w.rstrip("_") for w in wanted if w} | {f"{w}_" for w in wanted if w}
    for op in seen:
        packet = op.split("::", 1)[1].split(".", 1)[0]
        if packet in wanted:
            return op
    return f"opinfo:{full_name(opinfo)}"


def _native_like(problems: list[str], like_native: list[str] | None) -> bool:
    """Whether every problem is one the native run had too (then it is PyTorch's, not the path's)."""
    if like_native is None or not problems:
        return False
    native = {normalize(p) for p in like_native}
    return all(normalize(p) in native for p in problems)


def _verdict_of(problems: list[str], uncompared: list[str], like_native: list[str] | None) -> tuple[str, str]:
    """(status, message) from what a case or one of its keys found."""
    if problems:
        if _native_like(problems, like_native):
            return "skipped", "fails as the native run does: " + summarize(problems)
        return "failed", summarize(problems)
    if uncompared:
        return "unjudged", "not every part was compared: " + summarize(uncompared)
    return "passed", ""


def _conclude(case: Any, verdicts: list[Verdict], extra: list[str], like_native: list[str] | None = None) -> None:
    problems = list(extra)
    for i, v in enumerate(verdicts):
        problems += [f"sample {i}: {p}" for p in v.problems]
    uncompared = [f"sample {i}: {part}: {why}" for i, v in enumerate(verdicts) for part, why in v.uncompared().items()]
    if not problems and not uncompared and not any(v.compared for v in verdicts):
        case.skip("no sample applies: every part was rejected by the CPU too")
        return
    status, message = _verdict_of(problems, uncompared, like_native)
    if status != "passed":
        getattr(case, {"failed": "fail", "skipped": "skip", "unjudged": "unjudged"}[status])(message)


def _conclude_by_key(case: Any, verdicts: list[Verdict], extra: list[str], like_native: list[str]) -> None:
    """Judge each gate key the forced run reached by the sample parts that reached it."""
    if not case.keys:
        _conclude(case, verdicts, extra, like_native)
        return
    case.by_key = {}
    every_forward = {(i, "forward") for i in range(len(verdicts))}
    for key, phases in case.keys.items():
        problems, uncompared = list(extra), []
        # a call made before any part began (copying a sample onto flagos) feeds every forward
        reached = {p for p in phases if p is not None} | (every_forward if None in phases else set())
        for sample, part in sorted(reached, key=str):
            v = verdicts[sample]
            problems += [f"sample {sample}: {p}" for p in v.by_part.get(part, [])]
            if part not in v.compared:
                uncompared.append(f"sample {sample}: {part}: {v.baseline_skipped.get(part, 'not compared')}")
        case.by_key[key] = _verdict_of(problems, uncompared, like_native)


# Random OpInfos whose randomness is under a seed-setting wrapper: known before running anything.
_RANDOM_NAMES = (
    "normal",
    "uniform",
    "bernoulli",
    "multinomial",
    "dropout",
    "rand",
    "cauchy",
    "exponential",
    "geometric",
    "log_normal",
)


def _looks_random(opinfo: Any) -> bool:
    return any(part in opinfo.name for part in _RANDOM_NAMES) and "normalize" not in opinfo.name


@contextlib.contextmanager
def _unrecorded(case_id: str) -> Iterator[CaseInfo]:
    """Stands in for fl.case() when the plain run only serves the forced ones (resumed, or native
    not selected): same code path, nothing journaled, errors propagate."""
    yield CaseInfo(case_id, SUITE)


def test_op(opinfo: Any, dtype: torch.dtype, fl: Any) -> None:
    check = _OpCheck(opinfo, dtype, fl)
    if fl.done(check.plain_id) and fl.recorder.done_cases[check.plain_id] in ("crashed", "timeout"):
        return  # the plain run kills the worker: nothing further can run for this item
    fl.own_cases()
    if not check.samples:
        pytest.skip("the OpInfo has no sample for this dtype")
    watch = check.plain_case()
    if watch is not None:
        check.forced_cases(watch)


class _OpCheck:
    """One OpInfo in one dtype: its samples, the CPU reference and baseline runs, and the flagos runs
    judged against them (the plain case, then each reached overload forced onto each other path)."""

    def __init__(self, opinfo: Any, dtype: torch.dtype, fl: Any) -> None:
        self.opinfo, self.dtype, self.fl = opinfo, dtype, fl
        self.name, self.dname = full_name(opinfo), _dtype_name(dtype)
        self.base_id = f"{SUITE}/{self.name}/{self.dname}"
        self.plain_id = f"{self.base_id}/native"
        self.seed = _seed(self.name, dtype)
        self.backward = bool(opinfo.supports_autograd) and dtype in opinfo.supported_backward_dtypes("cpu")
        self.samples, home = _samples(opinfo, dtype, self.backward, self.seed, fl.samples)
        self.cpu = Variant("cpu", "cpu", home=home)
        self.reference = Variant("reference", "cpu", upcast=True, home=home)
        self.flagos = Variant("flagos", "flagos", home=home)
        self.values_judged = self.name not in UNINITIALIZED
        self.random = False
        # set by the plain case: the CPU runs every flagos run is judged against
        self.baselines: list[Run] = []
        self.references: list[Run] = []
        self.health: list[dict[str, Any]] = []
        self.plain: list[Run] = []
        self.plain_problems: list[str] = []

    def run_all(self, watch: Watch, cotangents: list[Any], parts: frozenset[str] | None = None) -> list[Run]:
        """Every sample on flagos under `watch` (only `parts` of each, if given)."""

        def on_part(sample: int) -> Any:
            def tell(part: str) -> None:
                watch.set_part(part)
                self.fl.recorder.phase((sample, part))  # the gate keys reached next belong to this sample's part

            return tell

        with watch:
            runs = [
                run_sample(
                    self.opinfo,
                    s,
                    self.flagos,
                    self.dtype,
                    self.seed + i,
                    cotangents[i],
                    self.backward,
                    repeat=self.random,
                    quiet=watch.paused,
                    parts=parts,
                    on_part=on_part(i),
                )
                for i, s in enumerate(self.samples)
            ]
        self.fl.synchronize()
        return runs

    def judge(self, runs: list[Run], shape_sources: list[Run], values_from: list[Run] | None) -> list[Verdict]:
        verdicts = []
        for i, run in enumerate(runs):
            v = evaluate(
                run,
                self.references[i],
                self.baselines[i],
                shape_sources[i],
                self.health[i],
                self.dtype,
                self.random,
                values_from[i] if values_from else None,
            )
            if not self.values_judged:  # uninitialised memory: dtype, shape, strides and aliasing are the check
                v.compared |= v.claimed
                v.problems = [p for p in v.problems if "elements differ" not in p]
                v.by_part = {part: [p for p in ps if "elements differ" not in p] for part, ps in v.by_part.items()}
            verdicts.append(v)
        return verdicts

    def cpu_runs(self, plain: list[Run]) -> None:
        """The baseline (CPU, the dtype) and reference (CPU, float64) runs, and whether each part of
        the baseline meets the reference."""
        opinfo, dtype, seed, backward = self.opinfo, self.dtype, self.seed, self.backward
        # Some CPU kernels take other branches under a Python dispatch mode (matrix_rank's out= is
        # left unwritten, complex lstsq and pinv give other values): the CPU runs go under the same
        # kind of mode as the flagos runs, so both sides take the same branches.
        with Watch(focus=frozenset()):
            self.baselines = [
                run_sample(opinfo, s, self.cpu, dtype, seed + i, p.cotangents, backward)
                for i, (s, p) in enumerate(zip(self.samples, plain))
            ]
            if self.random or not self.values_judged:
                self.references = self.baselines
                self.health = [{p: None for p in ("forward", "backward", "inplace", "out")} for _ in self.samples]
            else:
                self.references = [
                    run_sample(opinfo, s, self.reference, dtype, seed + i, b.cotangents, backward)
                    for i, (s, b) in enumerate(zip(self.samples, self.baselines))
                ]
                self.health = [baseline_health(r, b, dtype) for r, b in zip(self.references, self.baselines)]

    def plain_case(self) -> Watch | None:
        """Steps 1-2: the plain (native) run first. Its dispatch mode finds the reached overloads,
        and whether the op is random (then values are judged by reproducibility, not against
        float64). Returns the watch, or None when the case failed before its references existed."""
        fl = self.fl
        watch = Watch(focus=None)
        recorded = fl.selected("native") and not fl.done(self.plain_id)
        case_context = (
            fl.case(self.plain_id, SUITE, op=f"opinfo:{self.name}", dtype=self.dname, path="native")
            if recorded
            else _unrecorded(self.plain_id)
        )
        with case_context as case:
            self.random = _looks_random(self.opinfo)
            self.plain = self.run_all(watch, [None] * len(self.samples))
            self.random = self.random or watch.random
            self.cpu_runs(self.plain)
            exact_rng = self.random and fl.backing == "cpu"  # the host's flagos generator is the CPU's
            case.op = main_overload(self.opinfo, watch.seen)
            verdicts = self.judge(self.plain, self.baselines, self.baselines if exact_rng else None)
            _conclude(case, verdicts, watch.problems)
            self.plain_problems = watch.problems + [
                f"sample {i}: {p}" for i, v in enumerate(verdicts) for p in v.problems
            ]
        return watch if self.health else None

    def forced_cases(self, watch: Watch) -> None:
        """Step 3: each reached overload forced onto each of its other candidate paths, one case
        per gate key the forced run reaches (`<case_id>/<key>`)."""
        fl = self.fl
        shape_sources = [p if p.forward.error is None else b for p, b in zip(self.plain, self.baselines)]
        cotangents = [b.cotangents for b in self.baselines]
        for op, overload in watch.seen.items():
            for path in fl.candidates(op):
                if path == "native" or not fl.implements(op, path) or not_forced(op, overload, path):
                    continue
                case_id = f"{self.base_id}/{path}/{op}"
                if fl.done(case_id):
                    continue
                with fl.case(case_id, SUITE, op=op, dtype=self.dname, path=path) as case:
                    focused = Watch(focus={op})
                    # Only the parts that reached the op (the forward always runs): the others are the plain run's.
                    with fl.forced(op, path):
                        runs = self.run_all(focused, cotangents, frozenset(watch.parts.get(op, ())))
                    if op not in focused.seen:
                        case.notes.append("not reached when forced")
                    _conclude_by_key(case, self.judge(runs, shape_sources, None), focused.problems, self.plain_problems)


# ---- FP8 by emulation: OpInfo has no FP8 samples, so the emulated path's two ops get their own.
FP8_DTYPES = ("float8_e4m3fn", "float8_e5m2")
# Values around each format's limits: saturation and overflow (448/464, 57344/61440), rounding ties,
# subnormals, signed zero, infinities and NaN.
FP8_EDGES = [
    0.0,
    -0.0,
    1.0,
    -1.5,
    0.1,
    240.0,
    448.0,
    464.0,
    500.0,
    57344.0,
    61440.0,
    1e6,
    2**-9,
    2**-16,
    2**-17,
    3 * 2**-10,
    float("inf"),
    float("-inf"),
    float("nan"),
]


def _emulates_fp8(config: pytest.Config) -> bool:
    worker = config.pluginmanager.get_plugin("fl-worker")
    emulated = worker.session.descriptor.kernels.emulated if worker is not None else None
    return bool(emulated is not None and emulated.fp8)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """FP8 items exist only where the platform declares FP8 emulation."""
    if not _emulates_fp8(config):
        items[:] = [i for i in items if not i.name.startswith("test_fp8_emulated")]


def _same_bits(got: torch.Tensor, expected: torch.Tensor) -> str | None:
    g, e = got.cpu().view(torch.uint8), expected.view(torch.uint8)
    nan_g, nan_e = torch.isnan(got.cpu().float()), torch.isnan(expected.float())
    if not torch.equal(nan_g, nan_e):
        return f"NaN at {nan_g.nonzero().flatten().tolist()}, PyTorch has it at {nan_e.nonzero().flatten().tolist()}"
    bad = (g != e) & ~nan_e
    if bool(bad.any()):
        i = int(bad.nonzero()[0])
        return f"{int(bad.sum())} of {bad.numel()} values differ from PyTorch's CPU conversion, first at {i}: bits {int(g[i])}, expected {int(e[i])}"
    return None


@pytest.mark.parametrize("fp8", FP8_DTYPES)
def test_fp8_emulated(fp8: str, fl: Any) -> None:
    fl.own_cases()
    if not fl.selected("emulated"):
        pytest.skip("the emulated path is not selected")
    dtype = getattr(torch, fp8)
    g = torch.Generator().manual_seed(8)
    x = torch.cat([torch.tensor(FP8_EDGES), -torch.tensor(FP8_EDGES), torch.randn(200, generator=g) * 30])
    expected = x.to(dtype)
    to_id, from_id, mm_id = (f"{SUITE}/fp8/{fp8}/emulated/{op}" for op in ("to", "from", "aten::_scaled_mm"))
    if not fl.done(to_id):
        with fl.case(to_id, SUITE, op="aten::_to_copy", dtype="float32", path="emulated") as case:
            with fl.forced("aten::_to_copy", "emulated"):
                got = x.to("flagos").to(dtype)
            assert got.device.type == "flagos" and got.dtype == dtype, f"got {got.dtype} on {got.device}"
            why = _same_bits(got, expected)
            if why:
                case.fail(f"float32 -> {fp8}: {why}")
    if not fl.done(from_id):
        with fl.case(from_id, SUITE, op="aten::_to_copy", dtype=fp8, path="emulated") as case:
            with fl.forced("aten::_to_copy", "emulated"):
                back = expected.to("flagos").to(torch.float32).cpu()
            why = compare.compare_tensor(back, expected.to(torch.float32), torch.float32)
            if why:
                case.fail(f"{fp8} -> float32: {why}")
    if not fl.done(mm_id):
        with fl.case(mm_id, SUITE, op="aten::_scaled_mm", dtype=fp8, path="emulated") as case:
            a = (torch.randn(16, 32, generator=g) * 2).to(dtype)
            b = (torch.randn(8, 32, generator=g) * 2).to(dtype).t()  # column-major, as _scaled_mm wants mat2
            scale_a, scale_b = torch.tensor(0.5), torch.tensor(2.0)
            reference = (a.float() * 0.5) @ (b.float() * 2.0)
            with fl.forced("aten::_scaled_mm", "emulated"):
                out = torch._scaled_mm(
                    a.to("flagos"),
                    b.to("flagos"),
                    scale_a=scale_a.to("flagos"),
                    scale_b=scale_b.to("flagos"),
                    out_dtype=torch.float32,
                )
            assert out.device.type == "flagos" and out.dtype == torch.float32, f"got {out.dtype} on {out.device}"
            why = compare.compare_tensor(out, reference, torch.float32, reduce=32)
            if why:
                case.fail(f"_scaled_mm({fp8}): {why}")
