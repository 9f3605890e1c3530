"""Device management: count, current device, selection and synchronisation."""
from __future__ import annotations

from typing import Any

import torch

from torch_fl.runtime.device.core import backing, core, index


def is_available() -> bool:
    return True


def is_initialized() -> bool:
    return True


def _is_in_bad_fork() -> bool:
    return False


def _lazy_init() -> None:
    """The core is initialised when the platform activates; nothing is left to do lazily."""


def device_count() -> int:
    return core().device_count()


def current_device() -> int:
    return core().current_device()


def set_device(device: "torch.device | str | int") -> None:
    torch._C._accelerator_hooks_set_current_device(index(device))


def synchronize(device: "torch.device | str | int | None" = None) -> None:
    torch._C._accelerator_synchronizeDevice(index(device))


def get_device_name(device: "torch.device | str | int | None" = None) -> str:
    i = index(device)
    if backing() == "cuda":
        return f"flagos ({torch.cuda.get_device_name(i)})"
    return f"flagos host reference device {i}"


class device:
    """Context manager that makes `device` current for its block, like torch.cuda.device."""

    def __init__(self, device: Any) -> None:
        self.idx = -1 if device is None else index(device)
        self.prev = -1

    def __enter__(self) -> "device":
        if self.idx >= 0:
            self.prev = torch._C._accelerator_hooks_exchange_device(self.idx)
        return self

    def __exit__(self, *exc: object) -> bool:
        if self.idx >= 0:
            torch._C._accelerator_hooks_exchange_device(self.prev)
        return False


class device_of(device):
    """Context manager that makes the device of `obj` (a tensor) current."""

    def __init__(self, obj: torch.Tensor) -> None:
        super().__init__(obj.device if obj.device.type == "flagos" else None)
