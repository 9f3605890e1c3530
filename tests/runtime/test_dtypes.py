"""Every dtype the platform declares lives on flagos: creation, round trips, casts and arithmetic
equal the CPU's, including the unsigned uint16/uint32/uint64 types."""

from __future__ import annotations

import pytest
import torch

import torch_fl

DTYPES = [
    torch.float64,
    torch.float32,
    torch.float16,
    torch.bfloat16,
    torch.int64,
    torch.int32,
    torch.int16,
    torch.int8,
    torch.uint64,
    torch.uint32,
    torch.uint16,
    torch.uint8,
    torch.bool,
    torch.complex64,
    torch.complex128,
]
UNSIGNED = [torch.uint16, torch.uint32, torch.uint64]


def sample(dtype: torch.dtype) -> torch.Tensor:
    if dtype == torch.bool:
        return torch.tensor([True, False, True, True])
    if dtype.is_complex:
        return torch.tensor([1 + 2j, -3.5j, 0, 7], dtype=dtype)
    if dtype.is_floating_point:
        return torch.tensor([1.5, -2.25, 0.0, 1e3], dtype=dtype)
    info = torch.iinfo(dtype)
    return torch.tensor([0, 1, info.max, info.min + 1 if info.min < 0 else 2], dtype=dtype)


def test_declared_dtypes_are_the_tested_ones():
    declared = set(torch_fl.active_platform().descriptor.capabilities.dtypes)
    tested = {str(d).removeprefix("torch.") for d in DTYPES}
    assert declared - {"float8_e4m3fn", "float8_e5m2"} <= tested


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_round_trip_is_exact(dtype):
    cpu = sample(dtype)
    x = cpu.to("flagos")
    assert x.dtype == dtype and x.device.type == "flagos"
    assert x.element_size() == cpu.element_size()
    assert torch.equal(x.cpu(), cpu)
    assert torch.equal(torch.tensor(cpu.tolist(), dtype=dtype, device="flagos").cpu(), cpu)
    assert torch.equal(torch.zeros(3, dtype=dtype, device="flagos").cpu(), torch.zeros(3, dtype=dtype))
    assert torch.equal(x.clone().cpu(), cpu) and torch.equal(x[1:].cpu(), cpu[1:])


@pytest.mark.parametrize("dtype", UNSIGNED, ids=str)
def test_unsigned_tensors_and_casts(dtype, backing):
    cpu = torch.tensor([0, 1, 40000, torch.iinfo(dtype).max], dtype=dtype)
    x = cpu.to("flagos")
    assert "device='flagos:0'" in repr(x) and f"dtype={dtype}" in repr(x)
    for target in (torch.int64, torch.float64, torch.uint8, torch.uint16, torch.uint32, torch.uint64, torch.bool):
        assert torch.equal(x.to(target).cpu(), cpu.to(target)), target
    assert torch.equal(torch.full((2,), 7, dtype=dtype, device="flagos").cpu(), torch.full((2,), 7, dtype=dtype))
    assert torch.equal(torch.empty(4, dtype=dtype, device="flagos").copy_(cpu).cpu(), cpu)
    # what the backing computes on unsigned types flagos computes the same; what it refuses, flagos refuses
    plain = cpu.to(backing)
    for op in (lambda t: t == t, lambda t: t.max(), lambda t: t.flip(0), lambda t: t[t > 0], lambda t: t + t):
        try:
            expected = op(plain).cpu()
        except (RuntimeError, NotImplementedError) as exc:
            with pytest.raises(type(exc)):
                op(x)
            continue
        assert torch.equal(op(x).cpu(), expected)


def test_uint64_values_beyond_int64():
    cpu = torch.tensor([2**63 + 5, 2**64 - 1], dtype=torch.uint64)
    x = cpu.to("flagos")
    assert torch.equal(x.cpu(), cpu)
    assert x[1].item() == 2**64 - 1


ARITHMETIC = [torch.float16, torch.bfloat16, torch.float64, torch.int32, torch.int8, torch.complex64]


@pytest.mark.parametrize("dtype", ARITHMETIC, ids=str)
def test_arithmetic_matches_cpu(dtype, same):
    torch.manual_seed(0)
    a = (torch.randn(6, 6) * 10).to(dtype)
    b = (torch.randn(6, 6) * 10).to(dtype)
    x, y = a.to("flagos"), b.to("flagos")
    same(x + y, a + b)
    same(x * y, a * b)
    same(x.sum(0), a.sum(0))
    if dtype.is_floating_point or dtype.is_complex:
        same(x @ y, a @ b)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_type_promotion_matches_cpu(dtype):
    x = sample(dtype)
    other = torch.tensor([1, 2, 3, 4], dtype=torch.int32)
    try:
        expected = torch.result_type(x, other)
    except RuntimeError:  # e.g. uint16 with int32: PyTorch defines no promotion, on any device
        with pytest.raises(RuntimeError):
            torch.result_type(x.to("flagos"), other.to("flagos"))
        return
    assert torch.result_type(x.to("flagos"), other.to("flagos")) == expected
    try:
        reference = x * other
    except RuntimeError:
        with pytest.raises(RuntimeError):
            x.to("flagos") * other.to("flagos")
        return
    result = x.to("flagos") * other.to("flagos")
    assert result.dtype == reference.dtype
    assert torch.equal(result.cpu(), reference)


def test_default_dtype_is_respected():
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        assert torch.zeros(2, device="flagos").dtype == torch.float64
        assert torch.tensor([1.0], device="flagos").dtype == torch.float64
    finally:
        torch.set_default_dtype(previous)
