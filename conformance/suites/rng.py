"""rng: seeding, generators, RNG state, and the distributions random ops draw from.

Moments are checked against the distribution's own with bounds of 6 standard errors (n draws),
so a correct generator fails with probability below 1e-8 while a biased or degenerate one (all
zeros, a fixed value, the wrong scale) fails at once; the seeds are fixed, so runs are stable.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import pytest
import torch

SUITE = "rng"
N = 200_000
SIGMAS = 6.0


@pytest.mark.fl_case(op="aten::rand")
def test_manual_seed_reproduces_draws(fl: Any) -> None:
    torch.manual_seed(1234)
    a = torch.rand(1000, device="flagos")
    b = torch.randn(1000, device="flagos")
    torch.manual_seed(1234)
    assert torch.equal(a.cpu(), torch.rand(1000, device="flagos").cpu()), "rand differs under the same seed"
    assert torch.equal(b.cpu(), torch.randn(1000, device="flagos").cpu()), "randn differs under the same seed"
    torch.manual_seed(4321)
    assert not torch.equal(a.cpu(), torch.rand(1000, device="flagos").cpu()), "a different seed gave the same draws"


def test_manual_seed_seeds_every_flagos_device(fl: Any) -> None:
    count = torch.flagos.device_count()
    torch.manual_seed(7)
    first = [torch.rand(16, device=f"flagos:{i}").cpu() for i in range(count)]
    torch.manual_seed(7)
    again = [torch.rand(16, device=f"flagos:{i}").cpu() for i in range(count)]
    assert all(torch.equal(x, y) for x, y in zip(first, again)), "torch.manual_seed did not reseed every flagos device"
    fl.note(f"{count} device(s)")


def test_generator_object(fl: Any) -> None:
    g = torch.Generator(device="flagos")
    assert g.device.type == "flagos", f"torch.Generator(device='flagos') is on {g.device}"
    g.manual_seed(99)
    a = torch.randn(256, device="flagos", generator=g).cpu()
    g.manual_seed(99)
    b = torch.randn(256, device="flagos", generator=g).cpu()
    assert torch.equal(a, b), "a reseeded generator did not repeat its draws"
    torch.manual_seed(5)
    x = torch.rand(8, device="flagos").cpu()
    torch.manual_seed(5)
    torch.rand(64, device="flagos", generator=g)  # drawing from `g` must not advance the default generator
    assert torch.equal(x, torch.rand(8, device="flagos").cpu()), "an explicit generator advanced the default one"


def test_state_round_trip(fl: Any) -> None:
    torch.manual_seed(3)
    state = torch.flagos.get_rng_state()
    assert state.device.type == "cpu" and state.dtype == torch.uint8, f"state is {state.dtype} on {state.device}"
    a = torch.randn(100, device="flagos").cpu()
    torch.flagos.set_rng_state(state)
    assert torch.equal(a, torch.randn(100, device="flagos").cpu()), "set_rng_state did not restore the stream"
    g = torch.Generator(device="flagos").manual_seed(11)
    saved = g.get_state()
    b = torch.rand(50, device="flagos", generator=g).cpu()
    g.set_state(saved)
    assert torch.equal(b, torch.rand(50, device="flagos", generator=g).cpu()), "Generator.set_state did not restore it"
    with torch.random.fork_rng(device_type="flagos"):
        torch.rand(10, device="flagos")
    after_fork = torch.randn(10, device="flagos").cpu()
    torch.flagos.set_rng_state(state)
    torch.randn(100, device="flagos")
    assert torch.equal(after_fork, torch.randn(10, device="flagos").cpu()), (
        "fork_rng leaked draws into the outer stream"
    )


def _moments(x: torch.Tensor) -> tuple[float, float]:
    x = x.double().cpu()
    return x.mean().item(), x.var().item()


def _check_moments(name: str, x: torch.Tensor, mean: float, var: float, fourth: float | None = None) -> None:
    """Sample mean and variance within SIGMAS standard errors of the true ones."""
    m, v = _moments(x)
    se_mean = math.sqrt(var / x.numel())
    assert abs(m - mean) <= SIGMAS * se_mean + 1e-3 * abs(mean), (
        f"{name}: mean {m:.5f}, expected {mean:.5f} (+-{SIGMAS * se_mean:.5f})"
    )
    central4 = fourth if fourth is not None else 3 * var * var
    se_var = math.sqrt(max(central4 - var * var, 1e-12) / x.numel())
    assert abs(v - var) <= SIGMAS * se_var + 2e-3 * var, (
        f"{name}: variance {v:.5f}, expected {var:.5f} (+-{SIGMAS * se_var:.5f})"
    )


DISTRIBUTIONS: dict[str, tuple[str, Callable[[torch.dtype], torch.Tensor], float, float, float | None]] = {
    # name: (aten op, draw, mean, variance, fourth central moment)
    "rand": ("aten::rand", lambda d: torch.rand(N, device="flagos", dtype=d), 0.5, 1 / 12, 1 / 80),
    "randn": ("aten::randn", lambda d: torch.randn(N, device="flagos", dtype=d), 0.0, 1.0, 3.0),
    "normal": (
        "aten::normal.float_float",
        lambda d: torch.normal(2.0, 3.0, (N,), device="flagos", dtype=d),
        2.0,
        9.0,
        243.0,
    ),
    "bernoulli": (
        "aten::bernoulli.p",
        lambda d: torch.bernoulli(torch.full((N,), 0.3, device="flagos", dtype=d)),
        0.3,
        0.21,
        0.3 * 0.7 * (1 - 3 * 0.21),
    ),
    "uniform_": (
        "aten::uniform_",
        lambda d: torch.empty(N, device="flagos", dtype=d).uniform_(-2.0, 4.0),
        1.0,
        3.0,
        6**4 / 80,
    ),
}


@pytest.mark.parametrize("dtype", ["float32", "float64", "bfloat16", "float16"])
@pytest.mark.parametrize("name", list(DISTRIBUTIONS))
def test_distribution(name: str, dtype: str, fl: Any) -> None:
    if dtype not in fl.descriptor.capabilities.dtypes:
        pytest.skip(f"{dtype} is not among the platform's dtypes")
    op, draw, mean, var, fourth = DISTRIBUTIONS[name]
    fl.meta(op=op, dtype=dtype)
    torch.manual_seed(2024)
    x = draw(getattr(torch, dtype))
    assert x.device.type == "flagos" and x.dtype == getattr(torch, dtype), f"drew {x.dtype} on {x.device}"
    # Low-precision dtypes round each draw: allow for the rounding's own variance.
    rounding = {"bfloat16": 2**-8, "float16": 2**-11}.get(dtype, 0.0)
    _check_moments(name, x, mean, var + (rounding * max(1.0, abs(mean) + 3 * math.sqrt(var))) ** 2, fourth)


@pytest.mark.fl_case(op="aten::multinomial")
def test_multinomial(fl: Any) -> None:
    probs = torch.tensor([0.1, 0.2, 0.3, 0.4], device="flagos")
    torch.manual_seed(77)
    draws = torch.multinomial(probs, N, replacement=True)
    assert draws.device.type == "flagos" and draws.dtype == torch.int64
    counts = torch.bincount(draws.cpu(), minlength=4).double()
    expected = probs.cpu().double() * N
    chi2 = float(((counts - expected) ** 2 / expected).sum())
    assert chi2 < 30.0, f"counts {counts.tolist()} are off the probabilities (chi-square {chi2:.1f} on 3 dof)"
    torch.manual_seed(77)
    assert torch.equal(draws.cpu(), torch.multinomial(probs, N, replacement=True).cpu()), (
        "not reproducible under the same seed"
    )
    without = torch.multinomial(probs, 4, replacement=False).cpu()
    assert sorted(without.tolist()) == [0, 1, 2, 3], (
        f"sampling without replacement repeated a category: {without.tolist()}"
    )


@pytest.mark.fl_case(op="aten::native_dropout")
def test_dropout_masks_follow_the_seed(fl: Any) -> None:
    x = torch.ones(4096, device="flagos")
    torch.manual_seed(9)
    a = torch.nn.functional.dropout(x, p=0.25, training=True).cpu()
    torch.manual_seed(9)
    b = torch.nn.functional.dropout(x, p=0.25, training=True).cpu()
    assert torch.equal(a, b), "dropout masks differ under the same seed"
    kept = (a != 0).double().mean().item()
    assert abs(kept - 0.75) < 6 * math.sqrt(0.75 * 0.25 / 4096), (
        f"dropout kept {kept:.3f} of the elements, expected 0.75"
    )
    assert torch.allclose(a[a != 0], torch.tensor(1 / 0.75)), "kept elements are not scaled by 1/(1-p)"
