"""Public architectures with random weights: the model zoo of bench/model_zoo.py and of the host tests.

Each architecture is built from an explicit config class of transformers (no hub, no download),
from torchvision (ResNet-50, where torchvision loads) or from the DiT defined here, at two sizes:

    board   realistic widths (hidden >= 768), sized from parameter and FLOP estimates for a
            training step of roughly 10-60 ms in bf16 on an H200 (6 x parameters x tokens of work)
    host    a few thousand parameters, for fp32 runs on two CPU cores

Weights are drawn on the CPU from the global RNG (seed first: every device then starts from the
same weights) and dropout is off, so that every side computes the same function. This module
depends on torch and transformers (and torchvision, where it loads), never on torch_fl: a plain
side of a benchmark loads it by path, and must not activate flagos.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn as nn
import torch.nn.functional as F

SIZES = ("board", "host")
Inputs = dict[str, torch.Tensor]


@dataclass(frozen=True)
class Shape:
    batch: int  # training and prefill batch
    seq: int  # tokens per sequence (decoder length of an encoder-decoder), or image side in pixels
    prompt: int = 0  # decode: prompt length (0: the architecture does not generate)


@dataclass(frozen=True)
class Arch:
    name: str
    what: str
    make: Callable[[str], nn.Module]  # size -> model with random weights (from the global RNG)
    inputs: Callable[[nn.Module, Shape, torch.Generator], Inputs]  # a training batch, made on the CPU
    loss: Callable[[nn.Module, Inputs], torch.Tensor]
    shapes: dict[str, Shape]

    @property
    def generates(self) -> bool:
        return self.shapes["board"].prompt > 0


def _hf_loss(model: nn.Module, inputs: Inputs) -> torch.Tensor:
    return model(**inputs).loss


def _vocab(model: nn.Module) -> int:
    return model.config.vocab_size


def _causal_inputs(model: nn.Module, shape: Shape, g: torch.Generator) -> Inputs:
    ids = torch.randint(0, _vocab(model), (shape.batch, shape.seq), generator=g)
    return {"input_ids": ids, "labels": ids}  # the model shifts the labels itself


def _masked_inputs(model: nn.Module, shape: Shape, g: torch.Generator) -> Inputs:
    ids = torch.randint(0, _vocab(model), (shape.batch, shape.seq), generator=g)
    masked = torch.rand(ids.shape, generator=g) < 0.15
    return {"input_ids": ids, "labels": torch.where(masked, ids, -100)}


def _seq2seq_inputs(model: nn.Module, shape: Shape, g: torch.Generator) -> Inputs:
    source = torch.randint(0, _vocab(model), (shape.batch, 4 * shape.seq), generator=g)
    return {"input_ids": source, "labels": torch.randint(0, _vocab(model), (shape.batch, shape.seq), generator=g)}


def _image_inputs(model: nn.Module, shape: Shape, g: torch.Generator) -> Inputs:
    classes = model.config.num_labels if hasattr(model, "config") else model.fc.out_features
    return {
        "pixel_values": torch.randn(shape.batch, 3, shape.seq, shape.seq, generator=g),
        "labels": torch.randint(0, classes, (shape.batch,), generator=g),
    }


def _pick(size: str, board: dict, host: dict) -> dict:
    if size not in SIZES:
        raise ValueError(f"unknown size {size!r}; known: {', '.join(SIZES)}")
    return board if size == "board" else host


def _gqa_dims(hidden: int, intermediate: int, layers: int, heads: int, kv_heads: int, vocab: int) -> dict:
    """The config fields that size a decoder LM with grouped-query attention."""
    return dict(
        hidden_size=hidden,
        intermediate_size=intermediate,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        vocab_size=vocab,
    )


def _gqa_decoder(
    size: str, config: Callable[..., Any], model: Callable[..., nn.Module], board: dict, tied: bool
) -> nn.Module:
    """A GQA + RoPE decoder LM from transformers' `config` and `model` classes; every such LM shares
    one host size."""
    dims = _pick(size, board, _gqa_dims(32, 64, 2, 4, 2, 128))
    return model(config(**dims, max_position_embeddings=2048, tie_word_embeddings=tied))


def llama(size: str) -> nn.Module:
    from transformers import LlamaConfig, LlamaForCausalLM

    # board: ~200 M parameters (12 layers of 1024, GQA 16 query / 4 key-value heads)
    return _gqa_decoder(size, LlamaConfig, LlamaForCausalLM, _gqa_dims(1024, 2816, 12, 16, 4, 32000), tied=False)


def qwen2(size: str) -> nn.Module:
    from transformers import Qwen2Config, Qwen2ForCausalLM

    # board: Qwen2-0.5B's published shape (494 M parameters, 14 / 2 heads, tied embeddings, qkv bias)
    return _gqa_decoder(size, Qwen2Config, Qwen2ForCausalLM, _gqa_dims(896, 4864, 24, 14, 2, 151936), tied=True)


def gpt2(size: str) -> nn.Module:
    from transformers import GPT2Config, GPT2LMHeadModel

    # board: GPT-2 small (124 M parameters; the output head is the token embedding)
    dims = _pick(
        size,
        dict(n_embd=768, n_layer=12, n_head=12, vocab_size=50257),
        dict(n_embd=32, n_layer=2, n_head=4, vocab_size=128),
    )
    end = dims["vocab_size"] - 1  # GPT-2's <|endoftext|> is its last token
    config = GPT2Config(
        **dims,
        n_positions=1024,
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
        bos_token_id=end,
        eos_token_id=end,
        tie_word_embeddings=True,
    )
    return GPT2LMHeadModel(config)


def mixtral(size: str) -> nn.Module:
    from transformers import MixtralConfig, MixtralForCausalLM

    # board: 8 experts, top-2 routing; ~490 M parameters, ~190 M active per token
    dims = _pick(size, _gqa_dims(1024, 2048, 8, 16, 4, 32000), _gqa_dims(32, 48, 2, 4, 2, 128))
    return MixtralForCausalLM(
        MixtralConfig(**dims, num_local_experts=8, num_experts_per_tok=2, max_position_embeddings=2048)
    )


def bert(size: str) -> nn.Module:
    from transformers import BertConfig, BertForMaskedLM

    # board: BERT-base (110 M parameters), masked-LM head tied to the token embedding
    dims = _pick(
        size,
        dict(hidden_size=768, num_hidden_layers=12, num_attention_heads=12, intermediate_size=3072, vocab_size=30522),
        dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64, vocab_size=128),
    )
    return BertForMaskedLM(BertConfig(**dims, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0))


def t5(size: str) -> nn.Module:
    from transformers import T5Config, T5ForConditionalGeneration

    # board: T5 v1.1 base (gated GELU, untied head; ~220 M parameters), 12 + 12 layers; the encoder reads
    # 4 x seq tokens
    dims = _pick(
        size,
        dict(d_model=768, d_ff=2048, num_layers=12, num_heads=12, vocab_size=32128),
        dict(d_model=32, d_ff=64, num_layers=2, num_heads=4, vocab_size=128),
    )
    # Eager attention: T5's relative-position bias enters SDPA as a trainable mask, and PyTorch's CPU
    # SDPA cannot differentiate a mask (the host sizes would not train).
    config = T5Config(
        **dims,
        d_kv=64 if size == "board" else 8,
        feed_forward_proj="gated-gelu",
        dropout_rate=0.0,
        tie_word_embeddings=False,
        decoder_start_token_id=0,
        attn_implementation="eager",
    )
    return T5ForConditionalGeneration(config)


def vit(size: str) -> nn.Module:
    from transformers import ViTConfig, ViTForImageClassification

    # board: ViT-B/16 at 224 pixels (86 M parameters, 197 tokens per image)
    dims = _pick(
        size,
        dict(
            hidden_size=768,
            num_hidden_layers=12,
            num_attention_heads=12,
            intermediate_size=3072,
            image_size=224,
            patch_size=16,
            num_labels=1000,
        ),
        dict(
            hidden_size=32,
            num_hidden_layers=2,
            num_attention_heads=4,
            intermediate_size=64,
            image_size=16,
            patch_size=4,
            num_labels=10,
        ),
    )
    return ViTForImageClassification(ViTConfig(**dims, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0))


def torchvision_resnet50() -> nn.Module | None:
    """torchvision's ResNet-50, or None where torchvision does not load (a build for another torch)."""
    try:
        from torchvision.models import resnet50
    except Exception:  # noqa: BLE001 - an incompatible build fails in many ways (missing operators, ABI)
        return None
    return resnet50()


