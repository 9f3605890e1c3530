"""Running one generated call on a flagos device and judging a path's run against the native one.

A call's tensors are planned once on the CPU (values, and the view that lays them out) and placed
afresh for every run on the device of the case (`flagos`, or another index: `flagos:1`), so the
native route and each path see the same inputs in the same layout.
Values are random (randn; small nonzero integers), or special ones of a kind named in
conformance/sizes.py VALUE_KINDS: extremes, non-finite values, signed zeros, subnormals, ties.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from torch_fl.conformance import compare
from torch_fl.conformance.sizes import GUARD
from torch_fl.conformance.sweepgen import Call
from torch_fl.numerics import reduction_length


@dataclass
class Planned:
    """A tensor argument: values made once on the CPU, laid out by `view` on the device of a run."""

    base: torch.Tensor
    view: Callable[[torch.Tensor], torch.Tensor]
    guarded: bool = False  # base is GUARD elements either side of the view


def _values(shape: tuple[int, ...], dtype: torch.dtype, g: torch.Generator, values: str | None = None) -> torch.Tensor:
    """Input values: random (`values` None), or special ones of that kind."""
    if values is not None:
        return _special(shape, dtype, g, values)
    if dtype == torch.bool:
        return torch.randint(0, 2, shape, generator=g).bool()
    if dtype.is_floating_point or dtype.is_complex:
        return torch.randn(shape, generator=g, dtype=torch.float64).to(dtype)
    magnitude = torch.randint(1, 6, shape, generator=g)  # no zeros: integer division by zero raises
    if dtype in (torch.uint8, torch.uint16, torch.uint32, torch.uint64):
        return magnitude.to(dtype)
    sign = torch.randint(0, 2, shape, generator=g) * 2 - 1
    return (magnitude * sign).to(dtype)


_DENSITY = {"extremal": 1 / 16, "extremal-sparse": 1 / 128}
_UNSIGNED = (torch.uint8, torch.uint16, torch.uint32, torch.uint64)


def _row_sign(shape: tuple[int, ...]) -> torch.Tensor:
    """+1 on even rows (runs of the last dim), -1 on odd ones: a row's huge values share a sign."""
    n = math.prod(shape)
    width = shape[-1] if shape and shape[-1] else 1
    return (1 - 2 * ((torch.arange(n) // width) % 2)).reshape(shape).double()


def _extremal_floats(shape: tuple[int, ...], dtype: torch.dtype, g: torch.Generator, kind: str) -> torch.Tensor:
    """float64 values, exact in `dtype`: randn with 1 in `_DENSITY[kind]` replaced by special values."""
    fi = torch.finfo(dtype)
    inf, nan = float("inf"), float("nan")
    edge = [nan, inf, -inf, 0.0, -0.0, fi.tiny / 2, -fi.tiny / 2, fi.tiny * fi.eps, fi.tiny, -fi.tiny]
    huge = [fi.max, fi.max / 2] if kind == "extremal" else []
    table = torch.tensor(edge + huge, dtype=torch.float64)
    is_huge = torch.tensor([False] * len(edge) + [True] * len(huge))
    base = torch.randn(shape, generator=g, dtype=torch.float64)
    chosen = torch.rand(shape, generator=g, dtype=torch.float64) < _DENSITY[kind]
    which = torch.randint(len(table), shape, generator=g)
    special = torch.where(is_huge[which], table[which] * _row_sign(shape), table[which])
    return torch.where(chosen, special, base)


def _extremal_integers(shape: tuple[int, ...], dtype: torch.dtype, g: torch.Generator, kind: str) -> torch.Tensor:
    """Magnitudes 2..5 with 1 in `_DENSITY[kind]` replaced by the dtype's extremes (min + 1 too)."""
    info = torch.iinfo(dtype)
    unsigned = dtype in _UNSIGNED
    magnitude = torch.randint(2, 6, shape, generator=g)  # no 0 and no -1: x // 0 and min // -1 trap
    sign = torch.ones(shape, dtype=torch.int64) if unsigned else torch.randint(0, 2, shape, generator=g) * 2 - 1
    if dtype == torch.uint64:
        table = [-1, -2]  # max and max - 1, beyond int64: they wrap to them in the cast below
    elif unsigned:
        table = [info.max, info.max - 1]  # min is 0: division by zero
    else:
        table = [info.max, info.min, info.max - 1, info.min + 1]
    chosen = torch.rand(shape, generator=g, dtype=torch.float64) < _DENSITY[kind]
    which = torch.randint(len(table), shape, generator=g)
    return torch.where(chosen, torch.tensor(table)[which], magnitude * sign).to(dtype)


def _ties(shape: tuple[int, ...], dtype: torch.dtype, g: torch.Generator) -> torch.Tensor:
    """Few distinct values, every third row (run of the last dim) one value throughout."""
    if dtype == torch.bool:
        pool = [False, True]
    elif dtype.is_floating_point or dtype.is_complex:
        pool = [-1, 0, 1, 2]
    else:
        pool = [1, 2, 3] if dtype in _UNSIGNED else [-2, -1, 1, 2]  # no 0: integer division by zero raises
    table = torch.tensor(pool, dtype=torch.float64)
    t = table[torch.randint(len(pool), shape, generator=g)]
    if dtype.is_complex:
        t = torch.complex(t, table[torch.randint(len(pool), shape, generator=g)])
    if len(shape) >= 2 and t.numel():
        rows = t.reshape(-1, shape[-1])
        rows[::3] = rows[::3, :1].clone()
    return t.to(dtype)


def _special(shape: tuple[int, ...], dtype: torch.dtype, g: torch.Generator, kind: str) -> torch.Tensor:
    """Special inputs of `kind` (conformance/sizes.py VALUE_KINDS), made in a wide dtype and cast exactly."""
    if kind == "ties":
        return _ties(shape, dtype, g)
    if kind not in _DENSITY:
        raise ValueError(f"no special values named {kind!r}")
    if dtype == torch.bool:
        return torch.randint(0, 2, shape, generator=g).bool()
    if dtype.is_complex:
        real, imag = (_extremal_floats(shape, dtype, g, kind) for _ in range(2))  # finfo: the component's
        return torch.complex(real, imag).to(dtype)
    if dtype.is_floating_point:
        return _extremal_floats(shape, dtype, g, kind).to(dtype)
    return _extremal_integers(shape, dtype, g, kind)


def plan_tensor(
    shape: tuple[int, ...],
    dtype: torch.dtype,
    layout: str | None,
    guarded: bool,
    g: torch.Generator,
    values: str | None = None,
) -> tuple[Planned, bool]:
    """The tensor of logical `shape` in `layout`; also whether the layout applied to it. `values`
    names a kind of special inputs (conformance/sizes.py VALUE_KINDS); None: random ones."""
    n = 1
    for s in shape:
        n *= s

    def fill(dims: tuple[int, ...]) -> torch.Tensor:
        return _values(dims, dtype, g, values)

    if guarded:
        return Planned(fill((GUARD + n + GUARD,)), lambda t: t[GUARD : GUARD + n].view(shape), True), False
    if layout == "transposed" and len(shape) >= 2:
        swapped = shape[:-2] + (shape[-1], shape[-2])
        return Planned(fill(swapped), lambda t: t.transpose(-1, -2)), True
    if layout == "strided" and len(shape) >= 1:
        wide = shape[:-1] + (2 * shape[-1],)
        return Planned(fill(wide), lambda t: t[..., ::2]), True
    if layout == "offset":
        return Planned(fill((n + 1,)), lambda t: t[1:].view(shape)), True
    if layout == "expanded" and len(shape) >= 1 and shape[0] > 1:
        return Planned(fill((1,) + shape[1:]), lambda t: t.expand(shape)), True
    if layout == "channels_last" and len(shape) == 4:
        return Planned(fill(shape), lambda t: t.contiguous(memory_format=torch.channels_last)), True
    if layout == "0-dim":
        return Planned(fill(()), lambda t: t), True
    if layout == "empty" and len(shape) >= 2:  # the batch dim; weights and biases keep their size
        return Planned(fill((0,) + shape[1:]), lambda t: t), True
    return Planned(fill(shape), lambda t: t), False


@dataclass
class Plan:
    """A call with planned tensors; `place` makes a fresh copy of it on a device."""

    call: Call
    overload: torch._ops.OpOverload

    def place(self, device: str) -> tuple[list[Any], dict[str, Any], list[tuple[Planned, torch.Tensor]]]:
        bases: list[tuple[Planned, torch.Tensor]] = []

        def put(value: Any) -> Any:
            if isinstance(value, Planned):
                base = value.base.to(device)
                bases.append((value, base))
                return value.view(base)
            return value

        return [put(a) for a in self.call.args], {k: put(v) for k, v in self.call.kwargs.items()}, bases


def _bits(t: torch.Tensor) -> torch.Tensor:
    flat = t.detach().cpu().reshape(-1).contiguous()
    return flat.view(torch.uint8) if flat.numel() else flat


def _same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(_bits(a), _bits(b))


@dataclass
class Observed:
    """One run of a call: its tensor outputs (device tensors), written targets, and what it broke."""

    outputs: list[Any]
    written: list[torch.Tensor]  # in-place self, or the out= tensors, after the call
    problems: list[str]


def leaves(result: Any) -> list[Any]:
    """An op's result as a list of its outputs."""
    return list(result) if isinstance(result, (tuple, list)) else [result]


def with_outs(call: Call, outs: dict[str, Planned] | None) -> Call:
    return call if outs is None else Call(call.args, {**call.kwargs, **outs}, call.out_slots, call.inplace)


def run_call(
    plan: Plan,
    outs: dict[str, Planned] | None,
    judge_inputs: bool,
    route: Callable[[], Any] = contextlib.nullcontext,
    device: str = "flagos",
) -> Observed:
    """Call the overload with a fresh copy of the planned arguments on `device` (a flagos device
    string), inside `route()` only (the copies and checks around it run on the native route)."""
    call = with_outs(plan.call, outs)
    args, kwargs, bases = Plan(call, plan.overload).place(device)
    targets = [args[0]] if call.inplace else [kwargs[name] for _, name in call.out_slots]
    target_ids = {id(t) for t in targets}
    before_inputs = [
        (i, _bits(a)) for i, a in enumerate(args) if isinstance(a, torch.Tensor) and id(a) not in target_ids
    ]
    before_bases = [(base, _bits(base)) for planned, base in bases if planned.guarded]
    storages = [t.untyped_storage().data_ptr() for t in targets]
    with route():
        result = plan.overload(*args, **kwargs)
    problems: list[str] = []
    returned = leaves(result)
    for i, target in enumerate(targets):
        what = "self" if call.inplace else f"out {call.out_slots[i][1]!r}"
        got = returned[i] if i < len(returned) else None
        if not isinstance(got, torch.Tensor) or got.data_ptr() != target.data_ptr():
            problems.append(f"returned a new tensor, not {what}")
        if target.untyped_storage().data_ptr() != storages[i]:
            problems.append(f"{what} got new storage")
    for base, before in before_bases:
        edge = GUARD * base.element_size()  # bytes of guard on each side
        after = _bits(base)
        if not (torch.equal(after[:edge], before[:edge]) and torch.equal(after[-edge:], before[-edge:])):
            problems.append("wrote past the end of its output (guard elements changed)")
    if judge_inputs:
        for i, before in before_inputs:
            if not torch.equal(_bits(args[i]), before):
                problems.append(f"changed its input {i}")
    return Observed(returned, targets, problems)


def _is_fp8(dtype: torch.dtype) -> bool:
    return "float8" in str(dtype)


def compare_runs(
    got: Observed, native: Observed, dtype: torch.dtype, inputs: list[torch.Tensor], signed_zeros: bool = False
) -> list[str]:
    """Values, metadata and device of every output and written target of `got` against `native`;
    `signed_zeros`: a zero's sign must be the native's too."""
    problems: list[str] = []
    pairs = list(zip(got.outputs, native.outputs)) + list(zip(got.written, native.written))
    for i, (a, e) in enumerate(pairs):
        if not isinstance(e, torch.Tensor):
            why = compare.compare_value(a, e, dtype)
            if why:
                problems.append(f"output {i}: {why}")
            continue
        if not isinstance(a, torch.Tensor):
            problems.append(f"output {i}: got {type(a).__name__}, expected a tensor")
            continue
        problems += [f"output {i}: {p}" for p in compare.compare_metadata(a, e)]
        if a.device != e.device:
            problems.append(f"output {i}: on {a.device}, expected {e.device}")
        if a.dtype != e.dtype or a.shape != e.shape:
            continue
        if _is_fp8(e.dtype):
            if not _same_bits(a, e):
                problems.append(f"output {i}: FP8 bits differ from the native route's")
            continue
        reduce = reduction_length(inputs, e) if e.dim() else max(1, max((t.numel() for t in inputs), default=1))
        why = compare.compare_tensor(a, e.cpu(), e.dtype, reduce, signed_zeros=signed_zeros)
        if why:
            problems.append(f"output {i}: {why}")
    return problems


def same_results(first: Observed, second: Observed) -> bool:
    pairs = list(zip(first.outputs, second.outputs)) + list(zip(first.written, second.written))
    return all(not isinstance(a, torch.Tensor) or (isinstance(b, torch.Tensor) and _same_bits(a, b)) for a, b in pairs)


class NativeReference:
    """The native route's run of a call, which every path is judged against, and whether the route
    reproduces it: found by a second run made only when a judgment needs it (a path whose two runs
    differ, or signed zeros), since the largest calls cost seconds per run on a host backing."""

    def __init__(self, first: Observed, rerun: Callable[[], Observed]) -> None:
        self.result = first
        self._rerun = rerun
        self._deterministic: bool | None = None

    @property
    def deterministic(self) -> bool:
        if self._deterministic is None:
            self._deterministic = same_results(self.result, self._rerun())
        return self._deterministic

    def nondeterminism(self, got: Observed, second: Observed) -> list[str]:
        """The problem with a path whose two identical calls differ where the native route's agree."""
        if same_results(got, second) or not self.deterministic:
            return []
        return ["not deterministic: two identical calls differ, where the native route's agree"]
