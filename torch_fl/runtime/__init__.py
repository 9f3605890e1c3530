"""The flagos runtime: loads the C++ core and makes `flagos` a PyTorch device.

`start(backing, host_devices)` is the one entry; the platform loader calls it once it knows which
platform is active. Everything here is generic over the backing device named by the descriptor.

The autoload of every `import torch` imports this package for `standby`, so the core, its build and
the device module are imported by `start`, not here.
"""

from __future__ import annotations

from types import ModuleType

import torch

from torch_fl.runtime import standby

BACKEND_NAME = standby.NAME
SUPPORTED_BACKINGS = ("cpu", "cuda")
_core: ModuleType | None = None


def started() -> bool:
    return _core is not None


def core() -> ModuleType:
    from torch_fl.runtime.device import core as device_core

    return device_core.core()


def start(
    backing: str,
    host_devices: int = 2,
    amp_dtypes: list[torch.dtype] | None = None,
    dtypes: list[torch.dtype] | None = None,
    platform: str = "",
) -> ModuleType:
    """Registers the flagos device backed by `backing` ("cpu" or "cuda"). Idempotent.

    `dtypes` are the platform's declared dtypes, reported by torch.accelerator.get_device_capability();
    `platform` is the platform's name, which messages (such as the graph API's refusal) give.

    A start that failed part-way can be retried: what completed (the core, which can be set up
    once per process) is kept, and the remaining steps run again.
    """
    global _core
    from torch_fl.runtime.device import core as device_core

    if _core is not None:
        if device_core.backing() != backing:
            raise RuntimeError(f"flagos is already running on '{device_core.backing()}', cannot switch to '{backing}'")
        return _core
    if backing not in SUPPORTED_BACKINGS:
        raise RuntimeError(
            f"this runtime supports the backings {SUPPORTED_BACKINGS}; the platform asks for '{backing}'"
        )
    loaded = _register_device(backing, host_devices, amp_dtypes)
    if platform:
        device_core.name_platform(platform)
    if dtypes:
        loaded.set_supported_dtypes(dtypes)
    from torch_fl.runtime import cuda_alias, data_parallel, distributed, flex_attention, inductor, sharing

    distributed.register(backing)
    inductor.register(backing)
    flex_attention.register(backing)
    sharing.install()
    data_parallel.install(backing)
    _core = loaded
    cuda_alias.enable_from_env()
    return loaded


def _register_device(backing: str, host_devices: int, amp_dtypes: list[torch.dtype] | None) -> ModuleType:
    """The once-per-process part of start(): the core, the device name and module."""
    from torch_fl.runtime import autograd_exit, build
    from torch_fl.runtime import device as device_module
    from torch_fl.runtime.device import amp
    from torch_fl.runtime.device import core as device_core
    from torch_fl.runtime.device import management as device_management
    from torch_fl.runtime.device import random as device_random

    if device_core._core is not None:
        return device_core._core
    if backing == "cuda":
        torch.cuda.init()  # the CUDA allocator and generators must exist before flagos wraps them
    standby.clear()  # its refusing kernels would stand in the way of the core's
    loaded = build.load_core()
    standby.name_device()
    loaded.init(backing, host_devices)
    autograd_exit.install(loaded)
    if amp_dtypes:
        amp.set_amp_dtypes(amp_dtypes)
    torch._register_device_module(BACKEND_NAME, device_module)
    _enable_autocast_passthrough()
    device_core.bind(loaded, backing)
    device_random._bind_generators()
    if backing == "cuda":
        # The backing's context exists from here on (torch.cuda.init() above): flagos is initialised,
        # and a child forked after this point is in a bad fork, for CUDA and flagos alike.
        device_management._lazy_init()
    return loaded


_autocast_lib: torch.library.Library | None = None


def _enable_autocast_passthrough() -> None:
    """Ops without an autocast policy must pass through AutocastPrivateUse1 untouched."""
    global _autocast_lib
    key = torch._C.DispatchKey.AutocastPrivateUse1
    if torch._C._dispatch_has_backend_fallback(key):
        return
    _autocast_lib = torch.library.Library("_", "IMPL")
    _autocast_lib.fallback(torch.library.fallthrough_kernel, "AutocastPrivateUse1")


def as_backing(tensor: torch.Tensor) -> torch.Tensor:
    """Zero-copy view of a flagos tensor as a tensor of the backing device (same bytes)."""
    return core().as_backing(tensor)


def hand_to_backing(tensor: torch.Tensor) -> torch.Tensor:
    """A backing-device tensor over a flagos tensor's bytes that owns them through the backing
    allocator (the flagos tensor keeps working over the same bytes); `as_backing` where the
    allocator did not make them."""
    return core().hand_to_backing(tensor)


def as_flagos(tensor: torch.Tensor, index: int = -1) -> torch.Tensor:
    """Zero-copy view of a backing-device tensor as a flagos tensor (same bytes)."""
    return core().as_flagos(tensor, index)
