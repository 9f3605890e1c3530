"""torch.autocast("flagos") follows PyTorch's autocast op lists (the ones CUDA uses) and
torch.amp.GradScaler("flagos") scales, unscales, skips steps with inf/nan gradients and adapts."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

LOW = [torch.bfloat16, torch.float16]


def inputs(*shapes, dtype=torch.float32):
    torch.manual_seed(0)
    return [torch.randn(*s, dtype=dtype, device="flagos") for s in shapes]


# ops autocast runs in the low-precision dtype (PyTorch's lower_precision_fp list)
LOWER_PRECISION = {
    "mm": lambda a, b: torch.mm(a, b),
    "matmul": lambda a, b: a @ b,
    "linear": lambda a, b: F.linear(a, b),
    "addmm": lambda a, b: torch.addmm(a, a, b),
    "bmm": lambda a, b: torch.bmm(a[None], b[None]),
    "baddbmm": lambda a, b: torch.baddbmm(a[None], a[None], b[None]),
    "conv2d": lambda a, b: F.conv2d(a[None, None], b[None, None, :3, :3]),
    "sdpa": lambda a, b: F.scaled_dot_product_attention(a[None], b[None], b[None]),
}
# ops autocast runs in float32 (PyTorch's fp32 list)
FLOAT32 = {
    "softmax": lambda a, b: torch.softmax(a, 0),
    "log_softmax": lambda a, b: torch.log_softmax(a, 1),
    "layer_norm": lambda a, b: F.layer_norm(a, (a.shape[-1],)),
    "mse_loss": lambda a, b: F.mse_loss(a, b),
    "sum": lambda a, b: a.sum(),
    "prod": lambda a, b: a.prod(),
    "cumsum": lambda a, b: a.cumsum(0),
    "exp": lambda a, b: a.exp(),
    "pow": lambda a, b: a.pow(2),
    "norm": lambda a, b: a.norm(),
    "nll_loss": lambda a, b: F.nll_loss(a, torch.tensor([0, 1, 2, 3, 0, 1, 2, 3], device=a.device)),
    "bce_with_logits": lambda a, b: F.binary_cross_entropy_with_logits(a, b.sigmoid()),
    "logsumexp": lambda a, b: a.logsumexp(1),
    "reciprocal": lambda a, b: a.reciprocal(),
    "group_norm": lambda a, b: F.group_norm(a[None], 2),
}
# ops autocast runs in the widest input dtype (PyTorch's promote list)
PROMOTE = {
    "addcmul": lambda a, b: torch.addcmul(a, a.to(b.dtype), b),
    "addcdiv": lambda a, b: torch.addcdiv(a, a.to(b.dtype), b.abs() + 1),
    "cat": lambda a, b: torch.cat([a, b]),
    "stack": lambda a, b: torch.stack([a, b]),
    "index_put": lambda a, b: a.index_put((torch.tensor([0], device=a.device),), b[0]),
}


def low_inputs(low):
    """One float32 and one low-precision 8x8 input: promote ops see both dtypes."""
    a, b = inputs((8, 8), (8, 8))
    return a, b.to(low)


@pytest.mark.parametrize("low", LOW, ids=str)
@pytest.mark.parametrize("op", LOWER_PRECISION.values(), ids=LOWER_PRECISION.keys())
def test_lower_precision_ops(op, low, same):
    a, b = inputs((8, 8), (8, 8))
    with torch.autocast("flagos", dtype=low):
        result = op(a, b)
    assert result.dtype == low
    # same numbers as the op run on CPU in the low dtype
    same(result, op(a.cpu().to(low), b.cpu().to(low)), rtol=2e-2, atol=2e-2)


@pytest.mark.parametrize("low", LOW, ids=str)
@pytest.mark.parametrize("op", FLOAT32.values(), ids=FLOAT32.keys())
def test_float32_ops(op, low, same):
    a, b = inputs((8, 8), (8, 8), dtype=low)
    with torch.autocast("flagos", dtype=low):
        result = op(a, b)
    assert result.dtype == torch.float32
    same(result, op(a.cpu().float(), b.cpu().float()), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("low", LOW, ids=str)
@pytest.mark.parametrize("op", PROMOTE.values(), ids=PROMOTE.keys())
def test_promote_ops(op, low):
    a, b = low_inputs(low)
    with torch.autocast("flagos", dtype=low):
        assert op(a, b).dtype == torch.float32
        assert op(a.to(low), b).dtype == low


def test_autocast_state_and_nesting():
    assert torch.amp.is_autocast_available("flagos")
    assert not torch.is_autocast_enabled("flagos")
    a, b = inputs((4, 4), (4, 4))
    with torch.autocast("flagos", dtype=torch.bfloat16):
        assert torch.is_autocast_enabled("flagos")
        assert torch.get_autocast_dtype("flagos") == torch.bfloat16
        with torch.autocast("flagos", enabled=False):
            assert (a @ b).dtype == torch.float32
        assert (a @ b).dtype == torch.bfloat16
        # autocast("flagos") leaves CPU tensors alone, as autocast("cuda") does
        assert (a.cpu() @ b.cpu()).dtype == torch.float32
    assert (a @ b).dtype == torch.float32
    assert torch.flagos.get_amp_supported_dtype() == [torch.bfloat16, torch.float16]
    assert torch.flagos.is_bf16_supported()


def test_default_autocast_dtype_and_unsupported_dtype():
    with torch.autocast("flagos"):
        assert torch.get_autocast_dtype("flagos") in (torch.float16, torch.bfloat16)
    with pytest.warns(UserWarning), torch.autocast("flagos", dtype=torch.float64):
        assert not torch.is_autocast_enabled("flagos")


@pytest.mark.parametrize("low", LOW, ids=str)
def test_backward_under_autocast(low, same):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 8), nn.LayerNorm(8), nn.Linear(8, 4))
    x, target = torch.randn(5, 8), torch.tensor([0, 1, 2, 3, 0])
    grads = {}
    for device in ("flagos", "cpu"):
        m = model.to(device)
        m.zero_grad()
        with torch.autocast(device, dtype=low):
            out = m(x.to(device))
            loss = F.cross_entropy(out, target.to(device))
        assert loss.dtype == torch.float32
        loss.backward()
        grads[device] = [p.grad.detach().cpu().clone() for p in m.parameters()]
        assert all(p.grad.dtype == torch.float32 for p in m.parameters())
    for g_fl, g_cpu in zip(grads["flagos"], grads["cpu"]):
        torch.testing.assert_close(g_fl, g_cpu, rtol=5e-2, atol=5e-2)


def test_grad_scaler_scales_and_steps(tol):
    torch.manual_seed(0)
    results = {}
    for device in ("flagos", "cpu"):
        torch.manual_seed(0)
        model = nn.Linear(4, 2).to(device)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        scaler = torch.amp.GradScaler(device, init_scale=2.0**8, growth_interval=2)
        x = torch.randn(3, 4)
        scales = []
        for _ in range(4):
            opt.zero_grad()
            loss = model(x.to(device)).pow(2).sum()
            scaled = scaler.scale(loss)
            assert scaled.device.type == device
            torch.testing.assert_close(scaled.item(), loss.item() * scaler.get_scale(), rtol=1e-6, atol=0)
            scaled.backward()
            scaler.step(opt)
            scaler.update()
            scales.append(scaler.get_scale())
        results[device] = ([p.detach().cpu() for p in model.parameters()], scales)
    assert results["flagos"][1] == results["cpu"][1] == [256.0, 512.0, 512.0, 1024.0]
    for a, b in zip(results["flagos"][0], results["cpu"][0]):
        torch.testing.assert_close(a, b, **tol)


@pytest.mark.parametrize("bad", [float("inf"), float("nan")])
def test_grad_scaler_skips_steps_with_non_finite_grads(bad):
    model = nn.Linear(3, 1).to("flagos")
    opt = torch.optim.SGD(model.parameters(), lr=1.0)
    scaler = torch.amp.GradScaler("flagos", init_scale=16.0)
    before = [p.detach().clone() for p in model.parameters()]
    scaler.scale(model(torch.ones(1, 3, device="flagos")).sum()).backward()
    model.weight.grad[0, 1] = bad
    scaler.step(opt)
    scaler.update()
    after = [p.detach() for p in model.parameters()]
    assert all(torch.equal(a.cpu(), b.cpu()) for a, b in zip(before, after)), "the step was not skipped"
    assert scaler.get_scale() == 8.0  # backoff_factor 0.5
    # the next finite step goes through
    opt.zero_grad()
    scaler.scale(model(torch.ones(1, 3, device="flagos")).sum()).backward()
    scaler.step(opt)
    scaler.update()
    assert not torch.equal(before[0].cpu(), model.weight.detach().cpu())


def test_grad_scaler_unscale_and_clip(same):
    model = nn.Linear(3, 3).to("flagos")
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = torch.amp.GradScaler("flagos", init_scale=1024.0)
    loss = model(torch.ones(2, 3, device="flagos")).sum()
    scaler.scale(loss).backward()
    scaler.unscale_(opt)
    expected = torch.autograd.grad(model(torch.ones(2, 3, device="flagos")).sum(), model.weight)[0]
    same(model.weight.grad, expected.cpu())
    nn.utils.clip_grad_norm_(model.parameters(), 0.1)
    scaler.step(opt)
    scaler.update()
    assert scaler.get_scale() == 1024.0
