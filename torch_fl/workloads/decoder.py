"""A small decoder-only transformer language model and its training step.

One definition serves every place that trains "a small transformer": the route tuner's default
workload, bench/train_step.py and the conformance model case. It depends on torch alone, and is a
script too: `python decoder.py DEVICE STEPS [CONFIG] OUT_JSON` writes the per-step losses, for
references that must run in a process that never imports torch_fl (on a CUDA machine, a process
with flagos registered cannot run autograd over plain CUDA tensors: pytorch/pytorch#161129).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F


@dataclass(frozen=True)
class DecoderConfig:
    vocab: int = 256
    dim: int = 64
    heads: int = 4
    layers: int = 2
    seq: int = 32
    batch: int = 4

    @property
    def parameters(self) -> int:
        block = 12 * self.dim * self.dim + 4 * self.dim
        return self.layers * block + 2 * self.vocab * self.dim + self.seq * self.dim


CONFIGS = {
    "tiny": DecoderConfig(),
    # launch-bound on a GPU: many small kernels, host dispatch dominates
    "small": DecoderConfig(vocab=1024, dim=512, heads=8, layers=2, seq=256, batch=4),
    # GPU-bound on an H200 (a few hundred million parameters, >= 20 ms of GPU time per step in bf16)
    "large": DecoderConfig(vocab=32000, dim=2048, heads=16, layers=6, seq=1024, batch=8),
}


class Block(nn.Module):
    def __init__(self, c: DecoderConfig) -> None:
        super().__init__()
        self.heads = c.heads
        self.ln1 = nn.LayerNorm(c.dim)
        self.qkv = nn.Linear(c.dim, 3 * c.dim, bias=False)
        self.proj = nn.Linear(c.dim, c.dim, bias=False)
        self.ln2 = nn.LayerNorm(c.dim)
        self.fc1 = nn.Linear(c.dim, 4 * c.dim, bias=False)
        self.fc2 = nn.Linear(4 * c.dim, c.dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(b, t, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, t, d)
        x = x + self.proj(a)
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))


class DecoderLM(nn.Module):
    def __init__(self, c: DecoderConfig) -> None:
        super().__init__()
        self.embed = nn.Embedding(c.vocab, c.dim)
        self.pos = nn.Parameter(torch.zeros(c.seq, c.dim))
        self.blocks = nn.ModuleList(Block(c) for _ in range(c.layers))
        self.norm = nn.LayerNorm(c.dim)
        self.head = nn.Linear(c.dim, c.vocab, bias=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens) + self.pos[: tokens.shape[1]]
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x))


def batch(c: DecoderConfig, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """A deterministic token batch (inputs, next-token targets), made on the CPU."""
    g = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, c.vocab, (c.batch, c.seq + 1), generator=g)
    return tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()


def build(
    c: DecoderConfig,
    device: str,
    dtype: torch.dtype = torch.float32,
    seed: int = 0,
    lr: float = 3e-3,
    compiled: bool = False,
) -> tuple[DecoderLM, torch.optim.Optimizer, Callable[[], torch.Tensor]]:
    """Model, AdamW optimizer and a `step()` returning the (un-synchronised) loss tensor.

    The model is initialised on the CPU from `seed`, so every device starts from the same weights.
    `compiled` runs its forward and backward through torch.compile (inductor); the optimizer stays eager.
    """
    torch.manual_seed(seed)
    model = DecoderLM(c).to(device=device, dtype=dtype)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, foreach=True)
    inputs, targets = (t.to(device) for t in batch(c, seed))
    forward = torch.compile(model) if compiled else model

    def step() -> torch.Tensor:
        optimizer.zero_grad(set_to_none=True)
        logits = forward(inputs)
        loss = F.cross_entropy(logits.float().view(-1, c.vocab), targets.view(-1))
        loss.backward()
        optimizer.step()
        return loss.detach()

    return model, optimizer, step


def train(c: DecoderConfig, device: str, steps: int, dtype: torch.dtype = torch.float32, seed: int = 0) -> list[float]:
    """Per-step losses of `steps` training steps."""
    _, _, step = build(c, device, dtype, seed)
    return [float(step()) for _ in range(steps)]


if __name__ == "__main__":
    device_name, step_count, *config_name, out_path = sys.argv[1:]
    config = CONFIGS[config_name[0] if config_name else "tiny"]
    with open(out_path, "w") as f:
        json.dump({"losses": train(config, device_name, int(step_count)), "torch": torch.__version__}, f)
