"""Running one OpInfo sample on one variant (float64 reference, CPU baseline, flagos) and judging it.

A variant is the same sample copied onto a device and dtype with its exact layout (strides, gaps,
overlaps). A run exercises every way the op can be called: forward, backward (random cotangents),
the in-place variant on a fresh copy, and `out=` with correctly shaped outputs. `evaluate` then
compares a flagos run with the reference (values), with the baseline (dtype, shape, strides,
aliasing), and checks the in-place and `out=` contracts (same object, same storage, written).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.utils._pytree import tree_flatten, tree_map

from torch_fl.conformance import compare
from torch_fl.numerics import reduction_length, reference_dtype

PARTS = ("forward", "backward", "inplace", "out")
REPEATS = 2
MAX_PROBLEMS = 4


def _error(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0][:300] if text else ''}"


def copy_like(t: torch.Tensor, device: str | torch.device, dtype: torch.dtype) -> torch.Tensor:
    """A copy of `t` on `device` in `dtype` with the same sizes and strides (overlaps and gaps too).

    The storage range `t` spans is copied, then viewed with `t`'s strides, so layouts that a plain
    `.to()` would make contiguous (slices with gaps, expanded dimensions) stay what the sample made.
    """
    t = t.detach()
    if t.is_conj():
        t = t.resolve_conj()
    if t.is_neg():
        t = t.resolve_neg()
    if t.layout != torch.strided:
        return t.to(device=device, dtype=dtype)
    if t.numel() == 0:
        return torch.empty_strided(t.size(), t.stride(), dtype=dtype, device=device)
    span = 1 + sum((s - 1) * st for s, st in zip(t.size(), t.stride()))
    flat = t.as_strided((span,), (1,), t.storage_offset())
    return flat.to(device=device, dtype=dtype, copy=True).as_strided(t.size(), t.stride(), 0)


@dataclass
class Variant:
    """How a sample is carried over: onto which device, and whether floats are upcast.

    Samples are made on `home` (flagos, as PyTorch's device tests make them on the device under
    test); tensors there go to `device`, tensors a sample keeps on the CPU on purpose (index
    tensors of tensor_split, scalars...) stay on the CPU, and `device=` arguments follow.
    """

    name: str
    device: str
    upcast: bool = False
    home: str = "flagos"

    def _target(self, device_type: str) -> str:
        return self.device if device_type == self.home else "cpu"

    def tensor(self, t: torch.Tensor, device: str | None = None) -> torch.Tensor:
        """A copy of `t` for this variant (on `device` when given, else where its home says)."""
        dtype = reference_dtype(t.dtype) if self.upcast else t.dtype
        out = copy_like(t, device or self._target(t.device.type), dtype)
        if t.requires_grad and (out.is_floating_point() or out.is_complex()):
            out.requires_grad_(True)
        return out

    def value(self, x: Any, key: str | None = None, item_dtype: torch.dtype | None = None) -> Any:
        if isinstance(x, torch.Tensor):
            return self.tensor(x)
        if isinstance(x, torch.device) or (key == "device" and isinstance(x, (str, int)) and x is not None):
            try:
                device = torch.device(x)
            except (RuntimeError, TypeError):
                return x
            return torch.device(self._target(device.type)) if device.type == self.home else x
        if self.upcast and key == "dtype" and item_dtype is not None and x == item_dtype:
            return reference_dtype(x)
        return x

    def sample(self, sample: Any, item_dtype: torch.dtype) -> tuple[Any, tuple[Any, ...], dict[str, Any]]:
        def walk(x: Any, key: str | None = None) -> Any:
            if isinstance(x, (list, tuple)) and not isinstance(x, torch.Size):
                items = [walk(v) for v in x]
                return type(x)(*items) if hasattr(x, "_fields") else type(x)(items)
            if isinstance(x, dict):
                return {k: walk(v, k) for k, v in x.items()}
            return self.value(x, key, item_dtype)

        return walk(sample.input), tuple(walk(a) for a in sample.args), walk(dict(sample.kwargs))


@dataclass
class Part:
    """One part of a run: the leaves it produced, or the error it raised, and contract problems."""

    values: list[Any] | None = None
    error: str | None = None
    problems: list[str] = field(default_factory=list)


@dataclass
class Run:
    forward: Part
    inputs: list[torch.Tensor]
    backward: Part | None = None
    inplace: Part | None = None
    out: Part | None = None
    repeat: Part | None = None  # forward again with the same seed (random ops)
    cotangents: list[torch.Tensor] | None = None
    alias: set[tuple[int, int]] = field(default_factory=set)

    def part(self, name: str) -> Part | None:
        return getattr(self, name)


def _tensors(tree: Any) -> list[torch.Tensor]:
    leaves, _ = tree_flatten(tree)
    return [x for x in leaves if isinstance(x, torch.Tensor)]


def _leaves(tree: Any) -> list[Any]:
    leaves, _ = tree_flatten(tree)
    return leaves


def _differentiable(outputs: Any) -> list[torch.Tensor]:
    return [t for t in _tensors(outputs) if t.requires_grad and (t.is_floating_point() or t.is_complex())]


def seed_all(seed: int) -> None:
    """Seed the CPU's and flagos' default generators (torch.manual_seed would also queue lazy
    seeding calls for CUDA/XPU/MTIA with a captured stack each time: milliseconds per call)."""
    torch.default_generator.manual_seed(seed)
    flagos = getattr(torch, "flagos", None)
    if flagos is not None:
        flagos.manual_seed_all(seed)


@contextlib.contextmanager
def _seeded(seed: int) -> Iterator[None]:
    seed_all(seed)
    yield


def _detached(tree: Any) -> Any:
    return tree_map(lambda x: x.detach() if isinstance(x, torch.Tensor) else x, tree)


def _run_backward(
    sample: Any,
    result: Any,
    inputs: list[torch.Tensor],
    variant: Variant,
    cotangents: list[torch.Tensor] | None,
    seed: int,
    quiet: Callable[[], Any],
) -> tuple[Part, list[torch.Tensor] | None]:
    """The gradients of the sample's differentiable outputs with respect to its inputs, and the
    cotangents that drove them (made here from `seed` when None)."""
    part = Part()
    try:
        processed = sample.output_process_fn_grad(result) if sample.output_process_fn_grad else result
        outs = _differentiable(processed)
        if cotangents is None:
            with quiet():
                cotangents = make_cotangents([t.detach() for t in outs], seed)
        wrt = [t for t in inputs if t.requires_grad]
        if len(outs) != len(cotangents):
            raise RuntimeError(f"{len(outs)} differentiable outputs, the CPU baseline has {len(cotangents)}")
        if outs and wrt:
            with quiet():
                seeds = [variant.tensor(g, variant.device) for g in cotangents]
            part.values = list(torch.autograd.grad(outs, wrt, seeds, allow_unused=True))
        else:
            part.values = []
    except Exception as exc:
        part.error = _error(exc)
    return part, cotangents


def _run_repeat(opinfo: Any, make: Callable[[], tuple[Any, tuple[Any, ...], dict[str, Any]]], seed: int) -> Part:
    """The forward twice more with the same seed: a kernel drawing from its own entropy rarely
    repeats itself three times, even on the few elements a sample has."""
    part = Part()
    try:
        draws = []
        for _ in range(REPEATS):
            i2, a2, k2 = make()
            with _seeded(seed), torch.no_grad():
                draws.append(_leaves(opinfo(i2, *a2, **k2)))
        part.values = [v for draw in draws for v in draw]
    except Exception as exc:
        part.error = _error(exc)
    return part


def run_sample(
    opinfo: Any,
    sample: Any,
    variant: Variant,
    dtype: torch.dtype,
    seed: int,
    cotangents: list[torch.Tensor] | None,
    backward: bool,
    repeat: bool = False,
    quiet: Callable[[], Any] = contextlib.nullcontext,
    parts: frozenset[str] | None = None,
    on_part: Callable[[str], None] = lambda part: None,
) -> Run:
    """Run every part of `sample` on `variant`.

    `cotangents` (CPU tensors) drive the backward pass; None makes them (the baseline run does,
    and the other variants reuse `run.cotangents`). `quiet()` brackets the copying of inputs, so a
    watching dispatch mode can tell it from the op under test. `parts` limits the run to those
    parts (the forward always runs: the others need it); `on_part(name)` is told which part starts.
    """
    wanted = parts if parts is not None else frozenset(PARTS)

    def make() -> tuple[Any, tuple[Any, ...], dict[str, Any]]:
        with quiet():
            return variant.sample(sample, dtype)

    inp, args, kwargs = make()
    inputs = _tensors((inp, args, kwargs))
    run = Run(forward=Part(), inputs=inputs)
    on_part("forward")
    try:
        with _seeded(seed):
            result = opinfo(inp, *args, **kwargs)
        run.forward.values = _leaves(result)
    except Exception as exc:
        run.forward.error = _error(exc)
        return run
    run.alias = compare.alias_pattern(run.forward.values, inputs)

    if backward and "backward" in wanted:
        on_part("backward")
        run.backward, run.cotangents = _run_backward(sample, result, inputs, variant, cotangents, seed, quiet)
    if repeat:
        on_part("forward")
        run.repeat = _run_repeat(opinfo, make, seed)
    if opinfo.inplace_variant is not None and isinstance(inp, torch.Tensor) and "inplace" in wanted:
        on_part("inplace")
        run.inplace = _run_inplace(opinfo, variant, make, seed)
    if (
        opinfo.supports_out
        and "out" in wanted
        and run.forward.values
        and all(isinstance(v, torch.Tensor) for v in run.forward.values)
    ):
        on_part("out")
        run.out = _run_out(opinfo, make, run.forward.values, isinstance(result, torch.Tensor), seed, quiet)
    return run


def _run_inplace(opinfo: Any, variant: Variant, make: Callable[[], Any], seed: int) -> Part:
    part = Part()
    try:
        inp, args, kwargs = make()
        x = inp.detach()
        args, kwargs = _detached(args), _detached(kwargs)
        key = compare.storage_key(x)
        with _seeded(seed), torch.no_grad():
            returned = opinfo.inplace_variant(x, *args, **kwargs)
        if returned is not x:
            part.problems.append("the in-place variant returned a new tensor instead of its input")
        if compare.storage_key(x) != key:
            part.problems.append("the in-place variant moved its input to new storage")
        part.values = [x]
    except Exception as exc:
        part.error = _error(exc)
    return part


def _run_out(
    opinfo: Any, make: Callable[[], Any], forward: list[torch.Tensor], single: bool, seed: int, quiet: Callable[[], Any]
) -> Part:
    part = Part()
    try:
        inp, args, kwargs = make()
        inp, args, kwargs = _detached(inp), _detached(args), _detached(kwargs)
        with quiet():
            outs = [_filled_with_sentinel(torch.empty_like(t.detach())) for t in forward]
        keys = [compare.storage_key(t) for t in outs]
        with _seeded(seed), torch.no_grad():
            returned = opinfo(inp, *args, **kwargs, out=outs[0] if single else tuple(outs))
        with quiet():
            unwritten = [
                k for k, (o, f) in enumerate(zip(outs, forward)) if _sentinel_only(o) and not _sentinel_only(f)
            ]
        if unwritten:
            # An error, not a value mismatch: where the CPU baseline leaves out= unwritten too (a
            # composite out= overload under a dispatch mode, in PyTorch itself) the part does not apply.
            raise RuntimeError(f"out= tensors {unwritten} were left unwritten")
        got = [returned] if single else list(returned) if isinstance(returned, (tuple, list)) else [returned]
        if len(got) != len(outs) or any(g is not o for g, o in zip(got, outs)):
            part.problems.append("out= was not returned: the op returned other tensors than the ones passed as out")
        if any(compare.storage_key(o) != k for o, k in zip(outs, keys)):
            part.problems.append("out= tensors of the right shape were reallocated")
        part.values = outs
    except Exception as exc:
        part.error = _error(exc)
    return part


def _filled_with_sentinel(t: torch.Tensor) -> torch.Tensor:
    """`t` filled with a value no result of the op is likely to be entirely (NaN, or the dtype's
    maximum), so that an out= left unwritten is told apart from garbage that happens to match."""
    if t.dtype.is_floating_point or t.is_complex():
        return t.fill_(float("nan"))
    if t.dtype != torch.bool:
        return t.fill_(torch.iinfo(t.dtype).max)
    return t.zero_()


def _sentinel_only(t: torch.Tensor) -> bool:
    if t.numel() == 0 or t.dtype == torch.bool:
        return False
    host = t.detach().cpu()
    if host.dtype.is_floating_point or host.is_complex():
        return bool(torch.isnan(host).all())
    return bool((host == torch.iinfo(host.dtype).max).all())


def make_cotangents(outputs: list[torch.Tensor], seed: int) -> list[torch.Tensor]:
    """Random cotangents (CPU, seeded) shaped like the differentiable outputs of the baseline."""
    gen = torch.Generator().manual_seed(seed + 1)
    cot = []
    for t in outputs:
        wide = torch.complex128 if t.is_complex() else torch.float64
        cot.append(torch.randn(t.shape, generator=gen, dtype=wide).to(t.dtype))
    return cot


@dataclass
class Verdict:
    """What evaluating one flagos run against its references found, part by part.

    `claimed`: the parts the run made whose CPU baseline applies (what the case claims to check);
    `compared`: those whose values were compared. A claimed part left uncompared (the CPU baseline
    itself misses the float64 reference) leaves the case unjudged, never passed.
    """

    problems: list[str] = field(default_factory=list)
    by_part: dict[str, list[str]] = field(default_factory=dict)
    claimed: set[str] = field(default_factory=set)
    compared: set[str] = field(default_factory=set)
    baseline_skipped: dict[str, str] = field(default_factory=dict)

    def add(self, part: str, problems: list[str], where: str | None = None) -> None:
        texts = [f"{where or part}: {p}" for p in problems]
        self.problems.extend(texts)
        self.by_part.setdefault(part, []).extend(texts)

    def fail(self, part: str, problem: str) -> None:
        self.problems.append(problem)
        self.by_part.setdefault(part, []).append(problem)

    def uncompared(self) -> dict[str, str]:
        """Claimed parts that were not compared, with why."""
        return {p: self.baseline_skipped.get(p, "not compared") for p in sorted(self.claimed - self.compared)}


def _reduce(inputs: list[torch.Tensor], outputs: list[Any]) -> int:
    tensors = [t for t in outputs if isinstance(t, torch.Tensor)]
    return max((reduction_length(inputs, t) for t in tensors), default=1)


def compare_part(actual: Part, expected: Part, dtypes: list[torch.dtype], reduce: int) -> list[str]:
    """Values of one part against the same part of the reference."""
    if actual.values is None or expected.values is None:
        return []
    if len(actual.values) != len(expected.values):
        return [f"{len(actual.values)} results, expected {len(expected.values)}"]
    problems = []
    for k, (a, e) in enumerate(zip(actual.values, expected.values)):
        if a is None and e is None:
            continue
        if (a is None) != (e is None):
            problems.append(
                f"result {k} is {'missing' if a is None else 'present'}, expected {'present' if a is None else 'none'}"
            )
            continue
        dtype = dtypes[k] if k < len(dtypes) else torch.float32
        why = compare.compare_value(a, e, dtype, reduce)
        if why:
            problems.append(f"result {k}: {why}")
    return problems


def dtypes_of(part: Part | None, fallback: torch.dtype) -> list[torch.dtype]:
    if part is None or part.values is None:
        return []
    return [v.dtype if isinstance(v, torch.Tensor) else fallback for v in part.values]


def baseline_health(reference: Run, baseline: Run, dtype: torch.dtype) -> dict[str, str | None]:
    """Per part: None when the CPU in `dtype` meets the reference; else why not ("raised" parts too)."""
    health: dict[str, str | None] = {}
    reduce = _reduce(reference.inputs, reference.forward.values or [])
    for name in PARTS:
        base, ref = baseline.part(name), reference.part(name)
        if base is None:
            health[name] = "not applicable"
            continue
        if base.error is not None:
            health[name] = f"raised on the CPU: {base.error}"
            continue
        if ref is None or ref.error is not None or ref.values is None:
            health[name] = None  # no float64 reference: compare with the CPU result itself
            continue
        problems = compare_part(base, ref, dtypes_of(base, dtype), reduce)
        health[name] = "; ".join(problems[:2]) if problems else None
    return health


def evaluate(
    run: Run,
    reference: Run,
    baseline: Run,
    shape_source: Run,
    health: dict[str, str | None],
    dtype: torch.dtype,
    random: bool,
    values_from: Run | None = None,
) -> Verdict:
    """Judge a flagos `run` of one sample.

    `reference`: the float64 run (falls back to `baseline` where float64 raised); `shape_source`:
    the run whose dtype, shape and strides are PyTorch's (the CPU baseline for the plain run, the
    plain flagos run for a forced route); `values_from`: for random ops, the run whose values must
    be reproduced exactly (None: only reproducibility within `run` is checked).
    """
    verdict = Verdict()
    if run.forward.error is not None:
        verdict.fail("forward", f"forward raised {run.forward.error}")
        return verdict
    forward = shape_source.forward.values or []
    if len(run.forward.values or []) != len(forward):
        verdict.fail("forward", f"forward gave {len(run.forward.values or [])} results, expected {len(forward)}")
        return verdict
    for k, (a, e) in enumerate(zip(run.forward.values or [], forward)):
        if isinstance(a, torch.Tensor) and isinstance(e, torch.Tensor):
            verdict.add("forward", compare.compare_metadata(a, e), f"forward result {k}")
            if a.device.type not in ("flagos", "cpu"):
                verdict.fail("forward", f"forward result {k} is on {a.device}")
    verdict.add("forward", compare.compare_alias_patterns(run.alias, shape_source.alias))
    reduce = _reduce(reference.inputs, reference.forward.values or [])
    for name in PARTS:
        part = run.part(name)
        if part is None:
            continue
        base = baseline.part(name)
        if base is None or base.error is not None:
            continue  # the part does not apply to this sample (the CPU rejects it too)
        verdict.claimed.add(name)
        if part.error is not None:
            verdict.fail(name, f"{name} raised {part.error}")
            continue
        # A contract problem the CPU kernel shares is PyTorch's behaviour (addbmm_ resizes a
        # broadcast `self`, for one), not a flagos one.
        verdict.add(name, [p for p in part.problems if p not in base.problems])
        dtypes = dtypes_of(base, dtype)
        if random:
            expected = values_from.part(name) if values_from is not None else None
            if expected is not None and expected.values is not None:
                verdict.compared.add(name)
                verdict.add(name, [p + " (same seed)" for p in compare_part(part, expected, dtypes, 1)])
            elif run.repeat is not None:
                verdict.compared.add(name)  # judged by reproducibility, below
            else:
                verdict.baseline_skipped[name] = "random, and no same-seed run to compare with"
            continue
        why_not = health.get(name)
        if why_not is not None:
            verdict.baseline_skipped[name] = f"the CPU baseline misses the float64 reference: {why_not}"
            continue
        ref = reference.part(name)
        expected = ref if ref is not None and ref.error is None and ref.values is not None else base
        part_reduce = reduce if name != "backward" else max(reduce, _reduce(reference.inputs, expected.values or []))
        verdict.compared.add(name)
        verdict.add(name, compare_part(part, expected, dtypes, part_reduce))
    if random and run.repeat is not None:
        if run.repeat.error is not None:
            verdict.fail("forward", f"second forward with the same seed raised {run.repeat.error}")
        else:
            first = Part(values=list(run.forward.values or []) * REPEATS)
            mismatch = compare_part(run.repeat, first, dtypes_of(first, dtype), 1)
            if mismatch:
                verdict.fail("forward", "not reproducible: the same seed gave different results (" + mismatch[0] + ")")
    return verdict


def summarize(problems: list[str]) -> str:
    """The first few problems, and how many more there were."""
    shown = problems[:MAX_PROBLEMS]
    more = len(problems) - len(shown)
    return "; ".join(shown) + (f"; and {more} more" if more > 0 else "")
