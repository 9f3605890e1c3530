"""Tied and shared parameters survive every move to flagos, as they survive a move to CUDA.

`Module._apply` moves a Parameter in place (`param.data = moved`) only where PyTorch calls the two
tensors shallow-copy compatible; otherwise each module gets a new Parameter, and a weight shared by
two modules becomes two. flagos answers that question for its dense tensors as PyTorch does for
CPU and CUDA ones, so the Parameter objects, the optimizer's view of them and the state_dict's
storage sharing are what they are on the CPU.
"""

from __future__ import annotations

import io
from collections.abc import Callable

import pytest
import torch
import torch.nn as nn

from torch_fl.runtime import cuda_alias


class TiedLM(nn.Module):
    """A language model whose output head is its embedding (tie_word_embeddings)."""

    def __init__(self, vocab: int = 32, dim: int = 16) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.block = nn.Sequential(nn.LayerNorm(dim), nn.Linear(dim, dim), nn.GELU())
        self.head = nn.Linear(dim, vocab, bias=False)
        self.head.weight = self.embed.weight

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        logits = self.head(self.block(self.embed(tokens)))
        return nn.functional.cross_entropy(logits.flatten(0, 1), tokens.roll(-1, 1).flatten())


class SharedByThree(nn.Module):
    """One weight used by three layers."""

    def __init__(self, dim: int = 8) -> None:
        super().__init__()
        self.a, self.b, self.c = nn.Linear(dim, dim), nn.Linear(dim, dim), nn.Linear(dim, dim)
        shared = nn.Parameter(torch.randn(dim, dim) / dim**0.5)
        for layer in (self.a, self.b, self.c):
            layer.weight = shared

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.c(torch.tanh(self.b(torch.tanh(self.a(x))))).square().mean()


def _tokens(device: str) -> torch.Tensor:
    return torch.randint(0, 32, (4, 6), generator=torch.Generator().manual_seed(1)).to(device)


def _features(device: str) -> torch.Tensor:
    return torch.randn(5, 8, generator=torch.Generator().manual_seed(1)).to(device)


MODELS: dict[str, tuple[Callable[[], nn.Module], Callable[[str], torch.Tensor]]] = {
    "tied_lm": (TiedLM, _tokens),
    "shared_by_three": (SharedByThree, _features),
}


def _made(name: str) -> nn.Module:
    torch.manual_seed(0)
    return MODELS[name][0]()


def _shared_names(model: nn.Module) -> set[frozenset[str]]:
    """Groups of parameter names bound to one Parameter object (singletons left out)."""
    groups: dict[int, set[str]] = {}
    for name, p in model.named_parameters(remove_duplicate=False):
        groups.setdefault(id(p), set()).add(name)
    return {frozenset(g) for g in groups.values() if len(g) > 1}


def _shared_storage(state: dict[str, torch.Tensor]) -> set[frozenset[str]]:
    """Groups of state_dict keys whose tensors share one storage (singletons left out)."""
    groups: dict[int, set[str]] = {}
    for key, t in state.items():
        groups.setdefault(t.untyped_storage().data_ptr(), set()).add(key)
    return {frozenset(g) for g in groups.values() if len(g) > 1}


def _round_trip(obj: object, **load: object) -> object:
    buffer = io.BytesIO()
    torch.save(obj, buffer)
    buffer.seek(0)
    return torch.load(buffer, **load)


def _loaded_into(device: str) -> Callable[[nn.Module], nn.Module]:
    """A model built on `device` that loads the given model's state_dict (saved and mapped there)."""

    def move(model: nn.Module) -> nn.Module:
        with torch.device(device):
            target = type(model)()
        state = _round_trip(model.state_dict(), map_location=device, weights_only=True)
        target.load_state_dict(state)
        return target

    return move


# Each move, and the same move onto the CPU, which keeps what PyTorch keeps.
MOVES: dict[str, tuple[Callable[[nn.Module], nn.Module], Callable[[nn.Module], nn.Module]]] = {
    "to_string": (lambda m: m.to("flagos"), lambda m: m.to("cpu")),
    "to_device_object": (lambda m: m.to(torch.device("flagos", 0)), lambda m: m.to(torch.device("cpu"))),
    "to_device_and_dtype": (lambda m: m.to(device="flagos", dtype=torch.float32), lambda m: m.to("cpu", torch.float32)),
    "flagos_method": (lambda m: m.flagos(), lambda m: m.cpu()),
    "load_state_dict": (_loaded_into("flagos"), _loaded_into("cpu")),
    "torch_load_module": (
        lambda m: _round_trip(m, map_location="flagos", weights_only=False),
        lambda m: _round_trip(m, map_location="cpu", weights_only=False),
    ),
}


