"""Access to the loaded C++ core and the active backing, shared by the device modules."""

from __future__ import annotations

from types import ModuleType

import torch

from torch_fl.runtime import standby

_core: ModuleType | None = None
_backing: str = "cpu"
_platform: str = ""


def bind(core: ModuleType, backing: str) -> None:
    global _core, _backing
    _core, _backing = core, backing


def core() -> ModuleType:
    if _core is None:
        standby.start_pending()  # asking for the core is a use of flagos
    if _core is None:
        raise RuntimeError("the flagos device is not active in this process (see torch_fl.activate)")
    return _core


def backing() -> str:
    return _backing


def name_platform(name: str) -> None:
    """Records the active platform's name, for messages (the runtime itself is generic over it)."""
    global _platform
    _platform = name


def platform() -> str:
    """The active platform's name, as the activation gave it ("" when started without one)."""
    return _platform or f"<a platform on '{_backing}'>"


def index(device: torch.device | str | int | None = None) -> int:
    """Device index for torch.cuda-style `device` arguments (None means the current device)."""
    if device is None:
        return core().current_device()
    if isinstance(device, int):
        return device
    device = torch.device(device)
    if device.type != "flagos":
        raise ValueError(f"expected a flagos device, got {device}")
    return core().current_device() if device.index is None else device.index
