"""The router: turns the active platform's routes into PrivateUse1 kernels, per op.

For each aten overload the candidates come from (first match wins): the API, FLAGOS_ROUTE_<op>,
a FLAGOS_ROUTES file or the platform's routes.yaml (its entry for the op), the descriptor's route
overrides, FLAGOS_ROUTE_DEFAULTS, the table's default order, the descriptor's route defaults (a
default candidate applies only to the ops its kernel set offers). At call time the candidates are filtered by the conformance gate for the call's gate key
(torch_fl.routing.gatekey: the dtypes of all its arguments and its size class) and its extents
(torch_fl.platform.extents: proven reach and declared limits), and a tuned shape bucket may pick
among them. Ops where only the C++ paths (native, cpu) can run
get no Python kernel at all: the C++ fallback serves them at C++ speed.
"""

from __future__ import annotations

import contextlib
import threading
import warnings
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, Optional

import torch

from torch_fl import env
from torch_fl.kernels.base import KernelSet, resolve
from torch_fl.kernels.native import NativeKernels
from torch_fl.kernels.registry import build_kernel_sets
from torch_fl.platform.extents import dim_refs, extent_function
from torch_fl.platform.gating import Limits, fits
from torch_fl.routing import overrides
from torch_fl.routing.constraints import refusal
from torch_fl.routing.gatekey import key_function, size_class_bounds
from torch_fl.routing.table import OpRoute, RouteTable

env.register(
    "FLAGOS_STRICT", "0", "Set to 1 to make a failing route raise instead of falling back to the next candidate."
)
env.register(
    "FLAGOS_LOG_FALLBACK", "0", "Set to 1 to log (once per op) every call served by the explicit CPU fallback."
)

C_PATHS = frozenset({"native", "cpu"})


@dataclass
class OpPlan:
    """Where one op's candidates come from, and the tuned buckets that refine them."""

    op: str
    candidates: list[str]
    source: str
    route: Optional[OpRoute] = None
    bypass_gate: bool = False
    python: bool = False  # serve through a Python kernel even when only native can run (to measure it)


@dataclass
class _Installed:
    library: torch.library.Library
    # gate key -> the paths that may serve it, and the extent limits of those that are limited
    per_key: dict[str, tuple[list[str], dict[str, Limits]]] = field(default_factory=dict)
    filter: Any = None  # the C++ route filter's handle: dropping it removes the filter


Span = tuple[Optional[torch.dtype], int, int, tuple[tuple[int, int], ...]]
"""(first tensor's dtype or None, min numel, max numel or -1, extent limits per dim_refs or ())."""


def size_span(key: str) -> tuple[int, int]:
    """(min, max or -1) numel of a gate key's size class."""
    low, high = size_class_bounds(key.rsplit("@", 1)[-1])
    return low, -1 if high is None else high


def bucket_spans(route: OpRoute, runnable: Callable[[str], bool] = lambda path: True) -> list[Span]:
    """The numel ranges, per dtype, whose tuned bucket chose a path other than native that
    `runnable` (the gate) lets run: a bucket on a path it refuses would run native anyway.

    A call takes the first bucket of its dtype (or of any dtype) that it fits in, so a bucket
    starts above the earlier buckets it shares calls with. For an any-dtype bucket only the
    earlier any-dtype ones count: the span may cover more than the bucket, never less (the Python
    kernel picks the bucket exactly).
    """
    spans: list[Span] = []
    for i, bucket in enumerate(route.buckets):
        earlier = [b.max_numel for b in route.buckets[:i] if b.dtype is None or b.dtype == bucket.dtype]
        low = max(earlier, default=-1) + 1
        if bucket.choice != "native" and bucket.max_numel >= low and runnable(bucket.choice):
            spans.append((getattr(torch, bucket.dtype) if bucket.dtype else None, low, bucket.max_numel, ()))
    return spans


def _merged(spans: list[Span]) -> list[Span]:
    return sorted(set(spans), key=lambda s: (str(s[0]), s[1]))


KeyListener = Callable[[str, str, dict[str, int]], None]
"""Told (op, gate key, extents) before a Python route kernel runs a call: how conformance learns
the keys and extents of the calls a case made (and which key was running when a kernel killed the
process)."""


