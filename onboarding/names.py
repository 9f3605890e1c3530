"""Which platform names `torch-fl onboard` accepts, checked before anything is written.

A platform name becomes a folder name, a Python module suffix (`torch_fl_vendor_<name>`), a CI
workflow file name and the value of FLAGOS_PLATFORM, so it must be a plain lower-case identifier
and must not read as a device type or an execution path (`FLAGOS_PLATFORM=cpu` would be a trap).
"""
from __future__ import annotations

import re

from torch_fl.onboarding.errors import OnboardError
from torch_fl.platform.descriptor import KERNEL_SETS, NAME_PATTERN

MAX_LENGTH = 48

# torch device types (a name here would be confused with `device="..."`), the execution paths,
# and the words the platform layer gives a meaning of its own.
RESERVED: frozenset[str] = frozenset(
    {
        "cpu", "cuda", "hip", "xpu", "mps", "meta", "mtia", "xla", "lazy", "ipu", "hpu", "ve", "vulkan",
        "opengl", "opencl", "ideep", "mkldnn", "fpga", "maia", "privateuseone", "flagos", "npu", "musa",
        "default", "auto", "none", "all", "platforms", "records", "torch", "torch_fl", "test", "tests",
    }
    | set(KERNEL_SETS)
)


def check_name(name: str) -> str:
    """Return `name` when it can name a new platform, else raise OnboardError saying why."""
    if not name:
        raise OnboardError("the platform name is empty; use a lower-case identifier such as my_chip")
    if "/" in name or "\\" in name or name in (".", "..") or ".." in name:
        raise OnboardError(f"{name!r} is a path, not a name; give the folder name only (e.g. my_chip) and "
                           "use --root or --platforms-dir for where to write")
    if name != name.lower():
        raise OnboardError(f"{name!r} has upper-case letters; platform names are lower case: {name.lower()!r}")
    if not re.fullmatch(NAME_PATTERN, name):
        suggestion = re.sub(r"[^a-z0-9_]+", "_", name.lower()).strip("_")
        hint = f"; e.g. {suggestion!r}" if suggestion and re.fullmatch(NAME_PATTERN, suggestion) else ""
        raise OnboardError(f"{name!r} is not a valid platform name: a letter, then letters, digits or _{hint}")
    if len(name) > MAX_LENGTH:
        raise OnboardError(f"{name!r} is longer than {MAX_LENGTH} characters")
    if name in RESERVED:
        raise OnboardError(f"{name!r} is reserved (a torch device type, an execution path or a torch-fl word); "
                           "name the chip itself, e.g. acme_x1")
    return name
