"""captured: the calls real models make (conformance/capture.py), judged on every gated path.

One item per op and group of CALLS_PER_ITEM calls; one case per captured call x gated path that
implements the op, with the call's exact shapes, strides, offsets, dtypes and arguments. Each call
runs once on the native route and twice per path with the same inputs (conformance/sweepcall.py;
the native route again only where the path's two runs differ), and the path must give the native
values, dtype, shape and strides, leave its inputs alone, write in place where the op does, and
be deterministic where the native route is.
A case is `captured/<op>/<path>/<n>` (n: the call's index in the shipped list), judged under the
gate key the call makes, so the gate and the tuner have proof at the keys models use.
"""

from __future__ import annotations

import functools
import time
import zlib
from typing import Any

import pytest
import torch

from torch_fl.conformance import capture, compare, zoo_calls
from torch_fl.conformance.suites.sweep import _conclude, _overload, swept_paths
from torch_fl.conformance.sweepcall import NativeReference, Plan, Planned, compare_runs, run_call
from torch_fl.conformance.sweepgen import Call, writes_self
from torch_fl.routing.gatekey import call_key

SUITE = "captured"
CALLS_PER_ITEM = 8
"""Calls per pytest item: an op's calls spread over the workers (a model casts in 100 shapes)."""
SLOWER = 10
"""How many times the native route's time one run of a captured call may take on a path before
the case is stopped as hung. Board-size calls (a 1024 x 1024 x 32000 matmul) take seconds on a host
backing: the plain case timeout would call a kernel hung that is only slower than native."""


def _calls() -> list[dict[str, Any]]:
    calls: list[dict[str, Any]] = zoo_calls.load()["calls"]
    return calls


def _by_op() -> dict[str, list[int]]:
    out: dict[str, list[int]] = {}
    for index, call in enumerate(_calls()):
        out.setdefault(call["op"], []).append(index)
    return out


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "call_indices" not in metafunc.fixturenames:
        return
    try:
        worker = metafunc.config.pluginmanager.get_plugin("fl-worker")
        fl = worker.ready_session() if worker is not None else None
    except RuntimeError:
        fl = None
    if fl is None:
        metafunc.parametrize(("captured_op", "call_indices"), [("-", ())], ids=["platform"])
        return
    params, ids = [], []
    for op, indices in sorted(_by_op().items()):
        if _exists(op) and swept_paths(fl, op):
            for start in range(0, len(indices), CALLS_PER_ITEM):
                params.append((op, tuple(indices[start : start + CALLS_PER_ITEM])))
                ids.append(f"{op}-{start // CALLS_PER_ITEM}")
    metafunc.parametrize(("captured_op", "call_indices"), params, ids=ids)


def _exists(op: str) -> bool:
    try:
        _overload(op)
    except (AttributeError, ValueError, KeyError):
        return False
    return True


def _plan(overload: torch._ops.OpOverload, call: dict[str, Any], seed: int) -> Plan:
    g = torch.Generator().manual_seed(seed)

    def place(value: Any) -> Any:
        if capture.is_tensor(value):
            storage, view = capture.tensor_values(value, g)
            return Planned(storage, view)
        if isinstance(value, list) and value and all(capture.is_tensor(v) or v is None for v in value):
            return _planned_list(value, g)
        return capture.decode_scalar(value)

    args = [place(a) for a in call["args"]]
    kwargs = {k: place(v) for k, v in call["kwargs"].items()}
    outs = [
        (None, a.name)
        for a in overload._schema.arguments
        if a.kwarg_only and a.alias_info is not None and a.alias_info.is_write and a.name in kwargs
    ]
    return Plan(Call(args, kwargs, outs, writes_self(overload)), overload)


def _planned_list(specs: list[Any], g: torch.Generator) -> Planned:
    """A tensor list (foreach ops, cat, index) as one planned storage that its view splits."""
    parts = [capture.tensor_values(s, g) if s is not None else None for s in specs]
    storages = [p[0] for p in parts if p is not None]
    if len({t.dtype for t in storages}) > 1:
        raise ValueError("a tensor list of mixed dtypes cannot share one planned storage")

    def view(t: torch.Tensor) -> list[torch.Tensor | None]:
        out: list[torch.Tensor | None] = []
        at = 0
        for part in parts:
            if part is None:
                out.append(None)
                continue
            out.append(part[1](t, at))
            at += part[0].numel()
        return out

    return Planned(torch.cat(storages) if storages else torch.empty(0), view)


def test_captured(captured_op: str, call_indices: tuple[int, ...], fl: Any) -> None:
    fl.own_cases()
    compare.compare_metadata(torch.empty(2, 3), torch.empty(2, 3))  # imports sympy outside a case's limit
    op = captured_op
    overload = _overload(op)
    paths = swept_paths(fl, op)
    inplace = writes_self(overload)
    for index in call_indices:
        call = _calls()[index]
        ids = {p: f"{SUITE}/{op}/{p}/{index}" for p in paths}
        todo = [p for p in paths if not fl.done(ids[p])]
        if not todo:
            continue
        try:
            plan = _plan(overload, call, zlib.crc32(f"{op}/{index}".encode()) % (2**31))
            started = time.perf_counter()
            native = NativeReference(
                run_call(plan, None, judge_inputs=not inplace),
                functools.partial(run_call, plan, None, judge_inputs=False),
            )
            fl.synchronize()
            native_s = time.perf_counter() - started
        except Exception as exc:  # not replayable, or the native route rejects it: nothing to compare with
            for path in todo:
                with fl.case(ids[path], SUITE, op=op, path=path) as case:
                    case.skip(f"not replayed: {type(exc).__name__}: {str(exc)[:300]}")
            continue
        cpu_args, cpu_kwargs, _ = plan.place("cpu")
        inputs = [t for t in _flat(cpu_args) if isinstance(t, torch.Tensor)]
        dtype = next((t.dtype for t in inputs), torch.float32)
        key = call_key(overload, tuple(cpu_args), cpu_kwargs).text
        for path in todo:
            name = str(dtype).removeprefix("torch.")
            # two runs on the path, each allowed SLOWER times the native's, beyond the usual limit
            limit = fl.recorder.timeout_for(op, name, path) + 2 * SLOWER * native_s
            with fl.case(ids[path], SUITE, op=op, dtype=name, path=path, timeout=limit) as case:
                fl.recorder.phase(key)
                forced = functools.partial(fl.forced, op, path)
                got = run_call(plan, None, judge_inputs=not inplace, route=forced)
                second = run_call(plan, None, judge_inputs=False, route=forced)
                fl.synchronize()
                problems = got.problems + compare_runs(got, native.result, dtype, inputs)
                _conclude(case, problems + native.nondeterminism(got, second))


def _flat(values: list[Any]) -> list[Any]:
    return [x for v in values for x in (v if isinstance(v, list) else [v])]
