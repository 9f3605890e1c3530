"""torch-fl: one PyTorch device, `flagos`, for any accelerator.

`import torch_fl` (or PyTorch's backend autoload during `import torch`) activates the platform
this machine's descriptors select; `torch_fl.activate(name)` does it explicitly. On a machine
with a real CUDA device, flagos is registered only when asked for (see torch_fl.activation).
The `torch-fl` command imports this package without activating anything (and without torch
where a command does not need it, e.g. preflight).
"""
from __future__ import annotations

import importlib
import os
import sys
from typing import Any


def _invoked_as_cli() -> bool:
    return os.path.basename(sys.argv[0] if sys.argv else "") == "torch-fl"


def _autoload() -> None:
    """PyTorch's device-backend autoload entry point (group `torch.backends`).

    Defined before anything imports torch: when `import torch_fl` comes first, torch's own import
    calls this while torch_fl is still half-imported. The `torch-fl` command activates the
    platform it is asked about itself, so its own `import torch` activates nothing.
    """
    if _invoked_as_cli():
        return
    from torch_fl.activation import autoload

    autoload()


from torch_fl.activation import activate, active_platform, is_active  # noqa: E402

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


if not _invoked_as_cli():
    from torch_fl.activation import activate_on_import

    activate_on_import()
