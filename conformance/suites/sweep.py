"""sweep: every op a platform routes to a path it must prove, at many sizes, layouts and dtype mixes.

One pytest item per op x dtype (the descriptor's dtypes, or the op's own operand dtypes in
OPERAND_DTYPES), for each op some gated kernel set (flaggems, vendor, emulated) implements;
`native` is the reference and `cpu` runs PyTorch's own CPU kernels, so neither is swept. The
item's cases come from conformance/sizes.py by the op's category (conformance/sweepgen.py), in
this order (a case's name says which it is):

- `size=`: sizes around powers of two up to every size class of the gate key;
- `vary=<dim>,size=`: one dimension at a time around powers of two up to a realistic extent, the
  others small (matmul K, M, N; a norm's row length in 2-D and 3-D inputs; attention's sequence;
  a reduction's extent and rows; conv channels and spatial dims);
- `size=...,<argument>=<value>`: each value of an argument that picks another code path
  (sweepgen.SELECTORS: keepdim, a reduction's dim, rounding_mode, approximate, ...) at every size
  case above;
- `layout=`: every layout (transposed, strided, offset, expanded, channels_last, 0-dim, empty) at
  a small size, and for elementwise ops transposed, strided, offset and expanded at every size
  class too (`layout=...,size=`);
- `mixed:`: dtype mixes (a second operand of another dtype or 0-dim, `out=` of another dtype,
  `dtype=`);
- `device=<i>,current=<c>,`: where the platform exposes several devices, a sample (two sizes, one
  layout) with the inputs on each other index i, once with i current and once with 0 current;
- `special=`: special values (below).

Each call is made once on the native route and once per path with the same inputs on the same
device (conformance/sweepcall.py), and the path must:

- give the native values (FlagGems tolerances at the op's dtype, atol scaled by the reduction
  length; integers, bool and FP8 exact) with the native dtype, shape, strides and device;
- leave its inputs as they were; write an in-place `self` and return it, in the same storage;
  write `out=` and return it; write nothing in the guard elements around an in-place or `out=`
  target (size cases);
- give bitwise-equal results on two identical calls where the native route does;
- on special inputs (`special=extremal`: NaN, +-inf, +-0.0, subnormals, the dtype's extremes, and
  finite values whose sum overflows; `special=ties`: many equal values, all-equal rows; the kinds
  in conformance/sizes.py VALUE_KINDS), at a small and a medium size: NaN exactly where the native
  result has NaN, infinities equal, the sign of every zero the native's (where the native route's
  results are reproducible), and an index-returning reduction the first index of equal values,
  as PyTorch defines it (index outputs are exact, as every integer output).

A case is `sweep/<op>/<dtype>/<path>/<case>/<gate key>`: the gate enables the path for exactly
the keys whose cases passed. A kernel that crashes or hangs fails the key in flight; the item
goes on with its next case in a fresh worker (later cases whose dtypes failed on a path, at any
size, are skipped: the gate refuses those dtypes at every size, and each crash or hang costs a
worker). The gate key does not name layouts, argument values or devices: a failure at any of them
refuses the op's dtypes at every size all the same. Ops without a generator are listed as skipped cases `sweep/<op>/-/<path>/not-swept`, with the reason.
"""

from __future__ import annotations

import dataclasses
import functools
import zlib
from dataclasses import dataclass, field
from typing import Any

import pytest
import torch

from torch_fl.conformance import compare
from torch_fl.conformance.sizes import (
    DIM_SWEEPS,
    EXTREMAL_KIND,
    HEAVY,
    LAYOUT_DIMS,
    LAYOUT_SIZES,
    LAYOUTS,
    LIMIT_PROBES,
    MIXED_SIZES,
    SIZED_LAYOUTS,
    SIZES,
    SPECIAL_SIZES,
)
from torch_fl.conformance.sweepcall import (
    NativeReference,
    Plan,
    Planned,
    compare_runs,
    leaves,
    plan_tensor,
    run_call,
    with_outs,
)
from torch_fl.conformance.sweepgen import (
    NotSwept,
    build,
    category,
    selector_variants,
    tensor_shapes,
    writes_self,
)
from torch_fl.platform.extents import extent_function
from torch_fl.platform.gating import fits
from torch_fl.platform.record import GATED_PATHS, without_size
from torch_fl.routing.constraints import refusal
from torch_fl.routing.gatekey import call_key

