"""compatibility.json: what a built package was made for, read back without importing torch.

The build writes `torch_fl/compatibility.json` from the descriptors it ships (build_hooks.py at the
repository root calls `build_manifest`): the platforms with their backing, kernel sets, SDK and
pinned kernel libraries, the torch requirement, and the torch, C++ ABI and Python the package was
built with. `inspect` reads it from a wheel or from the installed package, warns where this
environment drifted from the build, and fails a release table whose platforms lack SDK or vendor
provenance (a device platform names its SDK and version; a vendor kernel module that is not a file
in the package names the distribution and version it comes from).
"""

from __future__ import annotations

import json
import re
import sys
import zipfile
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

from torch_fl.platform.descriptor import PlatformDescriptor
from torch_fl.platform.record import installed_version
from torch_fl.platform.versions import minor_line

MANIFEST_NAME = "compatibility.json"
WHEEL_PATH = f"torch_fl/{MANIFEST_NAME}"
FORMAT = 1


def torch_cxx11_abi() -> bool | None:
    """The C++ ABI of the installed torch, read from its source (torch is not imported), or None."""
    try:
        source = metadata.distribution("torch").locate_file("torch/__init__.py")
        text = Path(str(source)).read_text(encoding="utf-8")
    except (metadata.PackageNotFoundError, OSError):
        return None
    docstring = r'(?:r?"""[^"]*"""\s*)?'
    found = re.search(r"def compiled_with_cxx11_abi\(\)[^:]*:\s*" + docstring + r"return (True|False)\b", text)
    return None if found is None else found.group(1) == "True"


def build_environment() -> dict[str, Any]:
    """The torch, C++ ABI and Python of this environment, as the manifest records them."""
    torch = installed_version("torch")
    return {
        "python": ".".join(str(p) for p in sys.version_info[:2]),
        "torch": torch,
        "torch_line": minor_line(torch) if torch else None,
        "cxx11_abi": torch_cxx11_abi() if torch else None,
    }


def kernel_pins(descriptor: PlatformDescriptor) -> dict[str, str]:
    """Distribution -> exact version of the kernel libraries the platform's routes are checked against."""
    kernels = descriptor.kernels
    pins: dict[str, str] = {}
    if kernels.flaggems is not None and kernels.flaggems.enabled:
        pins[kernels.flaggems.package] = kernels.flaggems.version
    if kernels.vendor is not None and kernels.vendor.package is not None:
        pins[kernels.vendor.package.name] = kernels.vendor.package.version
    return pins


def platform_entry(descriptor: PlatformDescriptor) -> dict[str, Any]:
    """One platform's row of the release table."""
    sdk = descriptor.environment.sdk
    vendor = descriptor.kernels.vendor
    return {
        "display_name": descriptor.display_name,
        "vendor": descriptor.vendor,
        "boards": list(descriptor.boards),
        "backing": descriptor.backing.device,
        "kernel_sets": list(descriptor.kernels.declared()),
        "kernel_pins": kernel_pins(descriptor),
        "vendor_module": vendor.module if vendor is not None else None,
        "vendor_package": vendor.package.model_dump() if vendor is not None and vendor.package is not None else None,
        "sdk": {"name": sdk.name, "version": sdk.version} if sdk is not None else None,
        "python": descriptor.environment.python,
        "torch": descriptor.requirements.torch,
        "features": list(descriptor.capabilities.features),
    }


def build_manifest(
    version: str, torch_requirement: str | None, descriptors: Mapping[str, PlatformDescriptor]
) -> dict[str, Any]:
    """The content of compatibility.json for a package `version` shipping `descriptors`."""
    return {
        "format": FORMAT,
        "package": {"name": "torch-fl", "version": version},
        "torch_requirement": torch_requirement,
        "built_with": build_environment(),
        "platforms": {name: platform_entry(descriptors[name]) for name in sorted(descriptors)},
    }


def provenance_problems(manifest: Mapping[str, Any]) -> dict[str, list[str]]:
    """Platform -> what its release row lacks: SDK name and version on a device backing, and the
    distribution and version of a vendor kernel module that the package does not carry itself."""
    problems: dict[str, list[str]] = {}
    for name, row in manifest.get("platforms", {}).items():
        missing = []
        if row.get("backing") != "cpu":
            sdk = row.get("sdk") or {}
            if not sdk.get("name"):
                missing.append("SDK name")
            if not sdk.get("version"):
                missing.append("SDK version")
        module = row.get("vendor_module")
        if module and not module.endswith(".py") and not row.get("vendor_package"):
            missing.append(f"the distribution and version of the vendor module {module}")
        if missing:
            problems[name] = missing
    return problems


@dataclass(frozen=True)
class Drift:
    """One way this environment differs from the one the package was built in."""

    what: str
    built: str
    here: str


@dataclass
class Inspection:
    source: str
    manifest: dict[str, Any] | None
    drift: list[Drift] = field(default_factory=list)
    provenance: dict[str, list[str]] = field(default_factory=dict)
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None and not self.provenance

    def to_dict(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "source": self.source,
            "error": self.error,
            "manifest": self.manifest,
            "drift": [asdict(d) for d in self.drift],
            "provenance": self.provenance,
        }


def environment_drift(manifest: Mapping[str, Any], platform: str | None) -> list[Drift]:
    """Where this environment differs from the manifest's build: torch line, C++ ABI, Python line,
    and the installed kernel libraries against the pins of `platform` (the one selected here)."""
    built = manifest.get("built_with", {})
    here = build_environment()
    drift = [
        Drift(key, str(built.get(key)), str(here[key]))
        for key in ("torch_line", "cxx11_abi", "python")
        if built.get(key) is not None and here[key] != built.get(key)
    ]
    row = manifest.get("platforms", {}).get(platform or "", {})
    for package, pinned in sorted(row.get("kernel_pins", {}).items()):
        found = installed_version(package)
        if found != pinned:
            drift.append(Drift(package, pinned, found or "not installed"))
    return drift


def read_wheel(path: Path) -> dict[str, Any]:
    with zipfile.ZipFile(path) as wheel:
        try:
            return json.loads(wheel.read(WHEEL_PATH))
        except KeyError:
            raise FileNotFoundError(f"{path.name} carries no {WHEEL_PATH}") from None


def read_installed() -> dict[str, Any]:
    path = Path(__file__).resolve().parents[1] / MANIFEST_NAME
    if not path.is_file():
        raise FileNotFoundError(f"the installed torch_fl carries no {MANIFEST_NAME} (an editable or source install)")
    return json.loads(path.read_text(encoding="utf-8"))


def inspect(wheel: Path | None, platform: str | None) -> Inspection:
    """Reads the manifest of `wheel` (or of the installed package), and judges it here."""
    source = str(wheel) if wheel is not None else "installed torch_fl"
    try:
        manifest = read_wheel(wheel) if wheel is not None else read_installed()
    except (OSError, zipfile.BadZipFile, json.JSONDecodeError) as exc:
        return Inspection(source, None, error=str(exc))
    if manifest.get("format") != FORMAT:
        return Inspection(source, manifest, error=f"unknown {MANIFEST_NAME} format {manifest.get('format')!r}")
    return Inspection(source, manifest, environment_drift(manifest, platform), provenance_problems(manifest))
