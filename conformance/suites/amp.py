"""amp: torch.autocast("flagos") casts each op class as PyTorch's autocast lists say, and GradScaler works.

For each AMP dtype the platform declares: matmul-like ops (mm, linear, conv) run in the lower
precision; precision-sensitive ops (softmax, log_softmax, layer_norm, mse_loss, sum) run in
float32; promote ops (cat, addcmul) take the widest input dtype. Values are checked too: an
autocast mm must equal the same mm done in the lower precision by hand.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.nn.functional as F

SUITE = "amp"
AMP_DTYPES = ("bfloat16", "float16")


def _inputs(*shapes: tuple[int, ...], dtype: torch.dtype = torch.float32) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(31)
    return [torch.randn(s, generator=g).to(dtype).to("flagos") for s in shapes]


# name: (aten op, function of (lower dtype) -> output under autocast, expected output dtype: "lower" | "float32" | "widest")
CASES: dict[str, tuple[str, Callable[[torch.dtype], torch.Tensor], str]] = {
    "mm": ("aten::mm", lambda d: torch.mm(*_inputs((8, 16), (16, 4))), "lower"),
    "linear": ("aten::linear", lambda d: F.linear(*_inputs((4, 16), (8, 16), (8,))), "lower"),
    "conv2d": ("aten::conv2d", lambda d: F.conv2d(*_inputs((1, 3, 8, 8), (4, 3, 3, 3))), "lower"),
    "bmm": ("aten::bmm", lambda d: torch.bmm(*_inputs((2, 4, 8), (2, 8, 3))), "lower"),
    "softmax": ("aten::softmax.int", lambda d: torch.softmax(_inputs((4, 8), dtype=d)[0], dim=-1), "float32"),
    "log_softmax": (
        "aten::log_softmax.int",
        lambda d: torch.log_softmax(_inputs((4, 8), dtype=d)[0], dim=-1),
        "float32",
    ),
    "layer_norm": ("aten::layer_norm", lambda d: F.layer_norm(_inputs((4, 8), dtype=d)[0], (8,)), "float32"),
    "mse_loss": ("aten::mse_loss", lambda d: F.mse_loss(*_inputs((4, 8), (4, 8), dtype=d)), "float32"),
    "sum": ("aten::sum", lambda d: torch.sum(_inputs((4, 8), dtype=d)[0]), "float32"),
    "cat": ("aten::cat", lambda d: torch.cat([_inputs((2, 3), dtype=d)[0], _inputs((2, 3))[0]]), "widest"),
    "addcmul": ("aten::addcmul", lambda d: torch.addcmul(_inputs((4,))[0], *_inputs((4,), (4,), dtype=d)), "widest"),
}


@pytest.mark.parametrize("dtype", AMP_DTYPES)
@pytest.mark.parametrize("name", list(CASES))
def test_autocast_dtype(name: str, dtype: str, fl: Any) -> None:
    if dtype not in fl.descriptor.capabilities.amp_dtypes:
        pytest.skip(f"{dtype} is not among the platform's AMP dtypes")
    op, run, kind = CASES[name]
    fl.meta(op=op, dtype=dtype)
    lower = getattr(torch, dtype)
    with torch.autocast("flagos", dtype=lower):
        out = run(lower)
    expected = {"lower": lower, "float32": torch.float32, "widest": torch.float32}[kind]
    assert out.device.type == "flagos", f"{name} under autocast ran on {out.device}"
    assert out.dtype == expected, f"{name} under autocast({dtype}) gave {out.dtype}, PyTorch's lists say {expected}"
    plain = run(lower)
    if kind == "lower":
        by_hand = _by_hand(name, lower)
        torch.testing.assert_close(out.cpu().float(), by_hand.float(), rtol=2e-2, atol=2e-2, msg=f"{name} values")
    else:
        torch.testing.assert_close(out.cpu().float(), plain.cpu().float(), rtol=2e-2, atol=2e-2, msg=f"{name} values")


def _by_hand(name: str, lower: torch.dtype) -> torch.Tensor:
    """The lower-precision result computed on the CPU from the same inputs cast by hand."""
    with torch.no_grad():
        args = {
            "mm": ((8, 16), (16, 4)),
            "linear": ((4, 16), (8, 16), (8,)),
            "conv2d": ((1, 3, 8, 8), (4, 3, 3, 3)),
            "bmm": ((2, 4, 8), (2, 8, 3)),
        }[name]
        g = torch.Generator().manual_seed(31)
        xs = [torch.randn(s, generator=g).to(lower).float() for s in args]
        fn = {"mm": torch.mm, "linear": F.linear, "conv2d": F.conv2d, "bmm": torch.bmm}[name]
        return fn(*xs).to(lower)


@pytest.mark.parametrize("dtype", AMP_DTYPES)
def test_autocast_can_be_disabled_inside(dtype: str, fl: Any) -> None:
    if dtype not in fl.descriptor.capabilities.amp_dtypes:
        pytest.skip(f"{dtype} is not among the platform's AMP dtypes")
    fl.meta(op="aten::mm", dtype=dtype)
    a, b = _inputs((4, 4), (4, 4))
    with torch.autocast("flagos", dtype=getattr(torch, dtype)):
        assert torch.is_autocast_enabled("flagos")
        assert torch.get_autocast_dtype("flagos") == getattr(torch, dtype)
        with torch.autocast("flagos", enabled=False):
            inner = torch.mm(a, b)
    assert inner.dtype == torch.float32, f"mm with autocast disabled inside gave {inner.dtype}"


def _scaler_model() -> tuple[torch.nn.Module, torch.optim.Optimizer, torch.amp.GradScaler]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1)).to("flagos")
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    return model, opt, torch.amp.GradScaler("flagos", init_scale=2.0**10)


@pytest.mark.parametrize("dtype", AMP_DTYPES)
def test_grad_scaler_steps_and_skips_inf(dtype: str, fl: Any) -> None:
    if dtype not in fl.descriptor.capabilities.amp_dtypes:
        pytest.skip(f"{dtype} is not among the platform's AMP dtypes")
    fl.meta(op="aten::_amp_foreach_non_finite_check_and_unscale_", dtype=dtype)
    model, opt, scaler = _scaler_model()
    x, y = _inputs((16, 8), (16, 1))
    before = [p.detach().cpu().clone() for p in model.parameters()]
    for _ in range(3):
        opt.zero_grad()
        with torch.autocast("flagos", dtype=getattr(torch, dtype)):
            loss = F.mse_loss(model(x).float(), y)
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
    after = [p.detach().cpu().clone() for p in model.parameters()]
    assert any(not torch.equal(a, b) for a, b in zip(before, after)), "GradScaler.step did not step the optimizer"
    assert scaler.get_scale() == 2.0**10, f"the scale changed without an overflow: {scaler.get_scale()}"
    # An inf gradient: the step is skipped and the scale backs off.
    opt.zero_grad()
    with torch.autocast("flagos", dtype=getattr(torch, dtype)):
        loss = F.mse_loss(model(x).float(), y)
    scaler.scale(loss).backward()
    next(model.parameters()).grad.view(-1)[0] = float("inf")
    scaler.step(opt)
    scaler.update()
    skipped = [p.detach().cpu() for p in model.parameters()]
    assert all(torch.equal(a, b) for a, b in zip(after, skipped)), "the optimizer stepped on an inf gradient"
    assert scaler.get_scale() == 2.0**9, f"the scale did not back off after inf: {scaler.get_scale()}"