SUITE = "sweep"
KWARG_VARIANTS: dict[str, tuple[dict[str, Any], ...]] = {
    "aten::_to_copy": ({"dtype": torch.float8_e4m3fn}, {"dtype": torch.float8_e5m2}),
    "aten::_scaled_mm": ({"out_dtype": torch.bfloat16},),
}
"""Keyword variants an op's size cases also run with (each a gate key of its own)."""
BASE_KWARGS: dict[str, dict[str, Any]] = {"aten::_scaled_mm": {"out_dtype": torch.float32}}
"""Keyword arguments every case of an op sets (an FP8 matmul's result in float32, not rounded to FP8)."""
OPERAND_DTYPES: dict[str, tuple[str, ...]] = {"aten::_scaled_mm": ("float8_e4m3fn", "float8_e5m2")}
"""Ops whose operands come in dtypes of their own, not the platform's declared ones: their items."""
LAYOUT_CATEGORIES: dict[str, frozenset[str]] = {
    "0-dim": frozenset({"elementwise", "reduction"}),
    "empty": frozenset({"elementwise", "reduction", "norm"}),
    "channels_last": frozenset({"elementwise", "conv"}),
}
"""Layouts that apply to some categories only (the others apply to every category)."""
ROLE_DTYPES: dict[str, torch.dtype] = {
    "condition": torch.bool,
    "mask": torch.bool,
    "scale_a": torch.float32,
    "scale_b": torch.float32,
    "scale_result": torch.float32,
}
"""Tensor arguments whose dtype the op fixes, whatever the dtype of the case."""
FOUR_D = (2, 3, 5, 7)
"""The elementwise dims of the channels_last case."""


# ---- which ops, on which paths
def _session(config: pytest.Config) -> Any:
    worker = config.pluginmanager.get_plugin("fl-worker")
    return worker.ready_session() if worker is not None else None


def swept_paths(fl: Any, op: str) -> list[str]:
    """The gated paths that implement `op` and may run it (selected, not refused by the router)."""
    return [p for p in sorted(GATED_PATHS) if fl.selected(p) and fl.implements(op, p) and not refusal(op, p)]


def swept_ops(fl: Any) -> list[str]:
    from torch_fl.routing import router

    ops: set[str] = set()
    for path in GATED_PATHS:
        kernels = router().kernel_sets.get(path)
        if kernels is not None and fl.selected(path):
            ops |= {op for op in kernels.ops() if not refusal(op, path)}
    if fl.sweep == "routed":
        ops &= fl.routed_off_native
    return sorted(ops)


def _overload(op: str) -> torch._ops.OpOverload:
    from torch_fl.kernels.base import resolve

    return resolve(op)


def _generated(op: str) -> str | None:
    """Why `op` is not swept (None: it is)."""
    try:
        category(_overload(op))
    except AttributeError:
        return "not an op of this torch"
    except NotSwept as exc:
        return str(exc)
    return None


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "sweep_op" not in metafunc.fixturenames:
        return
    params, ids = [], []
    try:
        fl = _session(metafunc.config)
    except RuntimeError:
        fl = None  # the platform cannot start: the item below fails with the reason
    if fl is None:
        metafunc.parametrize(("sweep_op", "dtype"), [("-", "-")], ids=["platform"])
        return
    dtypes = list(fl.descriptor.capabilities.dtypes)
    for op in swept_ops(fl):
        if _generated(op) is None:
            for d in OPERAND_DTYPES.get(op, dtypes):
                params.append((op, d))
                ids.append(f"{op}-{d}")
    metafunc.parametrize(("sweep_op", "dtype"), params, ids=ids)


def test_not_swept(fl: Any) -> None:
    """One skipped case per op x path without a generator: the record says what the sweeps miss."""
    fl.own_cases()
    for op in swept_ops(fl):
        why = _generated(op)
        if why is None:
            continue
        for path in swept_paths(fl, op):
            case_id = f"{SUITE}/{op}/-/{path}/not-swept"
            if not fl.done(case_id):
                with fl.case(case_id, SUITE, op=op, path=path) as case:
                    case.skip(f"not swept: {why}")


