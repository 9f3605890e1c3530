"""Activating a platform in this process: choose it, gate it, start the runtime, install routes.

The rule: a process activates flagos when PyTorch autoloads torch_fl during `import torch` (the
`torch.backends` entry point `torch_fl:_autoload`; TORCH_DEVICE_BACKEND_AUTOLOAD=0 turns it off) or
when it calls `torch_fl.activate()`. Importing torch_fl or any of its modules activates nothing, so
the `torch-fl` command can import the package without torch; it also turns the autoload off for its
own process (`activate_only_when_asked`), because it activates the platform a command names.

The autoload only names the device: the activation itself runs at the first use of flagos (a flagos
tensor, an attribute of `torch.flagos`, `torch_fl.activate()`, `is_active()`, `active_platform()`), so
a process that imports torch and never uses flagos pays for no platform data (pydantic, YAML,
descriptors, records, routes). This module imports the platform layer only when it activates.

Containment on CUDA machines: registering any PrivateUse1 backend makes it PyTorch's current
accelerator (at::getAccelerator prefers PrivateUse1 since PyTorch 2.8, pytorch/pytorch#161129),
after which the autograd engine finds no stream for plain-CUDA nodes and a backward over plain
CUDA tensors dies on an internal assert. That cannot be undone inside a process, so on a machine
with a real CUDA device the autoload registers flagos only when FLAGOS_PLATFORM asks for it (a plain
`import torch` leaves CUDA untouched and says why flagos is off); `torch_fl.activate()` always asks.
"""

from __future__ import annotations

import importlib
import importlib.abc
import os
import sys
import warnings
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Optional

from torch_fl import env

if TYPE_CHECKING:
    from torch_fl.platform import Gate, PlatformDescriptor, Selection
    from torch_fl.platform.errors import DescriptorError

CONTAINMENT_NOTE = (
    "torch_fl: this machine has a CUDA device, so flagos was not registered in this process: registering a "
    "PrivateUse1 device makes it PyTorch's accelerator and breaks autograd on plain CUDA tensors "
    "(pytorch/pytorch#161129). Set FLAGOS_PLATFORM=<name> or call torch_fl.activate() to use device='flagos' "
    "here; run plain-CUDA references in a process that does not (TORCH_DEVICE_BACKEND_AUTOLOAD=0 keeps torch "
    "from loading torch_fl there)."
)


@dataclass
class ActivePlatform:
    """What runs in this process: the platform, why it was chosen, and its gate."""

    descriptor: PlatformDescriptor
    selection: Selection
    gate: Gate
    warnings: list[str] = field(default_factory=list)

    @property
    def name(self) -> str:
        return self.descriptor.name


_active: Optional[ActivePlatform] = None
_autoload_enabled = True  # False once the process said it activates only when asked
_activating = False  # True while activate() imports torch, whose autoload then leaves the work to it
_warned_broken: set[str] = set()


# The modules that import torch themselves (packages: every module in them). The rest of the
# package (platform data, route files, the CLI, onboarding) imports without torch.
NEEDS_TORCH = (
    "torch_fl.runtime",
    "torch_fl.kernels",
    "torch_fl.workloads",
    "torch_fl.numerics",
    "torch_fl.conformance.suites",
    "torch_fl.routing.checks",
    "torch_fl.routing.constraints",
    "torch_fl.routing.explanation",
    "torch_fl.routing.runtime",
    "torch_fl.routing.tuner",
    "torch_fl.routing.tuner_worker",
    "torch_fl.conformance.capture",
    "torch_fl.conformance.compare",
    "torch_fl.conformance.dist_worker",
    "torch_fl.conformance.opcheck",
    "torch_fl.conformance.sharing_worker",
    "torch_fl.conformance.sweepcall",
    "torch_fl.conformance.sweepgen",
    "torch_fl.conformance.watch",
)


class TorchFirst(importlib.abc.MetaPathFinder):
    """Imports torch before a module of ours that needs it starts executing.

    The first `import torch` of a process runs PyTorch's autoload, which activates and so imports
    most of the package; had that import begun inside one of our modules, the activation would find
    that module half-executed. Importing torch before the module exists leaves nothing half-done.
    """

    def find_spec(self, fullname: str, path: object, target: object = None) -> None:
        if fullname.startswith(NEEDS_TORCH) and "torch" not in sys.modules:
            try:
                importlib.import_module("torch")
            except ImportError:
                pass  # the module's own `import torch` reports it
        return None  # the normal finders load the module


def install_torch_first() -> None:
    if not any(isinstance(f, TorchFirst) for f in sys.meta_path):
        sys.meta_path.insert(0, TorchFirst())


def active_platform() -> Optional[ActivePlatform]:
    """The active platform; None when flagos is not active (asking is a first use, see the module doc)."""
    _start_if_pending()
    return _active


def is_active() -> bool:
    return active_platform() is not None


