"""compile: torch.compile with inductor on flagos tensors gives eager's results, forward and backward.

Inductor generates code for the backing (C++ on a host backing, Triton on CUDA) while ops it does
not generate stay calls on flagos tensors; either way results must equal eager flagos ones.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torch.nn.functional as F

SUITE = "compile"
TIMEOUT_S = 900  # the first compilation of a process builds C++/Triton code


def _fn(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    z = torch.sin(x) * y + torch.exp(-x.abs())
    return F.gelu(z @ y.t()).sum(dim=-1) + z.mean()


class _Block(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = torch.nn.Linear(16, 32)
        self.norm = torch.nn.LayerNorm(32)
        self.b = torch.nn.Linear(32, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(F.silu(self.norm(self.a(x))))


def _tol(fl: Any) -> dict[str, float]:
    return {"rtol": 1e-5, "atol": 1e-5} if fl.backing == "cpu" else {"rtol": 1e-3, "atol": 1e-3}


@pytest.fixture(autouse=True)
def _fresh_dynamo(fl: Any):
    if fl.descriptor.capabilities.compile.path == "none":
        pytest.skip("the platform does not claim a compile path")
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


@pytest.mark.fl_timeout(TIMEOUT_S)
def test_forward_equals_eager(fl: Any) -> None:
    g = torch.Generator().manual_seed(0)
    x, y = (torch.randn(8, 16, generator=g).to("flagos") for _ in range(2))
    compiled = torch.compile(_fn, backend="inductor", fullgraph=True)
    got, expected = compiled(x, y), _fn(x, y)
    assert got.device.type == "flagos", f"compiled result is on {got.device}"
    torch.testing.assert_close(got.cpu(), expected.cpu(), **_tol(fl))


@pytest.mark.fl_timeout(TIMEOUT_S)
def test_backward_equals_eager(fl: Any) -> None:
    torch.manual_seed(0)
    eager = _Block().to("flagos")
    compiled_model = _Block().to("flagos")
    compiled_model.load_state_dict(eager.state_dict())
    compiled = torch.compile(compiled_model, backend="inductor")
    x = torch.randn(6, 16, generator=torch.Generator().manual_seed(1)).to("flagos")
    for model in (eager, compiled):
        F.mse_loss(model(x), torch.zeros(6, 4, device="flagos")).backward()
    for (name, p), q in zip(eager.named_parameters(), compiled_model.parameters()):
        assert q.grad is not None and q.grad.device.type == "flagos", (
            f"{name}: no flagos gradient from the compiled model"
        )
        torch.testing.assert_close(q.grad.cpu(), p.grad.cpu(), **_tol(fl), msg=f"gradient of {name}")


@pytest.mark.fl_timeout(TIMEOUT_S)
def test_dynamic_shapes_recompile_correctly(fl: Any) -> None:
    compiled = torch.compile(lambda t: (t * 2 + 1).cumsum(0), backend="inductor", dynamic=True)
    for n in (5, 9, 17):
        t = torch.arange(n, dtype=torch.float32).to("flagos")
        torch.testing.assert_close(compiled(t).cpu(), (t.cpu() * 2 + 1).cumsum(0), **_tol(fl))