def resnet(size: str) -> nn.Module:
    from transformers import ResNetConfig, ResNetForImageClassification

    if size == "board":
        model = torchvision_resnet50()
        if model is not None:
            return model
    # transformers' ResNet: its default config is ResNet-50 (bottleneck blocks, BatchNorm)
    dims = _pick(
        size, dict(num_labels=1000), dict(embedding_size=8, hidden_sizes=[8, 16], depths=[1, 1], num_labels=10)
    )
    return ResNetForImageClassification(ResNetConfig(**dims))


def _resnet_loss(model: nn.Module, inputs: Inputs) -> torch.Tensor:
    if hasattr(model, "config"):
        return _hf_loss(model, inputs)
    return F.cross_entropy(model(inputs["pixel_values"]), inputs["labels"])


class DiTBlock(nn.Module):
    """A DiT block (Peebles & Xie, 2023): attention and MLP, each modulated by the conditioning
    (adaptive LayerNorm shift, scale and a gate)."""

    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.norm1 = nn.LayerNorm(dim, elementwise_affine=False, eps=1e-6)
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)
        self.norm2 = nn.LayerNorm(dim, elementwise_affine=False, eps=1e-6)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(approximate="tanh"), nn.Linear(4 * dim, dim))
        self.modulation = nn.Sequential(nn.SiLU(), nn.Linear(dim, 6 * dim))

    def forward(self, x: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
        shift1, scale1, gate1, shift2, scale2, gate2 = self.modulation(c).unsqueeze(1).chunk(6, dim=-1)
        b, t, d = x.shape
        h = self.norm1(x) * (1 + scale1) + shift1
        q, k, v = self.qkv(h).view(b, t, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        x = x + gate1 * self.proj(F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(b, t, d))
        return x + gate2 * self.mlp(self.norm2(x) * (1 + scale2) + shift2)


class DiT(nn.Module):
    """A class-conditional diffusion transformer over latents (DiT-B/2 at board size). PyTorch's
    default initialisation everywhere (DiT zero-initialises its gates, which would leave the blocks
    idle on the first steps the benchmark measures)."""

    def __init__(
        self, dim: int, depth: int, heads: int, latent: int, channels: int = 4, patch: int = 2, classes: int = 1000
    ) -> None:
        super().__init__()
        self.patch, self.channels, self.freqs = patch, channels, 256
        self.embed = nn.Conv2d(channels, dim, patch, stride=patch)
        self.pos = nn.Parameter(torch.randn(1, (latent // patch) ** 2, dim) * 0.02)
        self.time = nn.Sequential(nn.Linear(self.freqs, dim), nn.SiLU(), nn.Linear(dim, dim))
        self.label = nn.Embedding(classes, dim)
        self.blocks = nn.ModuleList(DiTBlock(dim, heads) for _ in range(depth))
        self.norm = nn.LayerNorm(dim, elementwise_affine=False, eps=1e-6)
        self.final_modulation = nn.Sequential(nn.SiLU(), nn.Linear(dim, 2 * dim))
        self.out = nn.Linear(dim, patch * patch * channels)

    def forward(self, latents: torch.Tensor, timesteps: torch.Tensor, class_labels: torch.Tensor) -> torch.Tensor:
        """The predicted noise, shaped as `latents`."""
        b, _, height, width = latents.shape
        x = self.embed(latents).flatten(2).transpose(1, 2) + self.pos
        half = self.freqs // 2
        freqs = torch.exp(-math.log(10000.0) * torch.arange(half, device=latents.device) / half)
        angles = timesteps.float()[:, None] * freqs[None]
        c = self.time(torch.cat([angles.cos(), angles.sin()], dim=-1).to(latents.dtype)) + self.label(class_labels)
        for block in self.blocks:
            x = block(x, c)
        shift, scale = self.final_modulation(c).unsqueeze(1).chunk(2, dim=-1)
        x = self.out(self.norm(x) * (1 + scale) + shift)
        p, h, w = self.patch, height // self.patch, width // self.patch
        return x.view(b, h, w, p, p, self.channels).permute(0, 5, 1, 3, 2, 4).reshape(b, self.channels, height, width)


def dit(size: str) -> nn.Module:
    # board: DiT-B/2 on 32 x 32 x 4 latents (a 256-pixel image; 256 tokens, ~130 M parameters)
    return DiT(
        **_pick(
            size, dict(dim=768, depth=12, heads=12, latent=32), dict(dim=32, depth=2, heads=4, latent=8, classes=10)
        )
    )


def _dit_inputs(model: nn.Module, shape: Shape, g: torch.Generator) -> Inputs:
    latents = torch.randn(shape.batch, model.channels, shape.seq, shape.seq, generator=g)
    return {
        "latents": latents,
        "timesteps": torch.randint(0, 1000, (shape.batch,), generator=g),
        "class_labels": torch.randint(0, model.label.num_embeddings, (shape.batch,), generator=g),
        "noise": torch.randn(latents.shape, generator=g),
    }


def _dit_loss(model: nn.Module, inputs: Inputs) -> torch.Tensor:
    return F.mse_loss(model(inputs["latents"], inputs["timesteps"], inputs["class_labels"]), inputs["noise"])


ARCHS = {
    a.name: a
    for a in [
        Arch(
            "llama",
            "decoder LM, grouped-query attention, RoPE (transformers Llama)",
            llama,
            _causal_inputs,
            _hf_loss,
            {"board": Shape(4, 1024, prompt=128), "host": Shape(2, 16, prompt=8)},
        ),
        Arch(
            "qwen2",
            "decoder LM, GQA, RoPE, qkv bias, tied embeddings (transformers Qwen2, 0.5B shape)",
            qwen2,
            _causal_inputs,
            _hf_loss,
            {"board": Shape(4, 512, prompt=128), "host": Shape(2, 16, prompt=8)},
        ),
        Arch(
            "gpt2",
            "GPT-2 small, learned positions, tied embeddings (transformers GPT-2)",
            gpt2,
            _causal_inputs,
            _hf_loss,
            {"board": Shape(8, 1024, prompt=128), "host": Shape(2, 16, prompt=8)},
        ),
        Arch(
            "mixtral",
            "mixture-of-experts decoder LM, 8 experts top-2 (transformers Mixtral)",
            mixtral,
            _causal_inputs,
            _hf_loss,
            {"board": Shape(4, 1024, prompt=128), "host": Shape(2, 16, prompt=8)},
        ),
        Arch(
            "bert",
            "BERT-base encoder, masked-LM head (transformers BERT)",
            bert,
            _masked_inputs,
            _hf_loss,
            {"board": Shape(16, 512), "host": Shape(2, 16)},
        ),
        Arch(
            "t5",
            "T5 v1.1 base encoder-decoder, relative position bias, eager attention (transformers T5)",
            t5,
            _seq2seq_inputs,
            _hf_loss,
            {"board": Shape(8, 128, prompt=128), "host": Shape(2, 8, prompt=8)},
        ),
        Arch(
            "vit",
            "ViT-B/16 image classifier (transformers ViT)",
            vit,
            _image_inputs,
            _hf_loss,
            {"board": Shape(64, 224), "host": Shape(2, 16)},
        ),
        Arch(
            "resnet50",
            "ResNet-50, BatchNorm (torchvision; transformers' ResNet where torchvision does not load)",
            resnet,
            _image_inputs,
            _resnet_loss,
            {"board": Shape(128, 224), "host": Shape(2, 16)},
        ),
        Arch(
            "dit",
            "DiT-B/2 diffusion transformer, adaptive LayerNorm conditioning (defined here)",
            dit,
            _dit_inputs,
            _dit_loss,
            {"board": Shape(32, 32), "host": Shape(2, 8)},
        ),
    ]
}


def build(name: str, size: str, seed: int = 0) -> nn.Module:
    """Architecture `name` at `size` with random weights drawn on the CPU from `seed`."""
    torch.manual_seed(seed)
    return ARCHS[name].make(size)


def batch(name: str, model: nn.Module, shape: Shape, seed: int = 0) -> Inputs:
    """A deterministic training batch for `model` (of architecture `name`), made on the CPU."""
    return ARCHS[name].inputs(model, shape, torch.Generator().manual_seed(seed))


def train_step(
    name: str, model: nn.Module, inputs: Inputs, device: str, bf16: bool, lr: float = 3e-4
) -> Callable[[], torch.Tensor]:
    """One AdamW training step of `model` (architecture `name`, on `device` with its `inputs`),
    under bf16 autocast when `bf16`; each call returns the step's loss as a float32 scalar."""
    loss_of = ARCHS[name].loss
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, foreach=True)
    autocast = torch.autocast(device, dtype=torch.bfloat16, enabled=bf16)

    def run() -> torch.Tensor:
        optimizer.zero_grad(set_to_none=True)
        with autocast:
            loss = loss_of(model, inputs)
        loss.backward()
        optimizer.step()
        return loss.detach().float()

    return run


def prompt(model: nn.Module, batch_size: int, length: int, seed: int = 0) -> torch.Tensor:
    """Prompt token ids for `generate` (the encoder's input of an encoder-decoder), made on the CPU."""
    return torch.randint(0, _vocab(model), (batch_size, length), generator=torch.Generator().manual_seed(seed + 1))


def generate(model: nn.Module, prompt_ids: torch.Tensor, new_tokens: int, **options: Any) -> torch.Tensor:
    """Greedy decoding with the KV cache: exactly `new_tokens` tokens per row (the end-of-sequence
    token is held back until then), returned as (batch, new_tokens). `options` go to
    `model.generate` (a static cache, say)."""
    out = model.generate(
        input_ids=prompt_ids,
        attention_mask=torch.ones_like(prompt_ids),
        max_new_tokens=new_tokens,
        min_new_tokens=new_tokens,
        do_sample=False,
        use_cache=True,
        pad_token_id=0,
        **options,
    )
    return out[:, -new_tokens:]
