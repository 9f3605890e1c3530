"""`device="flagos"` in a process where flagos could not start: an error that names the cause.

Without this, PyTorch answers `torch.randn(1, device="flagos")` with "Expected one of cpu, cuda, ...
device string: flagos", which hides the reason printed once at import. So the device name is
registered with a fallback kernel and a device module that raise that reason instead. A later
successful `torch_fl.activate()` removes both before the real runtime registers the device.
"""

from __future__ import annotations

import sys
import types
from typing import Any, Optional

import torch

NAME = "flagos"
_library: Optional[torch.library.Library] = None


class _InactiveModule(types.ModuleType):
    """`torch.flagos` while flagos is not active: every attribute raises the cause."""

    def __init__(self, message: str) -> None:
        super().__init__(f"torch.{NAME}")
        self.message = message

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        raise RuntimeError(self.message)


def register(cause: str) -> None:
    """Make every flagos kernel and `torch.flagos` raise "flagos is not active in this process: <cause>"."""
    global _library
    if _library is not None:
        return
    message = f"{NAME} is not active in this process: {cause}"

    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError(message)

    torch.utils.rename_privateuse1_backend(NAME)
    library = torch.library.Library("_", "IMPL")
    library.fallback(refuse, dispatch_key="PrivateUse1")
    torch._register_device_module(NAME, _InactiveModule(message))
    _library = library


def unregister() -> None:
    """Remove what `register` installed (nothing when it did not run)."""
    global _library
    if _library is None:
        return
    _library._destroy()
    _library = None
    delattr(torch, NAME)
    sys.modules.pop(f"torch.{NAME}", None)