# ---- the cases of one op x dtype
@dataclass
class Spec:
    """One generated call: dims of its category, and how it departs from the plain call."""

    name: str
    dims: tuple[int, ...]
    layout: str | None = None
    role_dtype: dict[str, torch.dtype] = field(default_factory=dict)  # tensor role -> its dtype
    zero_dim: frozenset[str] = frozenset()  # tensor roles made 0-dim
    extra: dict[str, Any] = field(default_factory=dict)  # keyword arguments set
    out_dtype: torch.dtype | None = None
    guarded: bool = False
    values: str | None = None  # a kind of special inputs (sizes.VALUE_KINDS); None: random ones
    device: int | None = None  # the flagos index the inputs go to; None: the current device
    current: int | None = None  # the device index made current around the calls; None: left as it is
    probe: bool = False  # tries a declared limit: runs on a path even outside its declared limits

    @property
    def place(self) -> str:
        """The device string the inputs go to."""
        return "flagos" if self.device is None else f"flagos:{self.device}"


def _dims_name(dims: tuple[int, ...]) -> str:
    return "x".join(map(str, dims))


def _tensor_roles(overload: torch._ops.OpOverload) -> list[str]:
    return [
        a.name
        for a in overload._schema.arguments
        if str(getattr(a, "real_type", a.type)) in ("Tensor", "Optional[Tensor]")
        and not (a.kwarg_only and a.alias_info is not None and a.alias_info.is_write)
    ]


def _has_out(overload: torch._ops.OpOverload) -> bool:
    return any(a.kwarg_only and a.alias_info is not None and a.alias_info.is_write for a in overload._schema.arguments)


def _mixes(overload: torch._ops.OpOverload, cat: str, dtype: torch.dtype) -> list[tuple[str, dict[str, Any]]]:
    """(name, Spec fields) of the dtype mixes that apply: each a gate key of its own."""
    out: list[tuple[str, dict[str, Any]]] = []
    roles = _tensor_roles(overload)
    if len(roles) >= 2 and cat == "elementwise":  # type promotion between operands
        other = roles[1]
        if dtype.is_floating_point:
            out.append((f"{other}=int64", {"role_dtype": {other: torch.int64}}))
            out.append((f"{other}=float32[]", {"role_dtype": {other: torch.float32}, "zero_dim": frozenset({other})}))
        else:
            out.append((f"{other}=bfloat16", {"role_dtype": {other: torch.bfloat16}}))
    if _has_out(overload):
        wider = torch.float64 if dtype.is_floating_point or dtype.is_complex else torch.int64
        if wider != dtype:
            out.append((f"out={str(wider).removeprefix('torch.')}", {"out_dtype": wider}))
    names = {a.name for a in overload._schema.arguments}
    if {"mean", "rstd"} <= names and dtype in (torch.float16, torch.bfloat16):
        # saved statistics in float32, as CUDA's layer norm keeps them (the CPU's are in the input dtype)
        out.append(("mean,rstd=float32", {"role_dtype": {"mean": torch.float32, "rstd": torch.float32}}))
    if "dtype" in names and not (dtype.is_floating_point or dtype.is_complex):
        for target in (torch.int64, torch.float32):
            out.append((f"dtype={str(target).removeprefix('torch.')}", {"extra": {"dtype": target}}))
    return out


def special_kinds(cat: str, dtype: torch.dtype) -> list[str]:
    """The kinds of special inputs a case of `cat` in `dtype` gets (bool has no extremes)."""
    return ["ties"] + ([EXTREMAL_KIND[cat]] if dtype != torch.bool else [])


def _words(extra: dict[str, Any]) -> str:
    """Keyword arguments as a case name's part: `keepdim=True,dtype=float32`."""
    return ",".join(f"{k}={str(v).removeprefix('torch.')}" for k, v in extra.items())


def _dim_sweeps(overload: torch._ops.OpOverload, cat: str) -> list[tuple[str, tuple[int, ...]]]:
    """(varied dimension, dims) of the category's one-dimension sweeps, without repeats: an op that
    ignores a dimension (N of a matrix-vector product) would run the same call again."""
    packet = overload._schema.name.split("::", 1)[1]
    roles = _tensor_roles(overload)
    seen, out = set(), []
    for varied, all_dims in DIM_SWEEPS.get(cat, {}).items():
        for dims in all_dims:
            shape_of = tensor_shapes(cat, packet, dims)
            shapes = tuple(shape_of(role) for role in roles)
            if shapes not in seen:
                seen.add(shapes)
                out.append((varied, dims))
    return out


