"""torch.nn.attention.flex_attention on flagos, eager and compiled, equals the backing device's.

The host backing follows the CPU's rules (inference only; inductor's C++ template when compiled);
the CUDA backing the GPU's (with backward; the Triton template), run on the board.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch.nn.attention.flex_attention import create_block_mask, flex_attention

import torch_fl
from torch_fl.runtime.device import core as device_core

ACTIVE = torch_fl.is_active()
BACKING = device_core.backing() if ACTIVE else None

pytestmark = pytest.mark.skipif(not ACTIVE, reason="flagos is not active in this process")
host_backing = pytest.mark.skipif(BACKING != "cpu", reason=f"a rule of the host backing; here: {BACKING}")
cuda_backing = pytest.mark.skipif(
    not torch.cuda.is_available() or BACKING != "cuda",
    reason="needs a CUDA device and flagos on CUDA backing (FLAGOS_PLATFORM=nvidia_h200)",
)


def causal(b, h, q_idx, kv_idx):
    return q_idx >= kv_idx


def relative_bias(score, b, h, q_idx, kv_idx):
    return score + (q_idx - kv_idx) * 0.01


def inputs(device: str, dtype: torch.dtype = torch.float32) -> tuple[torch.Tensor, ...]:
    torch.manual_seed(0)
    return tuple(torch.randn(1, 2, 128, 16, dtype=dtype).to(device) for _ in range(3))


def reference(score_mod=None, mask_mod=None) -> torch.Tensor:
    """flex_attention on the backing device itself, compiled as the flagos case is."""
    device = "cuda" if BACKING == "cuda" else "cpu"
    q, k, v = inputs(device)
    block_mask = create_block_mask(mask_mod, 1, 1, 128, 128, device=device) if mask_mod else None
    return flex_attention(q, k, v, score_mod=score_mod, block_mask=block_mask).cpu()


def test_eager_flex_attention_on_flagos():
    q, k, v = inputs("flagos")
    block_mask = create_block_mask(causal, 1, 1, 128, 128, device="flagos")
    out = flex_attention(q, k, v, score_mod=relative_bias, block_mask=block_mask)
    assert out.device.type == "flagos"
    torch.testing.assert_close(out.cpu(), reference(relative_bias, causal), rtol=1e-5, atol=1e-5)


@pytest.mark.slow
def test_compiled_flex_attention_on_flagos():
    torch._dynamo.reset()
    q, k, v = inputs("flagos")
    block_mask = create_block_mask(causal, 1, 1, 128, 128, device="flagos")
    compiled = torch.compile(flex_attention, fullgraph=True)
    with torch.no_grad():
        out = compiled(q, k, v, score_mod=relative_bias, block_mask=block_mask)
    assert out.device.type == "flagos"
    torch.testing.assert_close(out.cpu(), reference(relative_bias, causal), rtol=1e-4, atol=1e-4)


@host_backing
def test_host_backing_refuses_backward_as_the_cpu_does():
    q, k, v = (t.requires_grad_() for t in inputs("flagos"))
    with pytest.raises(NotImplementedError, match="host backing"):
        flex_attention(q, k, v)


# The plain-CUDA reference trains in a child process without flagos: a process where flagos is
# registered cannot run autograd over plain CUDA tensors (the README's containment rule).
PLAIN_CUDA_TRAINING = """
import sys, torch
sys.path.insert(0, {folder!r})
from test_flex_attention import causal, relative_bias
from torch.nn.attention.flex_attention import create_block_mask, flex_attention
q, k, v = (t.to("cuda").requires_grad_() for t in torch.load({path!r}))
mask = create_block_mask(causal, 1, 1, 128, 128, device="cuda")
out = torch.compile(flex_attention, fullgraph=True)(q, k, v, score_mod=relative_bias, block_mask=mask)
out.float().sum().backward()
torch.save((out.detach().cpu(), q.grad.cpu()), {path!r})
"""


@pytest.mark.cuda
@pytest.mark.slow
@cuda_backing
def test_cuda_backing_flex_attention_trains_compiled(tmp_path):
    torch._dynamo.reset()
    q, k, v = (t.requires_grad_() for t in inputs("flagos", torch.bfloat16))
    block_mask = create_block_mask(causal, 1, 1, 128, 128, device="flagos")
    compiled = torch.compile(flex_attention, fullgraph=True)
    out = compiled(q, k, v, score_mod=relative_bias, block_mask=block_mask)
    out.float().sum().backward()
    assert q.grad is not None and q.grad.device.type == "flagos"
    path = tmp_path / "tensors.pt"
    torch.save(tuple(t.detach().cpu() for t in (q, k, v)), path)
    child = PLAIN_CUDA_TRAINING.format(folder=str(Path(__file__).parent), path=str(path))
    env = dict(os.environ, TORCH_DEVICE_BACKEND_AUTOLOAD="0")
    subprocess.run([sys.executable, "-c", child], env=env, check=True, timeout=300)
    expected, expected_grad = torch.load(path)
    torch.testing.assert_close(out.cpu(), expected, rtol=2e-2, atol=2e-2)
    torch.testing.assert_close(q.grad.cpu(), expected_grad, rtol=2e-2, atol=2e-2)