def _start_if_pending() -> None:
    if "torch" in sys.modules:  # the autoload defers only once torch is imported, and this needs no torch
        from torch_fl.runtime import standby

        if standby.pending():
            _activate_deferred()


def _real_cuda_present() -> bool:
    import torch

    return bool(torch.cuda._is_compiled() and torch.cuda.device_count() > 0)


def activate(name: Optional[str] = None) -> ActivePlatform:
    """Activate a platform (by name, else FLAGOS_PLATFORM, else detection) in this process."""
    global _active, _activating
    if _active is not None:
        if name is not None and name != _active.name:
            raise RuntimeError(f"platform {_active.name!r} is already active; a process runs one platform")
        return _active
    _activating = True
    try:
        import torch
    finally:
        _activating = False
    from torch_fl import runtime
    from torch_fl.platform import Gate, Selection, load_all, select_platform, validate_op_names
    from torch_fl.routing.checks import check_routing
    from torch_fl.routing.runtime import install as install_routes

    descriptors, broken = load_all()
    _warn_broken_once(broken, name or env.get("FLAGOS_PLATFORM"))
    if name is not None:
        if name in broken:
            raise broken[name]
        if name not in descriptors:
            raise KeyError(f"unknown platform {name!r}; known platforms: {', '.join(sorted(descriptors))}")
        selection = Selection(name, "named in torch_fl.activate()", True)
    else:
        selection = select_platform(descriptors, broken=broken)
    descriptor = descriptors[selection.name]
    validate_op_names(descriptor)
    for key, value in descriptor.environment.variables.items():
        os.environ.setdefault(key, value)  # the user's own setting wins
    gate = Gate.for_platform(descriptor, torch.__version__)
    routing = check_routing(descriptor)
    routing.enforce(env.flag("FLAGOS_STRICT"))  # before anything starts: never half-active
    amp_dtypes = [getattr(torch, d) for d in descriptor.capabilities.amp_dtypes]
    dtypes = [getattr(torch, d) for d in descriptor.capabilities.dtypes]
    runtime.start(
        descriptor.backing.device, descriptor.backing.virtual_devices or 1, amp_dtypes, dtypes, descriptor.name
    )
    active = ActivePlatform(descriptor, selection, gate)
    for message in [gate.warning()] + [f"torch_fl: {p}" for p in routing.problems]:
        if message:
            active.warnings.append(message)
            warnings.warn(message, stacklevel=2)
    install_routes(active, routing.table, routing.source)
    _active = active
    return active


def _warn_broken_once(broken: Mapping[str, DescriptorError], chosen: Optional[str]) -> None:
    """Say once per process which platforms were skipped because their descriptor cannot be read
    (a chosen one raises its own error instead)."""
    for name, error in broken.items():
        if name != chosen and name not in _warned_broken:
            _warned_broken.add(name)
            warnings.warn(f"torch_fl: platform {name} skipped: {error.brief}", stacklevel=3)


def activate_only_when_asked() -> None:
    """From now on PyTorch's autoload activates nothing in this process; only `activate()` does.

    For the `torch-fl` command, which activates the platform a command names (a detected one
    activated by its own `import torch` would be the wrong one) or none at all.
    """
    global _autoload_enabled
    _autoload_enabled = False


def autoload() -> None:
    """PyTorch's device-backend autoload, called during `import torch`, under the containment rule.

    Most processes that import torch never use flagos: here it is only named, and activated at its
    first use (torch_fl.runtime.standby), or now where FLAGOS_ALIAS_CUDA runs CUDA code on it. On a machine with a real CUDA device FLAGOS_PLATFORM asks for
    flagos, and the activation runs at once: a failure must leave the name unregistered there.
    `import torch` must keep working when flagos cannot start, so a failure is a warning.
    """
    if _activating or not _autoload_enabled:
        return
    if _real_cuda_present():
        if not env.get("FLAGOS_PLATFORM"):
            warnings.warn(CONTAINMENT_NOTE, stacklevel=2)
            return
        try:
            activate()
        except Exception as exc:
            warnings.warn(f"torch_fl: flagos was not activated during torch's backend autoload: {exc}", stacklevel=2)
        return
    from torch_fl.runtime import cuda_alias, standby

    standby.defer(_activate_deferred)
    if cuda_alias.requested():  # CUDA code run on flagos never names flagos: its first use is now
        _activate_deferred()


def _activate_deferred() -> None:
    """The autoload's activation, at the first use of flagos. A failure is a warning, once: flagos then
    refuses with the cause (device="flagos" raises naming it) until `activate()` succeeds."""
    from torch_fl.runtime import standby

    try:
        activate()
    except Exception as exc:
        warnings.warn(f"torch_fl: flagos was not activated at its first use: {exc}", stacklevel=3)
        if standby.pending():  # else the runtime got as far as registering the device
            standby.refuse(str(exc))