def _device_specs(cat: str, sized: bool, base: dict[str, Any], devices: int) -> list[Spec]:
    """A sample on each device index but 0 (SPECIAL_SIZES with random values, and one layout), once
    with that index current and once with 0 current: a kernel may use the current device's state."""
    sample = [(f"size={_dims_name(dims)}", dims, None) for dims in (SPECIAL_SIZES[cat] if sized else ())]
    sample.append(("layout=transposed", LAYOUT_DIMS[cat], "transposed"))
    return [
        Spec(
            f"device={index},current={current},{name}",
            dims,
            layout=layout,
            extra=dict(base),
            device=index,
            current=current,
        )
        for index in range(1, devices)
        for current in (0, index)
        for name, dims, layout in sample
    ]


def _limit_specs(cat: str, declared: dict[str, tuple[int, int]], base: dict[str, Any]) -> list[Spec]:
    """Both sides of each declared limit (`declared`: extent -> (min, max or -1)) that the
    category can vary on its own: the last extent in and the first out."""
    out = []
    for name, (low, high) in sorted(declared.items()):
        edges = ([low - 1, low] if low > 0 else []) + ([high, high + 1] if high >= 0 else [])
        for template in LIMIT_PROBES.get(cat, {}).get(name, ()):
            for value in edges:
                dims = tuple(value if d == 0 else d for d in template)
                out.append(
                    Spec(f"limit={name},size={_dims_name(dims)}", dims, extra=dict(base), guarded=True, probe=True)
                )
    return out


def specs(
    op: str,
    overload: torch._ops.OpOverload,
    cat: str,
    dtype: torch.dtype,
    devices: int = 1,
    declared: dict[str, tuple[int, int]] | None = None,
) -> list[Spec]:
    """Every case of `op` in `dtype` on a platform of `devices` device indices: sizes, kwarg variants,
    one-dimension sweeps, layouts, dtype mixes, each of those at every selector value, other devices,
    special values, and both sides of the `declared` limits. New kinds of cases come after the older
    ones, so that those keep their place in a run."""
    floating = dtype.is_floating_point or dtype.is_complex
    sized = floating or cat not in HEAVY
    base = BASE_KWARGS.get(op, {})
    sizes: list[Spec] = []
    for dims in SIZES[cat] if sized else ():
        sizes.append(Spec(f"size={_dims_name(dims)}", dims, extra=dict(base), guarded=True))
        for extra in KWARG_VARIANTS.get(op, ()):
            sizes.append(Spec(f"size={_dims_name(dims)},{_words(extra)}", dims, extra={**base, **extra}, guarded=True))
    swept = [
        Spec(f"vary={varied},size={_dims_name(dims)}", dims, extra=dict(base), guarded=True)
        for varied, dims in (_dim_sweeps(overload, cat) if sized else ())
    ]
    laid = []
    for layout in LAYOUTS:
        if cat in LAYOUT_CATEGORIES.get(layout, frozenset({cat})):
            dims = FOUR_D if (layout == "channels_last" and cat == "elementwise") else LAYOUT_DIMS[cat]
            laid.append(Spec(f"layout={layout}", dims, layout=layout, extra=dict(base)))
    for layout in SIZED_LAYOUTS:
        for dims in LAYOUT_SIZES.get(cat, ()):
            laid.append(Spec(f"layout={layout},size={_dims_name(dims)}", dims, layout=layout, extra=dict(base)))
    mixed = []
    for dims in MIXED_SIZES.get(cat, (LAYOUT_DIMS[cat],)):
        for name, fields in _mixes(overload, cat, dtype):
            fields = {**fields, "extra": {**base, **fields.get("extra", {})}}
            mixed.append(Spec(f"mixed:{name},size={_dims_name(dims)}", dims, **fields))
    variants = selector_variants(overload, cat)

    def selected(plain: list[Spec]) -> list[Spec]:
        # every gate key the plain cases prove (a 0-dim input, a dtype mix) is proven at each value
        return [
            dataclasses.replace(spec, name=f"{spec.name},{_words(extra)}", extra={**spec.extra, **extra})
            for extra in variants
            for spec in plain
        ]

    out = sizes + swept + selected(sizes + swept) + laid + mixed + selected(laid + mixed)
    out += _device_specs(cat, sized, base, devices)
    # last, so that the cases above keep their place in a run; each has its own seed (by name) anyway
    for kind in special_kinds(cat, dtype):
        for dims in SPECIAL_SIZES[cat]:
            name = f"special={kind.split('-')[0]},size={_dims_name(dims)}"
            out.append(Spec(name, dims, extra=dict(base), values=kind))
    return out + (_limit_specs(cat, declared, base) if declared and sized else [])


