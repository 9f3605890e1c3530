"""`flagos` as a device name before the runtime runs: waiting for its first use, or refusing with a cause.

The autoload of every `import torch` names the device and leaves a stand-in `torch.flagos` that starts
flagos at its first use (`defer`): most processes that import torch never use flagos, and choosing,
validating and starting a platform costs them more than the rest of torch_fl. PyTorch asks the device
module's `_lazy_init` before it makes the first tensor of a device (`torch.tensor(..., device=)`,
`Tensor.to`, `Module.to`), and any other attribute of `torch.flagos` is a use too.

When flagos cannot start, the name stays and everything on it raises the cause (`refuse`): without
that, PyTorch answers `torch.randn(1, device="flagos")` with "not linked with support for flagos
devices", which hides the reason. The runtime's `start` removes either stand-in (`clear`) before it
registers the real device module.
"""

from __future__ import annotations

import sys
import types
from collections.abc import Callable
from typing import Any, Optional

import torch

NAME = "flagos"
_named = False
_library: Optional[torch.library.Library] = None


def name_device() -> None:
    """Make `flagos` a device PyTorch parses, with the generated `.flagos()` / `.is_flagos` methods (once)."""
    global _named
    if _named:
        return
    torch.utils.rename_privateuse1_backend(NAME)
    torch.utils.generate_methods_for_privateuse1_backend(
        for_tensor=True, for_module=True, for_packed_sequence=True, for_storage=True
    )
    _named = True


class _Pending(types.ModuleType):
    """`torch.flagos` until flagos is first used: any attribute starts it, then is the started module's."""

    def __init__(self, start: Callable[[], None]) -> None:
        super().__init__(f"torch.{NAME}")
        self._start = start
        self._starting = False

    def _started(self) -> types.ModuleType:
        # A use of torch.flagos by the start itself would start flagos again, inside the first start.
        if self._starting:
            raise RuntimeError(f"torch.{NAME} was used while flagos was starting")
        self._starting = True
        try:
            self._start()
        finally:
            self._starting = False
        return getattr(torch, NAME)

    def _lazy_init(self) -> None:
        self._started()._lazy_init()

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        return getattr(self._started(), name)


class _Refused(types.ModuleType):
    """`torch.flagos` where flagos could not start: every attribute raises the cause."""

    def __init__(self, message: str) -> None:
        super().__init__(f"torch.{NAME}")
        self.message = message

    # Defined, not left to __getattr__: PyTorch checks for it with hasattr(), which would swallow the cause.
    def _lazy_init(self) -> None:
        raise RuntimeError(self.message)

    def is_available(self) -> bool:
        return False

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        raise RuntimeError(self.message)


def defer(start: Callable[[], None]) -> None:
    """Name the device; `start` runs at its first use and leaves `torch.flagos` started, or refusing."""
    name_device()
    torch._register_device_module(NAME, _Pending(start))


def pending() -> bool:
    return isinstance(getattr(torch, NAME, None), _Pending)


def start_pending() -> None:
    """Start flagos if it waits for its first use (for a use that PyTorch does not see, such as the core's);
    raises the cause where it cannot start."""
    module = getattr(torch, NAME, None)
    if isinstance(module, _Pending):
        module = module._started()
    if isinstance(module, _Refused):
        raise RuntimeError(module.message)


def refuse(cause: str) -> None:
    """Make every flagos kernel and `torch.flagos` raise "flagos is not active in this process: <cause>"."""
    global _library
    clear()
    message = f"{NAME} is not active in this process: {cause}"

    def refusal(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError(message)

    name_device()
    library = torch.library.Library("_", "IMPL")
    library.fallback(refusal, dispatch_key="PrivateUse1")
    torch._register_device_module(NAME, _Refused(message))
    _library = library


def clear() -> None:
    """Remove the stand-in `torch.flagos` and the refusing kernels (nothing when there are none)."""
    global _library
    if _library is not None:
        _library._destroy()
        _library = None
    if isinstance(getattr(torch, NAME, None), (_Pending, _Refused)):
        delattr(torch, NAME)
        sys.modules.pop(f"torch.{NAME}", None)