class Router:
    """Owns the Python route kernels of one active platform."""

    def __init__(self, active: Any, kernel_sets: dict[str, KernelSet], table: RouteTable, table_source: str) -> None:
        self.active = active
        self.descriptor = active.descriptor
        self.gate = active.gate
        self.kernel_sets = kernel_sets
        self.table = table
        self.table_source = table_source
        self.api: dict[str, tuple[list[str], bool, bool]] = {}
        self.installed: dict[str, _Installed] = {}
        self.counts: Counter[tuple[str, str]] = Counter()
        self.outside: Counter[tuple[str, str]] = Counter()  # calls a path's extent limits sent on
        self.warned: set[str] = set()
        self.strict = env.flag("FLAGOS_STRICT")
        self.key_listener: Optional[KeyListener] = None
        self._lock = threading.RLock()

    # ---- which candidates an op has, and why
    def plan(self, op: str) -> OpPlan:
        if op in self.api:
            paths, bypass, python = self.api[op]
            return OpPlan(op, paths, "api", self.table.ops.get(op), bypass, python)
        from_env = overrides.env_route(op)
        if from_env:
            return OpPlan(op, from_env, f"env {overrides.env_name(op)}", self.table.ops.get(op))
        if op in self.table.ops:
            return OpPlan(op, list(self.table.ops[op].candidates), self.table_source, self.table.ops[op])
        if op in self.descriptor.routes.overrides:
            return OpPlan(op, list(self.descriptor.routes.overrides[op]), "descriptor routes.overrides")
        return OpPlan(op, self.default_candidates(), self.default_source())

    def default_candidates(self) -> list[str]:
        return overrides.env_defaults() or list(self.table.default or self.descriptor.routes.defaults)

    def default_source(self) -> str:
        if overrides.env_defaults():
            return "env FLAGOS_ROUTE_DEFAULTS"
        return f"{self.table_source} default" if self.table.default else "descriptor routes.defaults"

    def routed_ops(self) -> set[str]:
        """Every op some source names, plus what default candidates beyond native/cpu offer."""
        ops = set(self.api) | set(overrides.env_ops()) | set(self.table.ops) | set(self.descriptor.routes.overrides)
        for path in self.default_candidates():
            if path not in C_PATHS and path in self.kernel_sets:
                ops |= set(self.kernel_sets[path].ops())
        return ops

    def paths_for(self, plan: OpPlan, key: Optional[str]) -> list[str]:
        """The candidates that may run `plan.op` for a call of gate key `key` here, in order;
        `key` None: those that may run it for some key."""
        out = []
        for path in plan.candidates:
            kernels = self.kernel_sets.get(path)
            if kernels is None or not kernels.implements(plan.op) or refusal(plan.op, path):
                continue
            if plan.bypass_gate or self.gate.allows(plan.op, key, path):
                out.append(path)
        return out

    def python_spans(self, plan: OpPlan) -> Optional[list[Span]]:
        """Which calls of `plan.op` may take a path other than native, as (dtype or None, min numel,
        max numel or -1) spans of the C++ route filter: None for every call, [] for none (no Python
        kernel at all). Calls outside the spans never enter Python."""
        if plan.python:
            return None
        spans: list[Span] = []
        if plan.route is not None:
            # buckets are chosen per call; reading them asks no kernel library, so FlagGems
            # (seconds to import) stays out of activation until a call needs it
            spans += bucket_spans(plan.route, lambda path: plan.bypass_gate or self.gate.allows(plan.op, None, path))
        if plan.candidates[:1] != ["native"]:
            for path in plan.candidates:
                if path == "native":
                    break
                if path not in self.paths_for(OpPlan(plan.op, [path], plan.source, bypass_gate=plan.bypass_gate), None):
                    continue
                if path in C_PATHS or plan.bypass_gate or (self.gate.forced and not self.gate.declared(plan.op, path)):
                    return None
                if self.gate.forced:  # every size, within the declared limits
                    spans.append((None, 0, -1, self._span_limits(plan.op, path, "")))
                    continue
                keys = sorted(self.gate.proven_keys(plan.op, path))
                spans += [(None, *size_span(key), self._span_limits(plan.op, path, key)) for key in keys]
        return spans

    def _span_limits(self, op: str, path: str, key: str) -> tuple[tuple[int, int], ...]:
        if not self.gate.measures(op, path):
            return ()
        limits = self.gate.limits(op, path, key)
        return tuple(limits.get(ref.name, (0, -1)) for ref in dim_refs(op))

    # ---- installing kernels
    def install_all(self) -> None:
        with self._lock:
            for op in sorted(self.routed_ops()):
                self.refresh(op)

    def refresh(self, op: str) -> None:
        """(Re)install or remove the Python kernel of `op` to match its current plan."""
        with self._lock:
            plan = self.plan(op)
            current = self.installed.pop(op, None)
            if current is not None:
                current.library._destroy()
                current.filter = None  # its C++ filter leaves the op's PrivateUse1 slot
            spans = self.python_spans(plan)
            if spans == []:
                return
            try:
                overload = resolve(op)
            except AttributeError:
                return  # an op this torch does not have (validated at load for descriptor entries)
            native = self.kernel_sets["native"]
            assert isinstance(native, NativeKernels), "the native path is always the C++ core's"
            native.before_python_route(overload)
            library = torch.library.Library(overload._schema.name.split("::")[0], "IMPL")
            installed = _Installed(library)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # replacing PyTorch's own PrivateUse1 kernel is the point
                library.impl(
                    overload, self._kernel(op, overload, installed), "PrivateUse1" if spans is None else "PrivateUse2"
                )
            if spans is not None:
                from torch_fl.runtime import core

                refs = [(ref.arg, ref.dim if ref.arg >= 0 else i) for i, ref in enumerate(dim_refs(op))]
                installed.filter = core().install_route_filter(
                    op, _merged(spans), refs, native.serves_composite(overload)
                )
            self.installed[op] = installed

    def _kernel(self, op: str, overload: torch._ops.OpOverload, installed: _Installed) -> Callable[..., Any]:
        profiler_on = torch._C._autograd._profiler_enabled
        call_key = key_function(overload)
        measure = extent_function(op)

        def kernel(*args: Any, **kwargs: Any) -> Any:
            key = call_key(args, kwargs)
            entry = installed.per_key.get(key.text)
            if entry is None:
                entry = installed.per_key[key.text] = self._paths_and_limits(op, key.text)
            paths, limited = entry
            if self.key_listener is not None or limited:
                extents = measure(args, kwargs)
                if self.key_listener is not None:
                    self.key_listener(op, key.text, extents)
                if limited:
                    paths = self._within(op, paths, limited, extents)
            route = self.table.ops.get(op)
            if route is not None and route.buckets:
                bucket = route.bucket_for(key.numel, key.dtype)
                if bucket is not None and bucket.choice in paths:
                    paths = [bucket.choice] + [p for p in paths if p != bucket.choice]
            failure: Optional[BaseException] = None
            for path in paths:
                try:
                    if profiler_on():
                        with torch.profiler.record_function(f"flagos.route.{path}::{op}"):
                            result = self.kernel_sets[path].call(overload, args, kwargs)
                    else:
                        result = self.kernel_sets[path].call(overload, args, kwargs)
                except Exception as exc:
                    if self.strict:
                        raise
                    failure = exc
                    self._warn_once(op, path, exc)
                    continue
                self.counts[(op, path)] += 1
                return result
            assert failure is not None
            raise failure

        kernel.__name__ = f"flagos_route_{op.replace('::', '_').replace('.', '_')}"
        return kernel

    def _paths_and_limits(self, op: str, key: str) -> tuple[list[str], dict[str, Limits]]:
        plan = self.plan(op)
        paths = self.paths_for(plan, key) or ["native"]
        if plan.bypass_gate:
            return paths, {}
        return paths, {p: self.gate.limits(op, p, key) for p in paths if self.gate.measures(op, p)}

    def _within(self, op: str, paths: list[str], limited: dict[str, Limits], extents: dict[str, int]) -> list[str]:
        """The paths whose extent limits take this call; the others are counted as sent on."""
        kept = []
        for path in paths:
            if path in limited and not fits(limited[path], extents):
                self.outside[(op, path)] += 1
            else:
                kept.append(path)
        return kept or ["native"]

    def _warn_once(self, op: str, path: str, exc: BaseException) -> None:
        if op in self.warned:
            return
        self.warned.add(op)
        warnings.warn(
            f"torch_fl: route {path} of {op} raised {type(exc).__name__}: {exc}; falling back to the next candidate "
            f"(FLAGOS_STRICT=1 makes this an error)",
            stacklevel=3,
        )

    # ---- overrides through the API
    def set_route(self, op: str, paths: list[str], bypass_gate: bool = False, python: bool = False) -> None:
        unknown = [p for p in paths if p not in self.kernel_sets]
        if unknown:
            raise ValueError(
                f"{op}: unknown or unavailable kernel set(s) {unknown}; available: {sorted(self.kernel_sets)}"
            )
        for path in paths:
            reason = refusal(op, path)
            if reason:
                raise ValueError(f"{op}: the {path} path is refused: {reason}")
        with self._lock:
            self.api[op] = (list(paths), bypass_gate, python)
            self.refresh(op)

    def clear_route(self, op: str) -> None:
        with self._lock:
            self.api.pop(op, None)
            self.refresh(op)