def make_plan(overload: torch._ops.OpOverload, cat: str, spec: Spec, dtype: torch.dtype, seed: int) -> Plan:
    """The planned call of `spec`; NotSwept when the spec's layout applies to none of its tensors."""
    g = torch.Generator().manual_seed(seed)
    applied = []
    first = _tensor_roles(overload)[:1]
    inplace_self = writes_self(overload)

    def make(role: str, shape: tuple[int, ...]) -> Planned:
        if role in spec.zero_dim:
            shape = ()
        guarded = spec.guarded and inplace_self and role in first
        role_dtype = spec.role_dtype.get(role, ROLE_DTYPES.get(role, dtype))
        values = None if role in ROLE_DTYPES else spec.values  # a mask or a scale keeps ordinary values
        planned, did = plan_tensor(shape, role_dtype, spec.layout, guarded, g, values)
        applied.append(did)
        return planned

    call = build(overload, cat, spec.dims, make, spec.extra)
    if spec.layout is not None and not any(applied):
        raise NotSwept(f"layout {spec.layout} applies to no input")
    return Plan(call, overload)


# ---- out= targets
def _out_buffers(plan: Plan, out_like: list[torch.Tensor], spec: Spec) -> dict[str, Planned]:
    """Guarded out= targets shaped like the native outputs (in the spec's out dtype, if any)."""
    g = torch.Generator().manual_seed(7)
    buffers = {}
    for (_, name), like in zip(plan.call.out_slots, out_like):
        dtype = spec.out_dtype or like.dtype
        buffers[name], _ = plan_tensor(tuple(like.shape), dtype, None, True, g)
    return buffers


def _seed(*parts: str) -> int:
    return zlib.crc32("/".join(parts).encode()) % (2**31)


def test_sweep(sweep_op: str, dtype: str, fl: Any) -> None:
    fl.own_cases()
    # The first stride comparison imports sympy (seconds): do it here, outside any case's time limit.
    compare.compare_metadata(torch.empty(2, 3), torch.empty(2, 3))
    op = sweep_op
    overload = _overload(op)
    cat = category(overload)
    torch_dtype = getattr(torch, dtype)
    paths = swept_paths(fl, op)
    base_id = f"{SUITE}/{op}/{dtype}"
    declared = _declared(fl, op, paths)
    for spec in specs(op, overload, cat, torch_dtype, torch.flagos.device_count(), _probed(declared)):
        ids = {p: f"{base_id}/{p}/{spec.name}" for p in paths}
        todo = [p for p in paths if not fl.done(ids[p])]
        if not todo:
            continue
        try:
            plan = make_plan(overload, cat, spec, torch_dtype, _seed(op, dtype, spec.name))
        except NotSwept:
            continue  # the spec does not apply to this op (a layout on none of its inputs)
        with torch.flagos.device(spec.current):  # None: leaves the current device as it is
            _run_spec(fl, op, dtype, spec, plan, ids, todo)


def _declared(fl: Any, op: str, paths: list[str]) -> dict[str, dict[str, tuple[int, int]]]:
    """path -> the limits its descriptor entry declares for `op` (extent -> (min, max or -1))."""
    out = {}
    for path in paths:
        limits = fl.descriptor.kernels.constraints(path).get(op, {})
        if limits:
            out[path] = {n: (lim.min or 0, -1 if lim.max is None else lim.max) for n, lim in limits.items()}
    return out


def _probed(declared: dict[str, dict[str, tuple[int, int]]]) -> dict[str, tuple[int, int]]:
    """Every limit any path declares (each probed on every path: a probe is cheap, and shows where
    the other paths stand)."""
    return {name: limit for limits in declared.values() for name, limit in limits.items()}


def inside_declared(
    fl: Any, op: str, paths: list[str], ids: dict[str, str], dtype: str, extents: dict[str, int]
) -> list[str]:
    """The paths of `paths` whose declared limits take a call of these extents; the others are
    skipped: the runtime never sends it them, so it proves and refuses nothing there."""
    declared = _declared(fl, op, paths)
    left = []
    for path in paths:
        if path in declared and not fits(declared[path], extents):
            _skip_all(fl, ids, [path], op, dtype, f"outside the limits {path} declares for {op}: {declared[path]}")
        else:
            left.append(path)
    return left


