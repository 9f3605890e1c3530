"""The PyTorch profiler on flagos: `use_device="flagos"` times device work with the device's profiler
hooks (host timestamps on the host backing, CUDA events on a CUDA backing); times are never negative,
stay within the wall time of the profiled code, and profiling costs little."""

from __future__ import annotations

import time

import pytest
import torch
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity

from torch_fl.runtime.device import core as device_core

STEPS = 30


def _loop(x: torch.Tensor) -> None:
    for _ in range(STEPS):
        torch.mm(x, x)


def _profiled(x: torch.Tensor, **options: object) -> tuple[torch.autograd.profiler.profile, float]:
    with torch.autograd.profiler.profile(use_device="flagos", **options) as prof:
        start = time.perf_counter()
        _loop(x)
        torch.flagos.synchronize()
        wall_us = (time.perf_counter() - start) * 1e6
    return prof, wall_us


def test_use_device_times_are_non_negative_and_within_wall_time():
    x = torch.randn(64, 64, device="flagos")
    prof, wall_us = _profiled(x)
    events = prof.function_events
    mm = [e for e in events if e.name == "aten::mm"]
    assert len(mm) >= STEPS
    for e in events:
        assert e.cpu_time_total >= 0 and e.device_time_total >= 0, (e.name, e.cpu_time_total, e.device_time_total)
        assert e.cpu_time_total <= wall_us, (e.name, e.cpu_time_total, wall_us)
        assert e.device_time_total <= wall_us, (e.name, e.device_time_total, wall_us)
    device_us = sum(e.self_device_time_total for e in mm)
    assert 0 < device_us <= wall_us, (device_us, wall_us)
    assert 0 < prof.key_averages().self_cpu_time_total <= wall_us


def test_use_device_logs_no_profiler_assert(capfd: pytest.CaptureFixture[str]):
    x = torch.randn(16, 16, device="flagos")
    _profiled(x, record_shapes=True)
    err = capfd.readouterr().err
    assert "kineto_ctx_ptr" not in err and "INTERNAL ASSERT" not in err, err[-2000:]


def test_use_device_profiling_costs_little():
    x = torch.randn(64, 64, device="flagos")
    _loop(x)  # warm up
    start = time.perf_counter()
    _loop(x)
    plain = time.perf_counter() - start
    _, profiled_us = _profiled(x)
    # Profiling records a few events per op; it was thousands of times slower when each event raised.
    assert profiled_us / 1e6 < 10 * plain + 0.5, (profiled_us / 1e6, plain)


def test_kineto_activities_with_flagos_record_the_ops():
    x = torch.randn(32, 32, device="flagos")
    with torch.profiler.profile(activities=[ProfilerActivity.CPU, ProfilerActivity.PrivateUse1]) as prof:
        _loop(x)
    mm = [e for e in prof.events() if e.name == "aten::mm"]
    assert len(mm) >= STEPS
    assert all(e.cpu_time_total >= 0 and e.device_time_total >= 0 for e in prof.events())


def _aten_op_counts(prof: torch.profiler.profile) -> dict[str, int]:
    """How often each aten op shows in a finished profile."""
    return {e.key: e.count for e in prof.key_averages() if e.key.startswith("aten::")}


def _aten_counts(x: torch.Tensor) -> dict[str, int]:
    """How often each aten op shows in the profile of the native routes' ops, unboxed (add, mm) and
    boxed (sin, sum), of one whose backing kernel is a composite calling the same op again
    (mul.Scalar calls mul.Tensor), and of copies: a cast and a copy_."""
    out = torch.empty_like(x)
    with torch.profiler.profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(STEPS):
            torch.add(x, x)
            torch.mm(x, x)
            x.sin()
            torch.ops.aten.mul.Scalar(x, 3.0)
            x.sum()
            x.to(torch.bfloat16)
            out.copy_(x)
    return _aten_op_counts(prof)


