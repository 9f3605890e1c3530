"""torch-fl: one PyTorch device, `flagos`, for any accelerator.

`import torch_fl` (or PyTorch's backend autoload during `import torch`) activates the platform
this machine's descriptors select; `torch_fl.activate(name)` does it explicitly. On a machine
with a real CUDA device, flagos is registered only when asked for (see torch_fl.activation).
"""
from __future__ import annotations

import torch

from torch_fl.activation import activate, activate_on_import, active_platform, autoload as _autoload, is_active
from torch_fl.routing.explain import explain
from torch_fl.runtime import as_backing, as_flagos

__all__ = ["activate", "active_platform", "as_backing", "as_flagos", "explain", "is_active"]

activate_on_import()