@pytest.mark.parametrize("model_name", sorted(MODELS))
@pytest.mark.parametrize("move", sorted(MOVES))
def test_sharing_survives_the_move(model_name: str, move: str) -> None:
    to_flagos, to_cpu = MOVES[move]
    expected = to_cpu(_made(model_name))
    moved = to_flagos(_made(model_name))
    assert {p.device.type for p in moved.parameters()} == {"flagos"}
    assert _shared_names(moved) == _shared_names(expected) != set()
    assert len(list(moved.parameters())) == len(list(expected.parameters()))
    assert _shared_storage(moved.state_dict()) == _shared_storage(expected.state_dict()) != set()


def test_the_moved_parameter_is_the_same_object() -> None:
    model = _made("tied_lm")
    weight = model.embed.weight
    model.to("flagos")
    assert model.embed.weight is weight and model.head.weight is weight
    assert weight.device.type == "flagos"


def test_gradients_move_with_their_parameter() -> None:
    model = _made("shared_by_three")
    model(_features("cpu")).backward()
    grad = model.a.weight.grad.clone()
    model.to("flagos")
    assert model.b.weight.grad is model.a.weight.grad
    assert model.a.weight.grad.device.type == "flagos"
    assert torch.equal(model.a.weight.grad.cpu(), grad)


def test_shallow_copy_compatibility_as_for_cuda() -> None:
    # Dense tensors of flagos and of the CPU are compatible both ways, as CPU and CUDA ones are;
    # what PyTorch refuses (meta, sparse) stays refused.
    flagos, cpu = torch.ones(2, device="flagos"), torch.ones(2)
    compatible = torch._has_compatible_shallow_copy_type
    assert compatible(cpu, flagos) and compatible(flagos, cpu) and compatible(flagos, flagos.double())
    meta, sparse = torch.ones(2, device="meta"), torch.ones(2).to_sparse()
    assert not compatible(meta, cpu) and not compatible(meta, flagos) and not compatible(flagos, meta)
    assert not compatible(sparse, cpu) and not compatible(sparse, flagos)


def _losses(model: nn.Module, data: torch.Tensor, steps: int = 4) -> torch.Tensor:
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1)
    losses = []
    for _ in range(steps):
        optimizer.zero_grad()
        loss = model(data)
        loss.backward()
        optimizer.step()
        losses.append(loss.detach())
    return torch.stack(losses)


@pytest.mark.parametrize("model_name", sorted(MODELS))
def test_adamw_training_matches_the_cpu(model_name: str, backing: str, same: Callable[..., None]) -> None:
    # An untied copy trains a second head: the losses part from the CPU's at step 2.
    data = MODELS[model_name][1]
    expected = _losses(_made(model_name), data("cpu"))
    model = _made(model_name).to("flagos")
    got = _losses(model, data("flagos"))
    if backing == "cpu":
        assert torch.equal(got.cpu(), expected)  # the CPU's own kernels: bitwise
    else:
        same(got, expected)
    assert _shared_names(model) == _shared_names(_made(model_name))


@pytest.mark.backing_cuda
def test_a_cuda_model_moved_to_flagos_keeps_its_sharing() -> None:
    model = _made("tied_lm").to("cuda")
    weight = model.embed.weight
    model.to("flagos")
    assert model.head.weight is weight and weight.device.type == "flagos"


@pytest.mark.skipif(cuda_alias.real_cuda_present(), reason="the CUDA alias exists only where there is no CUDA device")
def test_the_cuda_alias_keeps_sharing(run_python: Callable[..., object]) -> None:
    # The alias changes process-wide state: a fresh interpreter.
    run_python(
        """
        import torch, torch_fl
        from torch_fl.runtime import cuda_alias
        from tests.runtime.test_tied_parameters import _made, _shared_names
        cuda_alias.enable_from_env()
        for name in ("tied_lm", "shared_by_three"):
            model = _made(name)
            before = _shared_names(model)
            for move in (lambda m: m.cuda(), lambda m: m.to("cuda")):
                model = move(_made(name))
                assert {p.device.type for p in model.parameters()} == {"flagos"}
                assert _shared_names(model) == before != set(), name
        """,
        env={"FLAGOS_ALIAS_CUDA": "1"},
    )
