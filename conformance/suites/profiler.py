"""profiler: flagos ops and the routes that served them show up in a torch.profiler trace, with times.

A Python route records `flagos.route.<path>::<op>` around its kernel; the C++ native route
records `flagos.route.native` where the backing has a kernel of its own for the op (a composite one
shows its own calls, as on the backing), and the explicit CPU fallback `flagos.route.cpu`. Device
time reaches the profiler (`use_device="flagos"`): never negative, within the wall time of the
profiled code; a platform whose descriptor names a device tracer (CUPTI and the like) also shows its
kernels.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import torch
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, profile

SUITE = "profiler"
_HOST_TRACERS = ("none", "kineto-cpu")  # no device-side trace to expect


def _names(prof: Any) -> set[str]:
    return {e.name for e in prof.events()}


def test_python_route_is_named_in_the_trace(fl: Any, tmp_path: Path) -> None:
    op, path = "aten::add.Tensor", "cpu"  # forcing the cpu path installs a Python route kernel
    fl.meta(op=op, path=path)
    a, b = torch.randn(4, 4).to("flagos"), torch.randn(4, 4).to("flagos")
    with fl.forced(op, path):
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            c = a + b
    torch.testing.assert_close(c.cpu(), a.cpu() + b.cpu())
    names = _names(prof)
    marker = f"flagos.route.{path}::{op}"
    assert marker in names, (
        f"no '{marker}' in the trace; flagos-related events: {sorted(n for n in names if 'flagos' in n or 'add' in n)}"
    )
    assert "aten::add" in names, "the aten op itself is missing from the trace"
    trace = tmp_path / "trace.json"
    prof.export_chrome_trace(str(trace))
    assert marker in json.dumps(json.loads(trace.read_text())), "the exported Chrome trace lost the route marker"


def test_native_route_is_named_in_the_trace(fl: Any) -> None:
    fl.meta(op="aten::mm", path="native")
    a, b = torch.randn(8, 8).to("flagos"), torch.randn(8, 8).to("flagos")
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        torch.mm(a, b)
    names = _names(prof)
    assert "flagos.route.native" in names, (
        f"no 'flagos.route.native' in the trace: {sorted(n for n in names if 'flagos' in n or 'mm' in n)}"
    )
    assert "aten::mm" in names, "aten::mm is missing from the trace"


def test_route_counters_follow_calls(fl: Any) -> None:
    from torch_fl.routing import reset_stats, stats

    a = torch.randn(4).to("flagos")
    reset_stats()
    for _ in range(3):
        torch.neg(a)
    counts = {(r.op, r.path): r.calls for r in stats()}
    assert counts.get(("aten::neg", "native"), 0) >= 3, f"route counters missed aten::neg: {counts}"


def test_device_time_is_plausible(fl: Any) -> None:
    fl.meta(op="aten::mm", path="native")
    x = torch.randn(128, 128).to("flagos")
    torch.mm(x, x)
    with torch.autograd.profiler.profile(use_device="flagos") as prof:
        start = time.perf_counter()
        for _ in range(10):
            torch.mm(x, x)
        torch.flagos.synchronize()
        wall_us = (time.perf_counter() - start) * 1e6
    events = prof.function_events
    negative = [
        (e.name, e.cpu_time_total, e.device_time_total)
        for e in events
        if e.cpu_time_total < 0 or e.device_time_total < 0
    ]
    assert not negative, f"negative times: {negative[:5]}"
    device_us = sum(e.self_device_time_total for e in events if e.name == "aten::mm")
    assert 0 < device_us <= wall_us, f"aten::mm device time {device_us:.1f} us for {wall_us:.1f} us of wall time"
    fl.note(f"aten::mm: {device_us:.0f} us device time in {wall_us:.0f} us")


def test_device_kernels_reach_the_trace(fl: Any) -> None:
    tracer = fl.descriptor.capabilities.profiler.tracer
    fl.meta(op="aten::mm", path="native")
    x = torch.randn(512, 512).to("flagos")
    torch.mm(x, x)
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.PrivateUse1]) as prof:
        for _ in range(3):
            torch.mm(x, x)
        torch.flagos.synchronize()
    kernels = {e.name for e in prof.events() if e.device_type in (DeviceType.PrivateUse1, DeviceType.CUDA)}
    if tracer in _HOST_TRACERS:
        fl.note(f"tracer {tracer}: no device kernels expected")
        return
    assert kernels, f"the descriptor names the tracer {tracer!r}, but no device kernel reached the trace"
    mm = [e for e in prof.key_averages() if e.key == "aten::mm"]
    assert mm and mm[0].self_device_time_total > 0, "aten::mm has no device time in the trace"
    fl.note(f"{len(kernels)} kernel name(s), e.g. {sorted(kernels)[0]}")
