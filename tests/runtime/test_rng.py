"""Random numbers on flagos: torch.Generator(device="flagos"), seeding, state round trips, dropout.

On the host backing each flagos device owns a CPU Mersenne-Twister of its own (so flagos draws leave
the global CPU generator alone); on CUDA the flagos default generator is CUDA's (so flagos numbers
equal CUDA's under one seed)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

DRAWS = {
    "rand": lambda g: torch.rand(16, device="flagos", generator=g),
    "randn": lambda g: torch.randn(4, 4, device="flagos", generator=g),
    "randint": lambda g: torch.randint(0, 100, (16,), device="flagos", generator=g),
    "randperm": lambda g: torch.randperm(20, device="flagos", generator=g),
    "normal_": lambda g: torch.empty(16, device="flagos").normal_(2.0, 3.0, generator=g),
    "uniform_": lambda g: torch.empty(16, device="flagos").uniform_(-1, 1, generator=g),
    "bernoulli": lambda g: torch.bernoulli(torch.full((16,), 0.3, device="flagos"), generator=g),
    "multinomial": lambda g: torch.multinomial(torch.ones(10, device="flagos"), 5, generator=g),
    "exponential_": lambda g: torch.empty(8, device="flagos").exponential_(generator=g),
}


@pytest.mark.parametrize("draw", DRAWS.values(), ids=DRAWS.keys())
def test_generator_reproducible(draw):
    g = torch.Generator(device="flagos")
    assert g.device == torch.device("flagos", 0)
    g.manual_seed(1234)
    first = draw(g)
    assert first.device.type == "flagos"
    g.manual_seed(1234)
    assert torch.equal(draw(g).cpu(), first.cpu())
    assert not torch.equal(draw(g).cpu(), first.cpu()) or first.numel() == 0  # the stream advanced


@pytest.mark.parametrize("draw", DRAWS.values(), ids=DRAWS.keys())
def test_default_generator_reproducible_under_manual_seed(draw):
    torch.flagos.manual_seed(7)
    first = draw(None)
    torch.flagos.manual_seed(7)
    assert torch.equal(draw(None).cpu(), first.cpu())


def test_torch_manual_seed_seeds_flagos():
    torch.manual_seed(99)
    a = torch.randn(8, device="flagos")
    torch.manual_seed(99)
    b = torch.randn(8, device="flagos")
    torch.manual_seed(100)
    c = torch.randn(8, device="flagos")
    assert torch.equal(a.cpu(), b.cpu()) and not torch.equal(a.cpu(), c.cpu())
    assert torch.flagos.initial_seed() == 100


def test_generator_state_round_trip():
    g = torch.Generator(device="flagos").manual_seed(5)
    torch.rand(3, device="flagos", generator=g)
    state = g.get_state()
    assert state.dtype == torch.uint8 and state.device.type == "cpu"
    a = torch.randn(10, device="flagos", generator=g)
    g.set_state(state)
    assert torch.equal(torch.randn(10, device="flagos", generator=g).cpu(), a.cpu())
    clone = torch.Generator(device="flagos")
    clone.set_state(state)
    assert torch.equal(torch.randn(10, device="flagos", generator=clone).cpu(), a.cpu())


def test_get_set_rng_state_round_trip():
    torch.flagos.manual_seed(11)
    torch.rand(5, device="flagos")
    state = torch.flagos.get_rng_state()
    a = torch.rand(20, device="flagos")
    b = F.dropout(torch.ones(20, device="flagos"), 0.5)
    torch.flagos.set_rng_state(state)
    assert torch.equal(torch.rand(20, device="flagos").cpu(), a.cpu())
    assert torch.equal(F.dropout(torch.ones(20, device="flagos"), 0.5).cpu(), b.cpu())
    states = torch.flagos.get_rng_state_all()
    assert len(states) == torch.flagos.device_count()
    c = torch.rand(4, device="flagos")
    torch.flagos.set_rng_state_all(states)
    assert torch.equal(torch.rand(4, device="flagos").cpu(), c.cpu())


def test_fork_rng_restores_flagos_state():
    torch.flagos.manual_seed(3)
    expected = torch.rand(4, device="flagos")
    torch.flagos.manual_seed(3)
    with torch.random.fork_rng(device_type="flagos"):
        torch.rand(100, device="flagos")
    assert torch.equal(torch.rand(4, device="flagos").cpu(), expected.cpu())


def test_dropout_reproducible_under_a_seed():
    x = torch.ones(64, 64, device="flagos")
    torch.manual_seed(21)
    a = F.dropout(x, p=0.3)
    torch.manual_seed(21)
    b = F.dropout(x, p=0.3)
    assert torch.equal(a.cpu(), b.cpu())
    kept = (a != 0).float().mean().item()
    assert 0.6 < kept < 0.8
    assert torch.allclose(a[a != 0].cpu(), torch.tensor(1 / 0.7))
    torch.manual_seed(22)
    assert not torch.equal(F.dropout(x, p=0.3).cpu(), a.cpu())


def test_dropout_backward_uses_the_same_mask():
    x = torch.ones(32, device="flagos", requires_grad=True)
    torch.manual_seed(0)
    y = F.dropout(x, p=0.5)
    y.sum().backward()
    assert torch.equal(x.grad.cpu(), y.detach().cpu())


@pytest.mark.backing_cpu
def test_flagos_draws_leave_the_cpu_generator_alone():
    torch.manual_seed(0)
    state = torch.get_rng_state()
    torch.randn(100, device="flagos")
    F.dropout(torch.ones(100, device="flagos"), 0.5)
    torch.randperm(50, device="flagos")
    torch.empty(10, device="flagos").uniform_()
    assert torch.equal(torch.get_rng_state(), state), "a flagos draw consumed the CPU generator"
    # and the other way round: CPU draws leave flagos alone
    torch.flagos.manual_seed(4)
    expected = torch.rand(5, device="flagos")
    torch.flagos.manual_seed(4)
    torch.rand(1000)
    assert torch.equal(torch.rand(5, device="flagos").cpu(), expected.cpu())


@pytest.mark.backing_cpu
def test_host_numbers_equal_cpu_numbers_under_one_seed():
    """On the host backing a flagos generator is a CPU generator of its own: same seed, same numbers."""
    g = torch.Generator(device="flagos").manual_seed(42)
    cpu = torch.Generator().manual_seed(42)
    assert torch.equal(torch.randn(32, device="flagos", generator=g).cpu(), torch.randn(32, generator=cpu))


@pytest.mark.backing_cuda
def test_cuda_numbers_and_dropout_masks_equal_cuda():
    x = torch.ones(128, 128)
    torch.manual_seed(3)
    a, mask = torch.rand(100, device="flagos"), F.dropout(x.to("flagos"), 0.4)
    torch.manual_seed(3)
    b, mask_cuda = torch.rand(100, device="cuda"), F.dropout(x.to("cuda"), 0.4)
    assert torch.equal(a.cpu(), b.cpu())
    assert torch.equal(mask.cpu(), mask_cuda.cpu())
    g, gc = torch.Generator(device="flagos").manual_seed(8), torch.Generator(device="cuda").manual_seed(8)
    on_flagos, on_cuda = torch.randn(64, device="flagos", generator=g), torch.randn(64, device="cuda", generator=gc)
    assert torch.equal(on_flagos.cpu(), on_cuda.cpu())


@pytest.mark.two_devices
def test_devices_have_their_own_generators():
    torch.flagos.manual_seed_all(1)
    a0 = torch.rand(8, device="flagos:0")
    a1 = torch.rand(8, device="flagos:1")
    assert torch.equal(a0.cpu(), a1.cpu()), "seeded alike, each device starts the same stream"
    torch.flagos.manual_seed_all(1)
    torch.rand(100, device="flagos:1")  # advancing device 1 leaves device 0 where it was
    assert torch.equal(torch.rand(8, device="flagos:0").cpu(), a0.cpu())
    g1 = torch.Generator(device="flagos:1")
    assert g1.device == torch.device("flagos", 1)
    assert torch.rand(2, device="flagos:1", generator=g1.manual_seed(0)).device.index == 1
    assert torch.flagos.default_generators[1].device == torch.device("flagos", 1)


def test_seed_and_initial_seed():
    torch.flagos.manual_seed(123)
    assert torch.flagos.initial_seed() == 123
    torch.flagos.seed()
    assert torch.flagos.initial_seed() != 123  # a fresh non-deterministic seed
    g = torch.Generator(device="flagos")
    s = g.seed()
    assert g.initial_seed() == s
