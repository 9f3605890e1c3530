"""The router: Python kernels only where a non-native path may run, overrides, fallback, counters."""

from __future__ import annotations

import os
import subprocess
import sys
import warnings

import pytest
import torch

from torch_fl.routing import clear_route, explain, forced, set_route, stats, strict


def test_native_first_ops_get_no_python_kernel(fresh_routes):
    assert "aten::mm" not in fresh_routes.installed
    info = explain("aten::mm")
    assert info.python_kernel is False and "C++ native route" in info.served_by


def test_api_route_installs_a_kernel_and_counts(fresh_routes, pair):
    a, b, x, y = pair
    set_route("aten::mm", ["cpu"])
    assert "aten::mm" in fresh_routes.installed
    assert torch.allclose((x @ y).cpu(), a @ b)
    assert {(r.op, r.path): r.calls for r in stats()}[("aten::mm", "cpu")] == 1
    assert explain("mm").source == "api"
    clear_route("aten::mm")
    assert "aten::mm" not in fresh_routes.installed


def test_forced_route_is_undone(fresh_routes, pair):
    a, b, x, y = pair
    with forced("aten::add.Tensor", "cpu"):
        assert torch.allclose((x + y).cpu(), a + b)
        assert "aten::add.Tensor" in fresh_routes.installed
    assert "aten::add.Tensor" not in fresh_routes.installed


def test_failing_route_falls_back_with_one_warning(fresh_routes, pair, monkeypatch):
    a, b, x, y = pair
    cpu = fresh_routes.kernel_sets["cpu"]

    def broken(op, args, kwargs):
        raise RuntimeError("broken kernel")

    monkeypatch.setattr(cpu, "call", broken)
    set_route("aten::mul.Tensor", ["cpu", "native"])
    fresh_routes.warned.discard("aten::mul.Tensor")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        r1, r2 = x * y, x * y
    assert torch.allclose(r1.cpu(), a * b) and torch.allclose(r2.cpu(), a * b)
    assert sum("falling back" in str(w.message) for w in caught) == 1
    counts = {(r.op, r.path): r.calls for r in stats()}
    assert counts[("aten::mul.Tensor", "native")] == 2
    strict(True)
    try:
        with pytest.raises(RuntimeError, match="broken kernel"):
            x * y
    finally:
        strict(False)


def test_views_and_structural_ops_refuse_other_paths(fresh_routes):
    for op in ("aten::transpose.int", "aten::as_strided", "aten::_unsafe_view", "aten::t_"):
        with pytest.raises(ValueError, match="refused"):
            set_route(op, ["cpu"])
    with pytest.raises(ValueError, match="refused"):
        set_route("aten::_to_copy", ["cpu"])


def test_unknown_path_is_rejected(fresh_routes):
    with pytest.raises(ValueError, match="unknown or unavailable kernel set"):
        set_route("aten::mm", ["vendor"])  # no shipped platform declares vendor kernels


def test_profiler_shows_the_python_route(fresh_routes, pair):
    _, _, x, y = pair
    set_route("aten::mm", ["cpu"])
    with torch.profiler.profile() as prof:
        x @ y
    names = [e.name for e in prof.events()]
    assert "flagos.route.cpu::aten::mm" in names


def test_explain_rejects_unknown_ops():
    with pytest.raises(ValueError, match="not an operator"):
        explain("aten::no_such_op")


def run(code: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", code], env={**os.environ, **env}, capture_output=True, text=True, timeout=300
    )


def test_env_override_and_routes_file(tmp_path):
    code = (
        "import torch, torch_fl\n"
        "x = torch.ones(4, 4, device='flagos')\n"
        "print(torch_fl.explain('aten::mm').candidates, torch_fl.explain('aten::mm').source)\n"
    )
    out = run(code, FLAGOS_ROUTE_mm="cpu,native")
    assert "['cpu', 'native'] env FLAGOS_ROUTE_mm" in out.stdout, out.stderr
    routes = tmp_path / "routes.yaml"
    routes.write_text("format: 1\nops:\n  aten::mm:\n    candidates: [cpu]\n")
    out = run(code, FLAGOS_ROUTES=str(routes))
    assert "['cpu'] file" in out.stdout, out.stderr


