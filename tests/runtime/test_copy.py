"""Copies between the CPU, flagos devices and dtypes: .cpu(), .to(), copy_(), non_blocking, pinned memory."""

from __future__ import annotations

import contextlib

import pytest
import torch

import torch_fl
from torch_fl.routing import forced


def test_cpu_round_trip_keeps_values_and_geometry():
    cpu = torch.randn(5, 7)
    x = cpu.to("flagos")
    assert x.device == torch.device("flagos", 0)
    back = x.cpu()
    assert back.device.type == "cpu" and torch.equal(back, cpu)
    assert x.to("cpu").data_ptr() != x.data_ptr()
    assert torch.equal(x.t().cpu(), cpu.t())
    assert x.t().cpu().stride() == cpu.t().stride()  # .to() keeps a dense non-contiguous layout


def test_to_flagos_forms_and_no_op_copies():
    cpu = torch.arange(6.0)
    assert cpu.to("flagos").device == torch.device("flagos", 0)
    assert cpu.to(torch.device("flagos")).device.type == "flagos"
    assert cpu.to("flagos", torch.float64).dtype == torch.float64
    assert cpu.to(device="flagos:0", dtype=torch.int16).dtype == torch.int16
    x = cpu.to("flagos")
    assert x.to("flagos") is x  # already there: no copy, as on CUDA
    assert x.to("flagos", copy=True) is not x
    assert x.to("flagos", copy=True).data_ptr() != x.data_ptr()
    assert torch.equal(x.flagos().cpu(), cpu) and cpu.flagos().is_flagos


@pytest.mark.two_devices
def test_to_second_device(same):
    cpu = torch.randn(3, 3)
    x1 = cpu.to("flagos:1")
    assert x1.device == torch.device("flagos", 1)
    same(x1, cpu)
    x0 = x1.to("flagos:0")
    assert x0.device.index == 0 and x0.data_ptr() != x1.data_ptr()
    same(x0, cpu)
    same(x1.to("flagos:0", torch.float16), cpu.half())


def test_pin_memory_and_is_pinned():
    plain = torch.randn(64)
    assert not plain.is_pinned()
    pinned = plain.pin_memory()
    assert pinned.is_pinned() and pinned.device.type == "cpu"
    assert torch.equal(pinned, plain)
    assert torch.empty(8, pin_memory=True).is_pinned()
    assert pinned.pin_memory() is pinned  # already pinned


def test_a_tensor_inside_pinned_memory_is_pinned():
    """A tensor whose own storage starts inside a pinned buffer (here made through NumPy) is pinned, as
    CUDA answers for any address in a pinned allocation."""
    pinned = torch.arange(64.0).pin_memory()
    inside = torch.from_numpy(pinned.numpy()[16:48])
    assert inside.data_ptr() == pinned.data_ptr() + 16 * 4
    assert inside.is_pinned()
    assert torch.from_numpy(pinned.numpy()[63:]).is_pinned()
    assert not torch.from_numpy(torch.arange(64.0).numpy()[16:]).is_pinned()


@pytest.mark.parametrize("size", [7, 1 << 16])
def test_non_blocking_copies(size, same):
    source = torch.randn(size).pin_memory()
    x = source.to("flagos", non_blocking=True)
    back = torch.empty(size).pin_memory()
    back.copy_(x, non_blocking=True)
    torch.flagos.synchronize()
    same(x, source)
    assert torch.equal(back, source)
    # non_blocking from pageable memory is allowed too (it simply synchronises)
    pageable = torch.randn(size)
    y = pageable.to("flagos", non_blocking=True)
    torch.flagos.synchronize()
    same(y, pageable)


@pytest.mark.parametrize("route", ["C++", "Python"])
def test_non_blocking_to_cpu_lands_in_pinned_memory(route):
    """As for a CUDA source: PyTorch's _to_copy pins the host side of a non_blocking copy from an
    accelerator (torch 2.11 and 2.13 alike, measured on the H200 and here). A Python route serving
    _to_copy natively (a tuned table puts one there) keeps that, instead of copying from a backing alias."""
    x = torch.randn(32, device="flagos")
    with forced("aten::_to_copy", "native", python=True) if route == "Python" else contextlib.nullcontext():
        out = x.to("cpu", non_blocking=True)
    torch.flagos.synchronize()
    assert out.is_pinned()
    assert torch.equal(out, x.cpu())


