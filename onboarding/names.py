"""Which platform names `torch-fl onboard` accepts, checked before anything is written.

A platform name becomes a folder name, a Python module suffix (`torch_fl_vendor_<name>`), a CI
workflow file name and the value of FLAGOS_PLATFORM, so it must be a plain lower-case identifier
and must not read as a device type or an execution path (`FLAGOS_PLATFORM=cpu` would be a trap).
"""

from __future__ import annotations

import re
from collections.abc import Collection

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


def _instead(name: str, taken: Collection[str]) -> str:
    """What to use instead of `name`: a valid name close to it, unless that platform already exists."""
    close = suggest(name)
    if close in taken:
        return f"and {close} already exists (to start from it: --like {close}); choose another name"
    return f"e.g. {close!r}"


def check_name(name: str, taken: Collection[str] = ()) -> str:
    """Return `name` when it can name a new platform, else raise OnboardError saying why (and never
    offering one of the `taken` names in its place)."""
    if not name:
        raise OnboardError("the platform name is empty; use a lower-case identifier such as my_chip")
    if "/" in name or "\\" in name or name in (".", "..") or ".." in name:
        raise OnboardError(
            f"{name!r} is a path, not a name; give the folder name only (e.g. my_chip) and "
            "use --root or --platforms-dir for where to write"
        )
    if name != name.lower():
        raise OnboardError(f"{name!r} has upper-case letters; platform names are lower case, {_instead(name, taken)}")
    if not re.fullmatch(NAME_PATTERN, name):
        raise OnboardError(
            f"{name!r} is not a valid platform name: a letter, then letters, digits or _; {_instead(name, taken)}"
        )
    if len(name) > MAX_LENGTH:
        raise OnboardError(f"{name!r} is longer than {MAX_LENGTH} characters; {_instead(name, taken)}")
    if name in RESERVED:
        raise OnboardError(
            f"{name!r} is reserved (a torch device type, an execution path, a torch-fl word or a "
            f"Windows device name); name the chip itself, {_instead(name, taken)}"
        )
    return name