def test_bucketed_route_asks_its_kernel_sets_only_when_called(fresh_routes, pair, monkeypatch):
    """Installing a tuned route loads no kernel library (importing FlagGems takes seconds)."""
    from torch_fl.routing.table import Bucket, OpRoute

    a, b, x, y = pair
    asked = []
    cpu = fresh_routes.kernel_sets["cpu"]
    real = cpu.implements
    monkeypatch.setattr(cpu, "implements", lambda op: asked.append(op) or real(op))
    op = "aten::sub.Tensor"
    fresh_routes.table.ops[op] = OpRoute(candidates=["native", "cpu"], buckets=[Bucket(max_numel=64, choice="cpu")])
    try:
        fresh_routes.refresh(op)
        assert op in fresh_routes.installed and asked == []
        assert torch.allclose((x - y).cpu(), a - b)
        assert asked and {(r.op, r.path): r.calls for r in stats()}[(op, "cpu")] == 1
    finally:
        fresh_routes.table.ops.pop(op)
        fresh_routes.refresh(op)


@pytest.fixture
def bucketed(fresh_routes):
    """Install a tuned table entry for one op and take it out again."""
    from torch_fl.routing.table import OpRoute

    def install(op: str, route: OpRoute):
        fresh_routes.table.ops[op] = route
        fresh_routes.refresh(op)
        added.append(op)
        return fresh_routes

    added: list[str] = []
    yield install
    for op in added:
        fresh_routes.table.ops.pop(op)
        fresh_routes.refresh(op)


def test_calls_outside_every_bucket_never_enter_python(bucketed, pair):
    """Only calls whose bucket chose another path reach the Python route kernel; the rest run the
    native route in C++ (a Python kernel costs every call of its op otherwise)."""
    from torch_fl.routing.table import Bucket, OpRoute
    from torch_fl.runtime import core

    op = "aten::sub.Tensor"
    r = bucketed(
        op, OpRoute(candidates=["native", "cpu"], buckets=[Bucket(max_numel=64, dtype="float32", choice="cpu")])
    )
    a, b, x, y = pair  # 8 x 8 float32: in the bucket
    big = torch.randn(16, 16)
    assert torch.equal((x - y).cpu(), a - b)
    assert torch.equal((big.to("flagos") - big.to("flagos")).cpu(), big - big)  # above the bucket
    assert torch.equal((x.double() - y.double()).cpu(), a.double() - b.double())  # another dtype
    assert dict(r.counts) == {(op, "cpu"): 1}
    assert core().route_counts()[op][0] >= 2  # served by the C++ native route


def test_a_bucket_whose_path_the_record_refuses_costs_no_python(bucketed, pair):
    """A bucket tuned onto a path the conformance record has not validated for the op (here emulated,
    which never proved sub) never runs that path, so its calls must not enter Python either."""
    from torch_fl.routing.table import Bucket, OpRoute

    op = "aten::sub.Tensor"
    r = bucketed(op, OpRoute(candidates=["native", "emulated"], buckets=[Bucket(max_numel=64, choice="emulated")]))
    assert op not in r.installed
    a, b, x, y = pair
    assert torch.equal((x - y).cpu(), a - b)
    assert dict(r.counts) == {}


def test_a_composite_op_outside_its_buckets_runs_the_composite(bucketed):
    from torch_fl.routing.table import Bucket, OpRoute

    op = "aten::zeros_like"
    r = bucketed(op, OpRoute(candidates=["native", "cpu"], buckets=[Bucket(max_numel=16, choice="cpu")]))
    small, large = torch.ones(4, device="flagos"), torch.ones(2, 50, device="flagos").t()
    assert torch.equal(torch.zeros_like(small).cpu(), torch.zeros(4))
    out = torch.zeros_like(large)
    assert out.device.type == "flagos" and out.stride() == large.stride() and not out.cpu().any()
    assert dict(r.counts) == {(op, "cpu"): 1}


def test_bucket_spans_start_above_the_buckets_they_share_calls_with():
    from torch_fl.routing.runtime import bucket_spans
    from torch_fl.routing.table import Bucket, OpRoute

    route = OpRoute(
        candidates=["native", "flaggems"],
        buckets=[
            Bucket(max_numel=100, dtype="bfloat16", choice="native"),
            Bucket(max_numel=1000, dtype="bfloat16", choice="flaggems"),
            Bucket(max_numel=50, choice="native"),
            Bucket(max_numel=5000, choice="flaggems"),
            Bucket(max_numel=500, dtype="float32", choice="flaggems"),  # shadowed by the any-dtype bucket above it
        ],
    )
    assert bucket_spans(route) == [(torch.bfloat16, 101, 1000, ()), (None, 51, 5000, ())]
