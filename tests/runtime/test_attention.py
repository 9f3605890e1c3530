"""Scaled-dot-product attention on flagos runs the backing's fused kernels, forward and backward.

On the host the backing's fused attention is the CPU's flash attention, served through PyTorch's
overrideable SDPA backend for PrivateUse1; on CUDA, the backing's own choice (flash, efficient,
cuDNN), never the explicit CPU route.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.profiler import ProfilerActivity, profile

import torch_fl


def _qkv(dtype: torch.dtype = torch.float32, heads_kv: int = 4) -> tuple[torch.Tensor, ...]:
    torch.manual_seed(0)
    q = torch.randn(2, 4, 32, 16, dtype=dtype)
    k = torch.randn(2, heads_kv, 32, 16, dtype=dtype)
    v = torch.randn(2, heads_kv, 32, 16, dtype=dtype)
    return q, k, v


def _ops_run(fn) -> set[str]:
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        fn()
    return {event.key for event in prof.key_averages()}


@pytest.mark.backing_cpu
def test_host_choice_is_the_overrideable_backend():
    q, k, v = (t.to("flagos") for t in _qkv())
    assert torch._fused_sdp_choice(q, k, v) == SDPBackend.OVERRIDEABLE.value
    # what the CPU would not fuse stays on the math path, as on the CPU
    assert torch._fused_sdp_choice(q, k, v, dropout_p=0.5) == SDPBackend.MATH.value
    with sdpa_kernel([SDPBackend.MATH]):
        assert torch._fused_sdp_choice(q, k, v) == SDPBackend.MATH.value


@pytest.mark.backing_cpu
@pytest.mark.parametrize(
    "case",
    [
        {},
        {"is_causal": True},
        {"mask": True},
        {"dtype": torch.bfloat16},
        {"heads_kv": 2, "enable_gqa": True},
    ],
    ids=["plain", "causal", "mask", "bfloat16", "gqa"],
)
def test_host_fused_attention_equals_the_cpu_fused_kernel(case):
    q, k, v = (t.requires_grad_() for t in _qkv(case.get("dtype", torch.float32), case.get("heads_kv", 4)))
    kwargs = {"is_causal": case.get("is_causal", False), "enable_gqa": case.get("enable_gqa", False)}
    if case.get("mask"):
        kwargs["attn_mask"] = torch.rand(32, 32) > 0.3
    grad = torch.randn(2, 4, 32, 16, dtype=q.dtype)
    out_cpu = F.scaled_dot_product_attention(q, k, v, **kwargs)
    out_cpu.backward(grad)

    fq, fk, fv = (t.detach().to("flagos").requires_grad_() for t in (q, k, v))
    fl_kwargs = {name: v.to("flagos") if isinstance(v, torch.Tensor) else v for name, v in kwargs.items()}
    ran: dict[str, torch.Tensor] = {}

    def step() -> None:
        ran["out"] = F.scaled_dot_product_attention(fq, fk, fv, **fl_kwargs)
        ran["out"].backward(grad.to("flagos"))

    ops = _ops_run(step)
    assert "aten::_scaled_dot_product_fused_attention_overrideable" in ops
    assert "aten::_scaled_dot_product_fused_attention_overrideable_backward" in ops
    assert "aten::_scaled_dot_product_flash_attention_for_cpu" in ops
    assert "aten::_softmax" not in ops  # not the unfused composite
    # the same CPU kernels on the same bytes: identical results
    assert torch.equal(ran["out"].cpu(), out_cpu.detach())
    for fl, cpu in zip((fq, fk, fv), (q, k, v)):
        assert fl.grad.device.type == "flagos"
        assert torch.equal(fl.grad.cpu(), cpu.grad)


@pytest.mark.backing_cpu
def test_mask_that_wants_a_gradient_keeps_the_math_path():
    q, k, v = (t.to("flagos") for t in _qkv())
    bias = torch.randn(32, 32, device="flagos", requires_grad=True)
    assert torch._fused_sdp_choice(q, k, v, bias) == SDPBackend.MATH.value
    F.scaled_dot_product_attention(q, k, v, attn_mask=bias).sum().backward()
    assert bias.grad is not None and bias.grad.device.type == "flagos"


@pytest.mark.backing_cpu
def test_output_layout_matches_the_meta_kernel():
    op = torch.ops.aten._scaled_dot_product_fused_attention_overrideable
    # contiguous, and a head-interleaved view as a fused qkv projection makes it
    for q in (_qkv()[0], torch.randn(2, 32, 3, 4, 16)[:, :, 0].transpose(1, 2)):
        fl = torch.empty_strided(q.shape, q.stride(), device="flagos").copy_(q)
        out, lse = op(fl, fl, fl)[:2]
        with torch._subclasses.fake_tensor.FakeTensorMode():
            fake = torch.empty_strided(q.shape, q.stride(), device="flagos")
            meta_out, meta_lse = op(fake, fake, fake)[:2]
        assert out.stride() == meta_out.stride()
        assert lse.stride() == meta_lse.stride()


@pytest.mark.cuda
@pytest.mark.backing_cuda
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_cuda_backing_attention_stays_on_the_device(dtype):
    q, k, v = (t.to("flagos").requires_grad_() for t in _qkv(dtype))
    core = torch_fl.runtime.core()
    core.reset_route_counts()
    out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    out.sum().backward()
    on_cpu = {op: cpu for op, (_, cpu) in core.route_counts().items() if cpu}
    assert not on_cpu, f"attention ran on the explicit CPU route: {on_cpu}"
    reference = F.scaled_dot_product_attention(*(t.detach().cpu().float() for t in (q, k, v)), is_causal=True)
    torch.testing.assert_close(out.detach().cpu().float(), reference, rtol=2e-2, atol=2e-2)


@pytest.mark.cuda
@pytest.mark.backing_cuda
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_cuda_choice_is_the_backings_for_the_same_tensors(dtype):
    # An eager choice reads pooled aliases of the flagos tensors; one that wants a gradient reads
    # fresh ones carrying requires_grad. Both must answer what CUDA answers for the same tensors.
    cuda = _qkv(dtype)
    cuda = tuple(t.cuda() for t in cuda)
    flagos = tuple(t.to("flagos") for t in cuda)
    mask = torch.ones(32, 32, dtype=torch.bool).tril()
    for _ in range(2):  # the second round reuses the aliases the first handed back
        assert torch._fused_sdp_choice(*flagos) == torch._fused_sdp_choice(*cuda)
        assert torch._fused_sdp_choice(*flagos, is_causal=True) == torch._fused_sdp_choice(*cuda, is_causal=True)
        assert torch._fused_sdp_choice(*flagos, mask.to("flagos")) == torch._fused_sdp_choice(*cuda, mask.cuda())
    grads = tuple(t.detach().requires_grad_() for t in flagos)
    assert torch._fused_sdp_choice(*grads) == torch._fused_sdp_choice(*(t.detach().requires_grad_() for t in cuda))
