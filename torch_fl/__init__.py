"""torch-fl: one PyTorch device, `flagos`, for any accelerator.

A process activates flagos when PyTorch autoloads this package during `import torch` (the entry
point `torch_fl:_autoload`; TORCH_DEVICE_BACKEND_AUTOLOAD=0 turns it off) or when it calls
`torch_fl.activate(name)`; the autoload only names the device and the platform activates at the first
use of flagos. Importing torch_fl or any of its modules activates nothing (see torch_fl.activation,
which also holds the CUDA containment rule). So `import torch_fl` needs no
torch, and the `torch-fl` command imports the package freely.
"""

from __future__ import annotations

import importlib
from typing import Any

from torch_fl.activation import activate, active_platform, install_torch_first, is_active
from torch_fl.activation import autoload as _autoload  # noqa: F401  (PyTorch's entry point, group torch.backends)

install_torch_first()

# Imported on first use, so importing the package does not import torch by itself.
_LAZY = {
    "explain": ("torch_fl.routing", "explain"),
    "as_backing": ("torch_fl.runtime", "as_backing"),
    "as_flagos": ("torch_fl.runtime", "as_flagos"),
}

__all__ = ["activate", "active_platform", "as_backing", "as_flagos", "explain", "is_active"]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        module, attribute = _LAZY[name]
        return getattr(importlib.import_module(module), attribute)
    raise AttributeError(f"module 'torch_fl' has no attribute {name!r}")