def _synchronize(fl: Any, spec: Spec) -> None:
    """Wait for the work queued on the spec's device (fl.synchronize waits for the current one)."""
    with torch.flagos.device(spec.device):
        fl.synchronize()


def _run_spec(fl: Any, op: str, dtype: str, spec: Spec, plan: Plan, ids: dict[str, str], todo: list[str]) -> None:
    """The native runs of one case, then each path's in `todo`, judged against them."""
    overload = plan.overload
    torch_dtype = getattr(torch, dtype)
    inplace = writes_self(overload)
    try:
        outs = None
        if plan.call.out_slots:
            probe = {
                name: torch.empty(0, dtype=spec.out_dtype or torch_dtype, device=spec.place)
                for _, name in plan.call.out_slots
            }
            probe_args, probe_kwargs, _ = Plan(plan.call, overload).place(spec.place)
            probed = leaves(overload(*probe_args, **{**probe_kwargs, **probe}))
            outs = _out_buffers(plan, [t for t in probed if isinstance(t, torch.Tensor)], spec)
        cpu_args, cpu_kwargs, _ = Plan(with_outs(plan.call, outs), overload).place("cpu")
        if not spec.probe:
            todo = inside_declared(fl, op, todo, ids, dtype, extent_function(op)(tuple(cpu_args), cpu_kwargs))
        todo = _not_refused(fl, ids, todo, op, dtype, call_key(overload, tuple(cpu_args), cpu_kwargs).text)
        if not todo:
            return  # before the native runs: the largest cases cost seconds each
        native = NativeReference(
            run_call(plan, outs, judge_inputs=not inplace, device=spec.place),
            functools.partial(run_call, plan, outs, judge_inputs=False, device=spec.place),
        )
        _synchronize(fl, spec)
    except Exception as exc:  # the native route rejects this call: nothing to compare a path with
        if spec.layout is None and not spec.name.startswith("mixed"):
            why = f"the native route rejects this call: {type(exc).__name__}: {str(exc)[:300]}"
            _skip_all(fl, ids, todo, op, dtype, why)
        return
    inputs = [t for t in cpu_args if isinstance(t, torch.Tensor)]
    for path in todo:
        with fl.case(ids[path], SUITE, op=op, dtype=dtype, path=path) as case:
            fl.recorder.phase(spec.name)
            forced = functools.partial(fl.forced, op, path)
            got = run_call(plan, outs, judge_inputs=not inplace, route=forced, device=spec.place)
            second = run_call(plan, outs, judge_inputs=False, route=forced, device=spec.place)
            _synchronize(fl, spec)
            # special inputs: the sign of a zero counts too, where the native route's own is reproducible
            signed_zeros = spec.values is not None and native.deterministic
            problems = got.problems + compare_runs(got, native.result, torch_dtype, inputs, signed_zeros)
            _conclude(case, problems + native.nondeterminism(got, second))


def _not_refused(fl: Any, ids: dict[str, str], todo: list[str], op: str, dtype: str, key: str) -> list[str]:
    """The paths of `todo` that no earlier case of the key's dtypes failed on (at any size); the
    others are skipped: the gate refuses those dtypes at every size now, and a crash or hang would
    cost a worker."""
    mine = without_size(key)
    left = []
    for path in todo:
        refused = next(
            (k for o, p, k in fl.recorder.failed_keys if (o, p) == (op, path) and without_size(k) == mine), None
        )
        if refused is None:
            left.append(path)
        else:
            _skip_all(fl, ids, [path], op, dtype, f"its dtypes already failed on {path} ({refused})")
    return left


def _skip_all(fl: Any, ids: dict[str, str], todo: list[str], op: str, dtype: str, why: str) -> None:
    for path in todo:
        with fl.case(ids[path], SUITE, op=op, dtype=dtype, path=path) as case:
            case.skip(why)


def _conclude(case: Any, problems: list[str]) -> None:
    """One verdict for every gate key the forced calls reached."""
    if problems:
        status, message = "failed", "; ".join(problems)[:2000]
    elif not case.keys:
        status, message = "unjudged", "the forced path was never reached"
    else:
        status, message = "passed", ""
    if status == "failed":
        case.fail(message)
    if case.keys:
        case.by_key = {key: (status, message) for key in case.keys}
    elif status == "unjudged":
        case.unjudged(message)
