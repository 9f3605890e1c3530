"""A small decoder-only transformer and its training loop, depending on torch alone.

The model suite trains it on flagos and on the reference device and compares the losses. On a
CUDA backing the reference must run in a process that never imports torch_fl (registering a
PrivateUse1 device breaks autograd on plain CUDA tensors in that process: pytorch/pytorch#161129),
so this file is also a script: `python tinylm.py DEVICE STEPS OUT_JSON` runs the reference there.
"""
from __future__ import annotations

import json
import math
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F

VOCAB, DIM, HEADS, LAYERS, SEQ, BATCH = 64, 32, 4, 2, 16, 4


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(DIM), nn.LayerNorm(DIM)
        self.qkv = nn.Linear(DIM, 3 * DIM)
        self.proj = nn.Linear(DIM, DIM)
        self.mlp = nn.Sequential(nn.Linear(DIM, 4 * DIM), nn.GELU(), nn.Linear(4 * DIM, DIM))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(b, t, 3, HEADS, DIM // HEADS).permute(2, 0, 3, 1, 4)
        attn = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(attn.transpose(1, 2).reshape(b, t, DIM))
        return x + self.mlp(self.ln2(x))


class TinyLM(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(VOCAB, DIM)
        self.pos = nn.Parameter(torch.randn(SEQ, DIM) / math.sqrt(DIM))
        self.blocks = nn.ModuleList(Block() for _ in range(LAYERS))
        self.ln = nn.LayerNorm(DIM)
        self.head = nn.Linear(DIM, VOCAB, bias=False)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        x = self.emb(idx) + self.pos
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln(x))


def batches(steps: int) -> list[torch.Tensor]:
    """Token batches from a CPU generator: the same data on every device."""
    g = torch.Generator().manual_seed(1234)
    # A learnable pattern (each token predicts the next of a fixed random permutation), plus noise.
    perm = torch.randperm(VOCAB, generator=g)
    out = []
    for _ in range(steps):
        start = torch.randint(0, VOCAB, (BATCH, 1), generator=g)
        seq = [start]
        for _ in range(SEQ):
            seq.append(perm[seq[-1]])
        out.append(torch.cat(seq, dim=1))
    return out


def train(device: str, steps: int = 20, dtype: torch.dtype = torch.float32) -> list[float]:
    """Per-step training losses of a seeded TinyLM on `device` (AdamW, next-token cross-entropy)."""
    torch.manual_seed(0)
    model = TinyLM().to(dtype)  # initialised on the CPU, so every device starts from the same weights
    model = model.to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, foreach=False)
    losses = []
    for tokens in batches(steps):
        tokens = tokens.to(device)
        logits = model(tokens[:, :-1])
        loss = F.cross_entropy(logits.flatten(0, 1).float(), tokens[:, 1:].flatten())
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


if __name__ == "__main__":
    device_name, step_count, out_path = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    with open(out_path, "w") as f:
        json.dump({"losses": train(device_name, step_count), "torch": torch.__version__}, f)
