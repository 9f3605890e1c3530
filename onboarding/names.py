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
        "cpu",
        "cuda",
        "hip",
        "xpu",
        "mps",
        "meta",
        "mtia",
        "xla",
        "lazy",
        "ipu",
        "hpu",
        "ve",
        "vulkan",
        "opengl",
        "opencl",
        "ideep",
        "mkldnn",
        "fpga",
        "maia",
        "privateuseone",
        "flagos",
        "npu",
        "musa",
        "default",
        "auto",
        "none",
        "all",
        "platforms",
        "records",
        "torch",
        "torch_fl",
        "test",
        "tests",
    }
    | set(KERNEL_SETS)
    # names Windows reserves for devices: such a folder cannot be created or checked out there
    | {"con", "prn", "aux", "nul"}
    | {f"{port}{i}" for port in ("com", "lpt") for i in range(10)}
)


def suggest(name: str) -> str:
    """A valid platform name close to `name` (lower case, '_' for other characters, not reserved)."""
    base = re.sub(r"[^a-z0-9_]+", "_", name.lower()).strip("_") or "chip"
    if not base[0].isalpha():
        base = f"chip_{base}"
    base = base[:MAX_LENGTH].rstrip("_")
    return f"{base}_chip"[-MAX_LENGTH:] if base in RESERVED else base


def check_name(name: str) -> str:
    """Return `name` when it can name a new platform, else raise OnboardError saying why."""
    if not name:
        raise OnboardError("the platform name is empty; use a lower-case identifier such as my_chip")
    if "/" in name or "\\" in name or name in (".", "..") or ".." in name:
        raise OnboardError(
            f"{name!r} is a path, not a name; give the folder name only (e.g. my_chip) and "
            "use --root or --platforms-dir for where to write"
        )
    if name != name.lower():
        raise OnboardError(f"{name!r} has upper-case letters; platform names are lower case, e.g. {suggest(name)!r}")
    if not re.fullmatch(NAME_PATTERN, name):
        raise OnboardError(
            f"{name!r} is not a valid platform name: a letter, then letters, digits or _; e.g. {suggest(name)!r}"
        )
    if len(name) > MAX_LENGTH:
        raise OnboardError(f"{name!r} is longer than {MAX_LENGTH} characters; e.g. {suggest(name)!r}")
    if name in RESERVED:
        raise OnboardError(
            f"{name!r} is reserved (a torch device type, an execution path, a torch-fl word or a "
            f"Windows device name); name the chip itself, e.g. {suggest(name)!r}"
        )
    return name
