"""FP8 (e4m3fn, e5m2) in software: float32 <-> FP8 bit patterns by arithmetic only.

For chips without FP8 hardware: encoding rounds to nearest-even and follows the running PyTorch's
conversion rules, so results are bit-identical to `tensor.to(float8)` on its CPU (and CUDA)
kernels. e5m2 overflows to infinity at |x| >= 61440. e4m3fn has no infinity (464 itself rounds to
even, 448), and what |x| > 464 and +-inf become changed between releases (measured: +-448 in torch
2.13, NaN in 2.11): the rule is probed once, from PyTorch itself, when this module loads.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Format:
    dtype: torch.dtype
    mantissa_bits: int
    bias: int
    overflow: float  # |x| above this does not fit: the midpoint between the largest finite value and the next
    tie_overflows: bool  # |x| exactly at the midpoint rounds (to even) up into overflow
    has_inf: bool  # overflow gives infinity; otherwise it saturates or becomes NaN
    max_finite_bits: int
    saturates: bool = False  # without infinity: overflow gives the largest finite value, not NaN

    @property
    def min_exponent(self) -> int:
        return 1 - self.bias


def _pytorch_saturates(dtype: torch.dtype) -> bool:
    return torch.tensor([1e9]).to(dtype).view(torch.uint8).item() != 0x7F


FORMATS = {
    torch.float8_e4m3fn: Format(
        torch.float8_e4m3fn, 3, 7, 464.0, False, False, 0x7E, _pytorch_saturates(torch.float8_e4m3fn)
    ),
    torch.float8_e5m2: Format(torch.float8_e5m2, 2, 15, 61440.0, True, True, 0x7B),
}


def is_fp8(dtype: torch.dtype | None) -> bool:
    return dtype in FORMATS


def encode(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """FP8 bit patterns (uint8) of `x` rounded to `dtype`."""
    f = FORMATS[dtype]
    x = x.to(torch.float32)
    sign = (torch.signbit(x)).to(torch.int32) << 7
    a = x.abs()
    _, e = torch.frexp(a)  # a = m * 2**e, m in [0.5, 1)
    exponent = torch.clamp(e - 1, min=f.min_exponent)
    quantum = torch.ldexp(torch.ones_like(a), exponent - f.mantissa_bits)
    rounded = torch.round(a / quantum) * quantum  # round-half-to-even
    _, e2 = torch.frexp(rounded)
    exp_unbiased = e2 - 1
    normal = (exp_unbiased >= f.min_exponent) & (rounded > 0)
    exp_field = torch.where(normal, exp_unbiased + f.bias, torch.zeros_like(exp_unbiased))
    scale = torch.ldexp(torch.ones_like(a), torch.where(normal, exp_unbiased, torch.full_like(e2, f.min_exponent)))
    mantissa = torch.where(normal, rounded / scale - 1, rounded / scale) * (1 << f.mantissa_bits)
    bits = sign | (exp_field << f.mantissa_bits) | torch.round(mantissa).to(torch.int32)
    nan_bits = sign | 0x7F
    if f.has_inf:
        overflow_bits = sign | (0x1F << f.mantissa_bits)
    else:
        overflow_bits = (sign | f.max_finite_bits) if f.saturates else nan_bits
    bits = torch.where(a >= f.overflow if f.tie_overflows else a > f.overflow, overflow_bits, bits)
    bits = torch.where(torch.isnan(x), nan_bits, bits)
    return bits.to(torch.uint8)


def decode(bits: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """float32 values of FP8 bit patterns (uint8) in `dtype`."""
    f = FORMATS[dtype]
    b = bits.to(torch.int32)
    sign = torch.where((b >> 7) == 1, -1.0, 1.0)
    exp_field = (b >> f.mantissa_bits) & ((1 << (7 - f.mantissa_bits)) - 1)
    mantissa = (b & ((1 << f.mantissa_bits) - 1)).to(torch.float32)
    one = torch.ones_like(mantissa)
    subnormal = torch.ldexp(mantissa, torch.full_like(exp_field, f.min_exponent - f.mantissa_bits))
    normal = torch.ldexp(one + mantissa / (1 << f.mantissa_bits), exp_field - f.bias)
    value = torch.where(exp_field == 0, subnormal, normal) * sign
    top = (1 << (7 - f.mantissa_bits)) - 1
    if f.has_inf:
        value = torch.where((exp_field == top) & (mantissa == 0), sign * torch.inf, value)
        value = torch.where((exp_field == top) & (mantissa != 0), torch.nan, value)
    else:
        value = torch.where((exp_field == top) & (mantissa == (1 << f.mantissa_bits) - 1), torch.nan, value)
    return value


def to_fp8(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """`x` converted to `dtype` without FP8 arithmetic (the FP8 tensor only stores the bits)."""
    return encode(x, dtype).view(dtype)


def from_fp8(x: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    return decode(x.view(torch.uint8), x.dtype).to(dtype)
