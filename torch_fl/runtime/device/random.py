"""Random number generation: one default torch.Generator per flagos device, driven by the core."""

from __future__ import annotations

import torch

from torch_fl.runtime.device.core import core, index

# Filled in place once the core is up, so `from torch.flagos import default_generators` stays valid.
default_generators: list[torch.Generator] = []


def _bind_generators() -> None:
    default_generators[:] = [core().default_generator(i) for i in range(core().device_count())]


def get_rng_state(device: torch.device | str | int = "flagos") -> torch.Tensor:
    return default_generators[index(device)].get_state()


def set_rng_state(new_state: torch.Tensor, device: torch.device | str | int = "flagos") -> None:
    default_generators[index(device)].set_state(new_state)


def get_rng_state_all() -> list[torch.Tensor]:
    return [g.get_state() for g in default_generators]


def set_rng_state_all(new_states: list[torch.Tensor]) -> None:
    for g, state in zip(default_generators, new_states):
        g.set_state(state)


def manual_seed(seed: int) -> None:
    default_generators[index()].manual_seed(int(seed))


def manual_seed_all(seed: int) -> None:
    for g in default_generators:
        g.manual_seed(int(seed))


def seed() -> None:
    default_generators[index()].seed()


def seed_all() -> None:
    first = default_generators[0].seed()
    for g in default_generators[1:]:
        g.manual_seed(first)


def initial_seed() -> int:
    return default_generators[index()].initial_seed()