@pytest.mark.own_process
def test_pinned_copy_is_reported_pinned_in_a_fresh_process(run_python):
    """is_pinned() asks the accelerator only once PyTorch marks it initialised; the first pinned
    buffer of a process must not depend on something else having marked flagos first."""
    result = run_python(
        """
        import torch, torch_fl
        torch_fl.activate()
        out = torch.randn(32, device="flagos").to("cpu", non_blocking=True)
        torch.flagos.synchronize()
        print(out.is_pinned())
        """,
        env={"FLAGOS_PLATFORM": torch_fl.active_platform().name},
    )
    assert result.stdout.split() == ["True"]


DTYPE_PAIRS = [
    (torch.float32, torch.float64),
    (torch.float64, torch.float16),
    (torch.float32, torch.bfloat16),
    (torch.float32, torch.int32),
    (torch.int64, torch.float32),
    (torch.int32, torch.int8),
    (torch.uint8, torch.int64),
    (torch.bool, torch.float32),
    (torch.float32, torch.bool),
    (torch.float32, torch.complex64),
]


@pytest.mark.parametrize("src_dtype,dst_dtype", DTYPE_PAIRS, ids=lambda d: str(d).replace("torch.", ""))
def test_copy_between_devices_and_dtypes(src_dtype, dst_dtype, same):
    cpu = (torch.randn(4, 5) * 50).to(src_dtype)
    reference = torch.zeros(4, 5, dtype=dst_dtype).copy_(cpu)
    # cpu -> flagos, flagos -> flagos, flagos -> cpu; each converting the dtype
    into_flagos = torch.zeros(4, 5, dtype=dst_dtype, device="flagos").copy_(cpu)
    same(into_flagos, reference)
    within = torch.zeros(4, 5, dtype=dst_dtype, device="flagos").copy_(cpu.to("flagos"))
    same(within, reference)
    out_of = torch.zeros(4, 5, dtype=dst_dtype).copy_(cpu.to("flagos"))
    assert torch.equal(out_of, reference)


def test_copy_into_non_contiguous_and_broadcast(same):
    cpu_dst, cpu_src = torch.zeros(4, 6), torch.arange(4.0)
    dst = cpu_dst.to("flagos")
    dst.t()[1:5].copy_(cpu_src.to("flagos"))  # broadcast a row into a strided view
    cpu_dst.t()[1:5].copy_(cpu_src)
    same(dst, cpu_dst)
    dst[:, ::2].copy_(torch.ones(4, 3))  # from CPU into a strided flagos view
    cpu_dst[:, ::2].copy_(torch.ones(4, 3))
    same(dst, cpu_dst)


@pytest.mark.two_devices
def test_copy_between_flagos_devices(same):
    cpu = torch.randn(10)
    x1 = torch.zeros(10, device="flagos:1")
    x1.copy_(cpu.to("flagos:0"))
    assert x1.device.index == 1
    same(x1, cpu)
    x0 = torch.zeros(10, dtype=torch.float64, device="flagos:0").copy_(x1)
    same(x0, cpu.double())


def test_clone_and_contiguous_copy(same):
    cpu = torch.randn(3, 4)
    x = cpu.to("flagos")
    c = x.clone()
    assert c.data_ptr() != x.data_ptr()
    c.add_(1)
    same(x, cpu)
    same(x.t().contiguous(), cpu.t().contiguous())
    assert x.t().contiguous().is_contiguous()
    same(x.clone(memory_format=torch.preserve_format), cpu)


def test_copy_with_autograd(same):
    cpu = torch.randn(4, requires_grad=True)
    moved = cpu.to("flagos")
    assert moved.requires_grad and moved.grad_fn is not None
    (moved * 3).sum().backward()
    assert cpu.grad is not None and cpu.grad.device.type == "cpu"
    assert torch.equal(cpu.grad, torch.full((4,), 3.0))
    leaf = torch.randn(4, device="flagos", requires_grad=True)
    leaf.cpu().pow(2).sum().backward()
    same(leaf.grad, 2 * leaf.detach().cpu())