def test_routed_ops_appear_once_as_on_the_backing():
    """The routes call the backing's kernel past the dispatcher, whose second pass on the aliases
    recorded every op twice (aten::addmm at 199% of the CPU total; a copy as copy_, _copy_from and
    copy_ again). The profiler folds an op's call of itself into one event where the call is its
    only child, which a route's event beside it prevented (mul.Scalar twice per call). Compared
    with the backing device itself: a CPU matmul records an `aten::resolve_conj` a CUDA one does
    not."""
    x = torch.randn(8, 8, device=device_core.backing())
    counts = _aten_counts(x.to("flagos"))
    assert counts == _aten_counts(x)
    for op in ("add", "mm", "sin", "mul", "sum"):
        assert counts[f"aten::{op}"] == STEPS, op
    assert counts["aten::_to_copy"] == 2 * STEPS  # the cast's and mul.Scalar's (its scalar as a tensor)
    assert counts["aten::copy_"] == 3 * STEPS  # those two and out's


def _training_op_counts(device: str) -> dict[str, int]:
    """How often each aten op shows in the profile of a convolution's and an attention's forward and
    backward, their inputs wanting gradients as a training step's do."""
    torch.manual_seed(0)
    conv = torch.nn.Conv2d(3, 4, 3).to(device)
    x = torch.randn(2, 3, 8, 8, device=device, requires_grad=True)
    q = torch.randn(1, 2, 4, 8, device=device, requires_grad=True)
    with torch.profiler.profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(STEPS):
            conv(x).sum().backward()
            torch.nn.functional.scaled_dot_product_attention(q, q, q).sum().backward()
    return _aten_op_counts(prof)


def test_training_ops_appear_once_as_on_the_backing():
    """Convolution reached the backing through PyTorch's PrivateUse1 hooks, which called it again
    whole (aten::convolution, _convolution and convolution_backward twice per call); attention asked
    the backing's choice of kernel through the dispatcher where its inputs wanted gradients, an
    aten::_fused_sdp_choice event neither CPU nor CUDA records (they ask the choice directly)."""
    counts = _training_op_counts("flagos")
    backing = _training_op_counts(device_core.backing())
    conv_ops = ("aten::conv2d", "aten::convolution", "aten::_convolution", "aten::convolution_backward")
    assert {op: counts.get(op) for op in conv_ops} == {op: backing.get(op) for op in conv_ops}
    assert counts["aten::convolution"] == counts["aten::convolution_backward"] == STEPS
    assert "aten::_fused_sdp_choice" not in counts


def test_cpu_route_ops_appear_once(force_cpu_route):
    force_cpu_route("aten::sub.Tensor")
    x = torch.randn(8, 8, device="flagos")
    with torch.profiler.profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(STEPS):
            torch.sub(x, x)
    assert _aten_op_counts(prof)["aten::sub"] == STEPS


@pytest.mark.cuda
@pytest.mark.backing_cuda
@pytest.mark.parametrize("activity", [ProfilerActivity.PrivateUse1, ProfilerActivity.CUDA], ids=["flagos", "cuda"])
def test_cuda_backing_kernels_and_device_time_reach_the_profiler(activity: ProfilerActivity):
    x = torch.randn(1024, 1024, device="flagos")
    _loop(x)
    with torch.profiler.profile(activities=[ProfilerActivity.CPU, activity]) as prof:
        _loop(x)
        torch.flagos.synchronize()
    kernels = [e for e in prof.events() if e.device_type in (DeviceType.PrivateUse1, DeviceType.CUDA)]
    assert kernels, "no device events: the backing's tracer did not reach the profiler"
    assert any(not e.name.startswith("aten::") for e in kernels), sorted({e.name for e in kernels})
    mm = [e for e in prof.key_averages() if e.key == "aten::mm"]
    assert mm and mm[0].self_device_time_total > 0, prof.key_averages().table(row_limit=10)


@pytest.mark.cuda
@pytest.mark.backing_cuda
def test_cuda_backing_use_device_times_with_cuda_events():
    x = torch.randn(1024, 1024, device="flagos")
    _loop(x)
    prof, wall_us = _profiled(x)
    mm = [e for e in prof.function_events if e.name == "aten::mm"]
    device_us = sum(e.self_device_time_total for e in mm)
    assert 0 < device_us <= wall_us, (device_us, wall_us)
