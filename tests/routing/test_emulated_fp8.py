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
    special = torch.tensor(
        [0.0, -0.0, 448, 464, 465, 57344, 61439, 61440, 1e9, -1e9, float("inf"), float("-inf"), 2**-9, 2**-17]
    )
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


# ---- against the H200's FP8 hardware (run on the GPU board with FLAGOS_PLATFORM=nvidia_h200)


def _flagos_on_cuda() -> bool:
    import torch_fl
    from torch_fl.runtime.device.core import backing

    return torch.cuda.is_available() and torch_fl.is_active() and backing() == "cuda"


on_fp8_hardware = pytest.mark.skipif(
    not _flagos_on_cuda() or torch.cuda.get_device_capability() < (8, 9),
    reason="needs flagos on CUDA backing over a GPU with FP8 tensor cores (sm_89 or newer)",
)


@pytest.mark.cuda
@on_fp8_hardware
@pytest.mark.parametrize("dtype", FP8)
def test_casts_equal_the_gpu_conversion(dtype):
    torch.manual_seed(0)
    x = torch.cat([torch.randn(1 << 16) * s for s in (1e-3, 1, 100, 1e4)]).cuda()
    on_flagos = x.to("flagos")
    with forced("aten::_to_copy", "emulated"):
        ours = on_flagos.to(dtype)
    assert torch.equal(ours.cpu().view(torch.uint8), x.to(dtype).view(torch.uint8).cpu())


@pytest.mark.cuda
@on_fp8_hardware
@pytest.mark.parametrize(
    ("a_dtype", "b_dtype"),
    [
        (torch.float8_e4m3fn, torch.float8_e4m3fn),
        (torch.float8_e4m3fn, torch.float8_e5m2),
        (torch.float8_e5m2, torch.float8_e4m3fn),
    ],
)
@pytest.mark.parametrize("out_dtype", [torch.float32, torch.bfloat16])
def test_emulated_scaled_mm_matches_the_gpu_fp8_matmul(a_dtype, b_dtype, out_dtype):
    """The emulated path against torch._scaled_mm on the GPU's FP8 tensor cores (per-tensor
    scales), both measured against a float64 product of the same FP8 values. The hardware's
    accumulator is narrower than float32 (measured on the H200: up to 0.024 absolute on outputs of
    about 25 with float32 results), so the emulation, which accumulates in float32, must be at
    least as accurate as the hardware, not equal to it."""
    torch.manual_seed(0)
    m, k, n = 256, 512, 384
    a = torch.randn(m, k, device="cuda").to(a_dtype)
    b = torch.randn(n, k, device="cuda").to(b_dtype).t()  # column-major, as the hardware requires
    scale_a, scale_b = torch.tensor(0.75, device="cuda"), torch.tensor(1.5, device="cuda")
    hardware = torch._scaled_mm(a, b, scale_a, scale_b, out_dtype=out_dtype)
    fa, fb = a.to("flagos"), b.to("flagos")
    with forced("aten::_scaled_mm", "emulated"):
        emulated = torch._scaled_mm(fa, fb, scale_a.to("flagos"), scale_b.to("flagos"), out_dtype=out_dtype)
    assert emulated.device.type == "flagos" and emulated.dtype == out_dtype
    reference = (a.cpu().double() * 0.75) @ (b.cpu().double() * 1.5)
    size = reference.abs().max().item()
    error_hw = (hardware.cpu().double() - reference).abs().max().item()
    error_em = (emulated.cpu().double() - reference).abs().max().item()
    # float32: summation order only; bfloat16: plus rounding the result (half an ulp, 2**-9 relative)
    allowance = size * (1e-5 if out_dtype == torch.float32 else 2**-8)
    assert error_em <= max(error_hw, allowance), (error_em, error_hw, size)
    # the hardware's bfloat16 results carry the same final rounding (measured: 0.255 on outputs of 118)
    assert error_hw <= size * 2e-3 + allowance, "the GPU's own FP8 matmul is off: the comparison means nothing"
