"""profiler: flagos ops and the routes that served them show up in a torch.profiler trace.

A Python route records `flagos.route.<path>::<op>` around its kernel; the C++ native route
records `flagos.route.native` (and the explicit CPU fallback `flagos.route.cpu`).
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from torch.profiler import ProfilerActivity, profile

SUITE = "profiler"


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
    assert marker in names, f"no '{marker}' in the trace; flagos-related events: {sorted(n for n in names if 'flagos' in n or 'add' in n)}"
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
    assert "flagos.route.native" in names, f"no 'flagos.route.native' in the trace: {sorted(n for n in names if 'flagos' in n or 'mm' in n)}"
    assert "aten::mm" in names, "aten::mm is missing from the trace"


def test_route_counters_follow_calls(fl: Any) -> None:
    from torch_fl.routing import reset_stats, stats

    a = torch.randn(4).to("flagos")
    reset_stats()
    for _ in range(3):
        torch.neg(a)
    counts = {(r.op, r.path): r.calls for r in stats()}
    assert counts.get(("aten::neg", "native"), 0) >= 3, f"route counters missed aten::neg: {counts}"
