"""Calling a backing-device function on flagos tensors through zero-copy aliases.

Shared by every Python path that runs kernels written for the backing device (FlagGems, vendor
modules, emulation, the Python form of native): arguments become backing aliases, results come
back as flagos tensors, and a result that is an argument's alias (in-place, out=) is returned as
the original flagos tensor, as the C++ route does.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from torch_fl.runtime.device.core import backing, core


def _is_flagos(x: Any) -> bool:
    return isinstance(x, torch.Tensor) and x.device.type == "flagos"


def call_on_backing(fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """`fn(*args, **kwargs)` with flagos tensors, devices and generators replaced by backing ones."""
    c = core()
    originals: dict[int, torch.Tensor] = {}
    index = -1

    def down(x: Any) -> Any:
        nonlocal index
        if _is_flagos(x):
            alias = c.as_backing(x)
            originals[id(alias)] = x
            if index < 0:
                index = x.device.index
            return alias
        if isinstance(x, torch.device) and x.type == "flagos":
            return torch.device(backing(), x.index) if backing() != "cpu" else torch.device("cpu")
        if isinstance(x, torch.Generator) and x.device.type == "flagos":
            return c.backing_generator(x)
        return x

    def up(x: Any) -> Any:
        if isinstance(x, torch.Tensor) and x.device.type == backing():
            original = originals.get(id(x))
            return original if original is not None else c.as_flagos(x, index)
        return x

    args = map_structure(down, args)
    kwargs = {k: map_structure(down, v) for k, v in kwargs.items()}
    with _on_device(index):
        return map_structure(up, fn(*args, **kwargs))


def map_structure(fn: Callable[[Any], Any], value: Any) -> Any:
    """`fn` applied to the leaves of nested tuples/lists (op arguments and results), fast.

    torch's generic pytree costs tens of microseconds per call; op arguments only nest lists and
    tuples, and this runs on every Python-routed call.
    """
    if isinstance(value, (tuple, list)):
        return type(value)(map_structure(fn, v) for v in value)
    return fn(value)


class _on_device:
    """Backing kernels launch on the current device: make it the arguments' device."""

    def __init__(self, index: int) -> None:
        self.index = index
        self.previous = -1

    def __enter__(self) -> None:
        if self.index >= 0 and backing() == "cuda":
            self.previous = torch.cuda.current_device()
            if self.previous != self.index:
                torch.cuda.set_device(self.index)

    def __exit__(self, *exc: object) -> None:
        if self.previous >= 0 and self.previous != self.index:
            torch.cuda.set_device(self.previous)