_router: Optional[Router] = None


def router() -> Router:
    if _router is None:
        from torch_fl.runtime import standby

        standby.start_pending()  # asking for the routes is a use of flagos
    if _router is None:
        raise RuntimeError("no platform is active in this process; import torch (autoload) or call torch_fl.activate()")
    return _router


def install(active: Any, table: RouteTable, source: str) -> Router:
    """Build the router for the activated platform over `table` (read from `source`, checked by
    torch_fl.routing.checks) and install its Python route kernels."""
    global _router
    from torch_fl.runtime import core

    kernel_sets = build_kernel_sets(active.descriptor)
    core().set_log_cpu_fallback(env.flag("FLAGOS_LOG_FALLBACK"))
    _router = Router(active, kernel_sets, table, source)
    _router.install_all()
    return _router


@contextlib.contextmanager
def forced(op: str, path: str, python: bool = False) -> Iterator[None]:
    """Run `op` through `path` only, gate bypassed: how conformance checks a candidate route.

    `python=True` serves even native through the Python route kernel (the tuner measures it).
    """
    r = router()
    previous = r.api.get(op)
    r.set_route(op, [path], bypass_gate=True, python=python)
    try:
        yield
    finally:
        if previous is None:
            r.clear_route(op)
        else:
            r.set_route(op, *previous)
