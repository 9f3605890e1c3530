"""Preflight: does this environment match what a platform needs, before anything heavy is imported?

It reads versions from package metadata and never imports torch, the kernel libraries or the
runtime, so it works (and explains itself) exactly where importing them would fail.
"""

from __future__ import annotations

import importlib.util
import os
import re
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from torch_fl.platform.descriptor import RUNTIME_BACKINGS, PlatformDescriptor
from torch_fl.platform.record import installed_version
from torch_fl.platform.versions import satisfies


@dataclass(frozen=True)
class Check:
    """One requirement: what was expected, what was found, and how to fix it when it fails."""

    name: str
    ok: bool
    expected: str
    found: str
    hint: str = ""


@dataclass(frozen=True)
class PreflightReport:
    platform: str
    checks: list[Check]

    @property
    def ok(self) -> bool:
        return all(c.ok for c in self.checks)

    def to_dict(self) -> dict[str, Any]:
        return {"ok": self.ok, "platform": self.platform, "checks": [asdict(c) for c in self.checks]}


def _package(name: str, spec: str, why: str) -> Check:
    found = installed_version(name)
    ok = found is not None and satisfies(found, spec)
    return Check(name, ok, spec, found or "not installed", "" if ok else f'{why}: pip install "{name}{spec}"')


def _python(descriptor: PlatformDescriptor) -> Check | None:
    line, spec = descriptor.environment.python, descriptor.requirements.python
    if line is None and spec is None:
        return None
    found = ".".join(str(p) for p in sys.version_info[:3])
    ok = (line is None or satisfies(found, f"=={line}.*")) and (spec is None or satisfies(found, spec))
    expected = " and ".join(p for p in (line and f"{line}.x", spec) if p)
    hint = "" if ok else f"run with a Python interpreter matching {expected}"
    return Check("python", ok, expected, found, hint)


def _sdk(descriptor: PlatformDescriptor) -> Check | None:
    sdk = descriptor.environment.sdk
    if sdk is None or sdk.home_env is None:
        return None
    # The variable is named by the descriptor, not a torch-fl setting, so it is read directly.
    value = os.environ.get(sdk.home_env)
    label = " ".join(p for p in (sdk.name, sdk.version) if p)
    ok = value is not None and Path(value).is_dir()
    found = "unset" if not value else (value if ok else f"{value} (no such folder)")
    hint = "" if ok else f"install {label} and set {sdk.home_env} to its folder"
    return Check(f"sdk {sdk.name}", ok, f"{sdk.home_env} names the {label} folder", found, hint)


def torch_cuda_version() -> str | None:
    """The CUDA version the installed torch was built with (None for a CPU-only build), read from
    torch/version.py without importing torch."""
    spec = importlib.util.find_spec("torch")
    if spec is None or not spec.submodule_search_locations:
        return None
    version_file = Path(next(iter(spec.submodule_search_locations))) / "version.py"
    try:
        text = version_file.read_text(encoding="utf-8")
    except OSError:
        return None
    match = re.search(r"^cuda\b[^=\n]*=\s*['\"]([^'\"]+)['\"]", text, re.MULTILINE)
    return match.group(1) if match else None


def _cuda_build(descriptor: PlatformDescriptor) -> Check | None:
    if descriptor.backing.device != "cuda" or installed_version("torch") is None:
        return None
    cuda = torch_cuda_version()
    return Check(
        "torch cuda build",
        cuda is not None,
        "a torch built with CUDA",
        f"CUDA {cuda}" if cuda else "a CPU-only torch",
        ""
        if cuda
        else "this platform's backing is cuda: install a CUDA build of torch (see pytorch.org's install page)",
    )


def preflight(descriptor: PlatformDescriptor) -> PreflightReport:
    """Check interpreter, torch, kernel libraries, required packages, SDK and runtime support."""
    checks: list[Check] = []
    backing = descriptor.backing.device
    backing_ok = backing in RUNTIME_BACKINGS
    checks.append(
        Check(
            "backing",
            backing_ok,
            " or ".join(sorted(RUNTIME_BACKINGS)),
            backing,
            ""
            if backing_ok
            else f"the runtime cannot drive a {backing} backing yet; this platform loads as a descriptor only",
        )
    )
    for check in (_python(descriptor), _sdk(descriptor)):
        if check is not None:
            checks.append(check)
    checks.append(_package("torch", descriptor.requirements.torch, "torch is required"))
    cuda_build = _cuda_build(descriptor)
    if cuda_build is not None:
        checks.append(cuda_build)
    gems = descriptor.kernels.flaggems
    if gems is not None and gems.enabled:
        checks.append(_package(gems.package, f"=={gems.version}", "the flaggems kernel set is pinned"))
    vendor = descriptor.kernels.vendor
    if vendor is not None and vendor.package is not None:
        checks.append(_package(vendor.package.name, f"=={vendor.package.version}", "the vendor kernel set is pinned"))
    for name, spec in sorted(descriptor.requirements.packages.items()):
        checks.append(_package(name, spec, "required by the platform"))
    return PreflightReport(descriptor.name, checks)
