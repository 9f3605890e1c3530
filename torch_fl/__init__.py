"""torch-fl: one PyTorch device, `flagos`, for any accelerator.

`import torch_fl` (or PyTorch's backend autoload during `import torch`) activates the platform
this machine's descriptors select; `torch_fl.activate(name)` does it explicitly. On a machine
with a real CUDA device, flagos is registered only when asked for (see torch_fl.activation).
"""
from __future__ import annotations


def _autoload() -> None:
    """PyTorch's device-backend autoload entry point (group `torch.backends`).

    Defined before `import torch`: when `import torch_fl` comes first, torch's own import calls
    this while torch_fl is still half-imported.
    """
    from torch_fl.activation import autoload

    autoload()


import torch  # noqa: E402

from torch_fl.activation import activate, activate_on_import, active_platform, is_active  # noqa: E402
from torch_fl.routing import explain  # noqa: E402
from torch_fl.runtime import as_backing, as_flagos  # noqa: E402

__all__ = ["activate", "active_platform", "as_backing", "as_flagos", "explain", "is_active"]

activate_on_import()
