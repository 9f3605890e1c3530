"""Device management: initialisation, count, current device, selection and synchronisation.

Initialisation follows torch.cuda's rules: the device is registered when the platform activates,
and flagos counts as initialised from its first use in a process (a flagos tensor, or init(); on a
CUDA backing, the activation, which creates the CUDA context). A
child forked after that is in a *bad fork*: the device state it inherited may not be usable there
(a CUDA backing's context never is), so initialising flagos in it raises, on every backing alike,
so that a program proven on the host reference platform behaves the same on an accelerator.
"""

from __future__ import annotations

import os
from typing import Any, Literal

import torch

from torch_fl.runtime.device.core import backing, core, index

_initialized = False
_in_bad_fork = False
_fork_watch = False


def is_available() -> bool:
    return True


def is_initialized() -> bool:
    return _initialized and not _in_bad_fork


def _is_in_bad_fork() -> bool:
    return _in_bad_fork


def init() -> None:
    """Initialises flagos in this process; any first use does so too (as torch.cuda.init())."""
    _lazy_init()


def _lazy_init() -> None:
    """Called by PyTorch before the first flagos tensor of a process is made, and by init()."""
    global _initialized, _fork_watch
    if is_initialized():
        return
    if _in_bad_fork:
        raise RuntimeError(
            "Cannot re-initialize flagos in forked subprocess. To use flagos with multiprocessing, "
            "you must use the 'spawn' start method"
        )
    core()  # raises when flagos is not active in this process
    if not _fork_watch:
        os.register_at_fork(after_in_child=_after_fork_in_child)
        _fork_watch = True
    _initialized = True


def _after_fork_in_child() -> None:
    global _in_bad_fork
    if _initialized:
        _in_bad_fork = True
        core().request_lazy_init()  # the child's first flagos tensor asks _lazy_init(), which refuses


def device_count() -> int:
    return core().device_count()


def current_device() -> int:
    _lazy_init()
    return core().current_device()


def set_device(device: torch.device | str | int) -> None:
    _lazy_init()
    torch._C._accelerator_hooks_set_current_device(index(device))


def synchronize(device: torch.device | str | int | None = None) -> None:
    _lazy_init()
    torch._C._accelerator_synchronizeDevice(index(device))


def get_device_name(device: torch.device | str | int | None = None) -> str:
    i = index(device)
    if backing() == "cuda":
        return f"flagos ({torch.cuda.get_device_name(i)})"
    return f"flagos host reference device {i}"


class device:
    """Context manager that makes `device` current for its block, like torch.cuda.device."""

    def __init__(self, device: Any) -> None:
        self.idx = -1 if device is None else index(device)
        self.prev = -1

    def __enter__(self) -> device:
        if self.idx >= 0:
            self.prev = torch._C._accelerator_hooks_exchange_device(self.idx)
        return self

    def __exit__(self, *exc: object) -> Literal[False]:
        if self.idx >= 0:
            torch._C._accelerator_hooks_exchange_device(self.prev)
        return False


class device_of(device):
    """Context manager that makes the device of `obj` (a tensor) current."""

    def __init__(self, obj: torch.Tensor) -> None:
        super().__init__(obj.device if obj.device.type == "flagos" else None)
