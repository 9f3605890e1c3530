"""torch.nn on flagos: forward outputs, input gradients and parameter gradients equal the CPU's."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F


def compare_module(module: nn.Module, *inputs: torch.Tensor, same, **tol: float) -> None:
    """Runs `module` on the CPU and a copy of it on flagos; forward and backward must agree."""
    on_flagos = copy.deepcopy(module).to("flagos")
    cpu_in = [t.clone().requires_grad_(t.is_floating_point()) for t in inputs]
    fl_in = [t.detach().to("flagos").requires_grad_(t.is_floating_point()) for t in inputs]
    out_cpu, out_fl = module(*cpu_in), on_flagos(*fl_in)
    if isinstance(out_cpu, tuple):
        out_cpu, out_fl = out_cpu[0], out_fl[0]
    same(out_fl, out_cpu.detach(), **tol)
    grad = torch.randn_like(out_cpu)
    out_cpu.backward(grad)
    out_fl.backward(grad.to("flagos"))
    for a, b in zip(fl_in, cpu_in):
        if b.grad is not None:
            same(a.grad, b.grad, **tol)
    for (name, p_fl), p_cpu in zip(on_flagos.named_parameters(), module.parameters()):
        assert p_fl.grad is not None, name
        assert p_fl.grad.device.type == "flagos", name
        same(p_fl.grad, p_cpu.grad, **tol)


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


def test_linear(same):
    compare_module(nn.Linear(16, 8), torch.randn(4, 16), same=same)


def test_linear_without_bias_3d(same):
    compare_module(nn.Linear(6, 5, bias=False), torch.randn(2, 3, 6), same=same)


def test_conv2d(same):
    compare_module(nn.Conv2d(3, 4, 3, padding=1), torch.randn(2, 3, 8, 8), same=same)


def test_conv2d_strided_grouped(same):
    compare_module(nn.Conv2d(4, 4, 3, stride=2, groups=2), torch.randn(1, 4, 9, 9), same=same)


def test_layer_norm(same):
    compare_module(nn.LayerNorm(10), torch.randn(3, 5, 10), same=same)


def test_embedding(same):
    compare_module(nn.Embedding(20, 6, padding_idx=0), torch.tensor([[1, 0, 19], [4, 4, 7]]), same=same)


def test_embedding_bag_and_index_ops(same):
    weight = torch.randn(10, 3)
    idx = torch.tensor([1, 2, 4, 5, 4, 3, 2, 9])
    offsets = torch.tensor([0, 4])
    ref = F.embedding_bag(idx, weight, offsets, mode="mean")
    same(F.embedding_bag(idx.to("flagos"), weight.to("flagos"), offsets.to("flagos"), mode="mean"), ref)


class Attention(nn.Module):
    def __init__(self, causal: bool) -> None:
        super().__init__()
        self.causal = causal

    def forward(self, q, k, v):
        return F.scaled_dot_product_attention(q, k, v, is_causal=self.causal)


@pytest.mark.parametrize("causal", [False, True])
def test_scaled_dot_product_attention(causal, same):
    q, k, v = (torch.randn(2, 3, 7, 8) for _ in range(3))
    compare_module(Attention(causal), q, k, v, same=same)


def test_scaled_dot_product_attention_with_mask(same):
    q, k, v = (torch.randn(1, 2, 5, 4) for _ in range(3))
    mask = torch.rand(5, 5) > 0.3
    mask.fill_diagonal_(True)
    ref = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    out = F.scaled_dot_product_attention(*(t.to("flagos") for t in (q, k, v)), attn_mask=mask.to("flagos"))
    same(out, ref)


class Loss(nn.Module):
    def __init__(self, loss: nn.Module, target: torch.Tensor) -> None:
        super().__init__()
        self.loss, self.target = loss, target

    def forward(self, x):
        return self.loss(x, self.target.to(x.device))


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_cross_entropy_loss(reduction, same):
    target = torch.tensor([0, 3, 2, 1, 4, 3])
    loss = nn.CrossEntropyLoss(reduction=reduction, label_smoothing=0.1)
    compare_module(Loss(loss, target), torch.randn(6, 5), same=same)


def test_cross_entropy_ignore_index_and_probabilities(same):
    target = torch.tensor([0, -100, 2])
    compare_module(Loss(nn.CrossEntropyLoss(), target), torch.randn(3, 4), same=same)
    probs = torch.softmax(torch.randn(3, 4), 1)
    compare_module(Loss(nn.CrossEntropyLoss(), probs), torch.randn(3, 4), same=same)


def test_mse_and_nll(same):
    compare_module(Loss(nn.MSELoss(), torch.randn(4, 3)), torch.randn(4, 3), same=same)
    compare_module(Loss(nn.NLLLoss(), torch.tensor([1, 0, 2, 2])), torch.randn(4, 3).log_softmax(1), same=same)


def test_activations_and_norms(same):
    for module in (nn.GELU(), nn.SiLU(), nn.ReLU(), nn.Softmax(dim=-1), nn.GroupNorm(2, 4), nn.BatchNorm1d(4)):
        compare_module(module, torch.randn(6, 4), same=same)


def test_pooling_and_batch_norm_2d(same):
    model = nn.Sequential(nn.BatchNorm2d(3), nn.MaxPool2d(2), nn.AvgPool2d(2))
    compare_module(model, torch.randn(2, 3, 8, 8), same=same)


def test_transformer_block(same):
    layer = nn.TransformerEncoderLayer(d_model=16, nhead=2, dim_feedforward=32, dropout=0.0, batch_first=True)
    compare_module(layer, torch.randn(2, 5, 16), same=same, rtol=1e-4, atol=1e-5)


def test_lstm(same):
    compare_module(nn.LSTM(4, 6, batch_first=True), torch.randn(2, 5, 4), same=same, rtol=1e-4, atol=1e-5)


def test_module_device_moves():
    model = nn.Sequential(nn.Linear(2, 3), nn.BatchNorm1d(3))
    model.flagos()
    assert all(p.device.type == "flagos" for p in model.parameters())
    assert all(b.device.type == "flagos" for b in model.buffers())
    model.cpu()
    assert all(p.device.type == "cpu" for p in model.parameters())
    model.to("flagos", dtype=torch.float64)
    assert all(p.dtype == torch.float64 and p.is_flagos for p in model.parameters())


def test_dropout_in_eval_is_identity(same):
    x = torch.randn(5, 5)
    model = nn.Dropout(0.5).eval()
    same(model(x.to("flagos")), x)
