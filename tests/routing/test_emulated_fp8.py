"""Software FP8: bit-exact conversions and the scaled matmul, on the emulated path."""
from __future__ import annotations

import pytest
import torch

from torch_fl.kernels import fp8
from torch_fl.kernels.emulated import scaled_mm
from torch_fl.routing import forced

FP8 = [torch.float8_e4m3fn, torch.float8_e5m2]


@pytest.mark.parametrize("dtype", FP8)
def test_encode_is_bit_exact_with_pytorch(dtype):
    torch.manual_seed(0)
    x = torch.cat([torch.randn(20000) * s for s in (1e-4, 1e-2, 1, 30, 300, 3000, 70000)])
    special = torch.tensor([0.0, -0.0, 448, 464, 465, 57344, 61439, 61440, 1e9, -1e9, float("inf"), float("-inf"), 2**-9, 2**-17])
    x = torch.cat([x, special])
    assert torch.equal(fp8.encode(x, dtype), x.to(dtype).view(torch.uint8))
    assert torch.isnan(fp8.from_fp8(fp8.to_fp8(torch.tensor([float("nan")]), dtype))).all()


@pytest.mark.parametrize("dtype", FP8)
def test_decode_every_bit_pattern(dtype):
    bits = torch.arange(256, dtype=torch.uint8)
    ours, theirs = fp8.decode(bits, dtype), bits.view(dtype).float()
    assert torch.equal(ours.isnan(), theirs.isnan())
    assert torch.equal(ours[~ours.isnan()], theirs[~theirs.isnan()])


def test_scaled_mm_matches_a_float64_reference():
    torch.manual_seed(0)
    a32, b32 = torch.randn(16, 32), torch.randn(32, 24)
    scale_a, scale_b = torch.tensor(0.5), torch.tensor(2.0)
    a, b = a32.to(torch.float8_e4m3fn), b32.t().contiguous().to(torch.float8_e4m3fn).t()
    out = scaled_mm(a, b, scale_a, scale_b, out_dtype=torch.float32)
    reference = (a.double() * 0.5) @ (b.double() * 2.0)
    assert torch.allclose(out.double(), reference, rtol=1e-5, atol=1e-4)


def test_emulated_route_on_flagos():
    torch.manual_seed(0)
    x = torch.randn(64)
    with forced("aten::_to_copy", "emulated"):
        y = x.to("flagos").to(torch.float8_e4m3fn)
        back = y.to(torch.float32)
    assert torch.equal(y.cpu().view(torch.uint8), x.to(torch.float8_e4m3fn).view(torch.uint8))
    assert torch.equal(back.cpu(), x.to(torch.float8_e4m3fn).float())
