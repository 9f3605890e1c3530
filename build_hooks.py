"""setuptools build hook: every built package carries torch_fl/compatibility.json.

pyproject.toml names `BuildPy` as the build_py command. It generates the manifest from the
descriptors being packaged (torch_fl.platform.compatibility.build_manifest) into the build folder,
so the file is never hand-written nor committed. The platform modules are loaded from the source
tree without running `torch_fl/__init__.py`, which would activate the device and import torch.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType

from setuptools.command.build_py import build_py

ROOT = Path(__file__).resolve().parent


def _platform_layer() -> tuple[ModuleType, ModuleType]:
    """torch_fl.platform's loader and compatibility modules, with torch_fl as a bare package."""
    saved = {name: module for name, module in sys.modules.items() if name == "torch_fl" or name.startswith("torch_fl.")}
    spec = importlib.util.spec_from_file_location(
        "torch_fl", ROOT / "torch_fl" / "__init__.py", submodule_search_locations=[str(ROOT / "torch_fl")]
    )
    assert spec is not None
    sys.modules["torch_fl"] = importlib.util.module_from_spec(spec)  # not executed: no activation
    try:
        loader = importlib.import_module("torch_fl.platform.loader")
        compatibility = importlib.import_module("torch_fl.platform.compatibility")
    finally:
        for name in [n for n in sys.modules if n == "torch_fl" or n.startswith("torch_fl.")]:
            del sys.modules[name]
        sys.modules.update(saved)
    return loader, compatibility


def _torch_requirement(requirements: list[str]) -> str | None:
    for requirement in requirements:
        name = requirement.split(";")[0].strip()
        if name.startswith("torch") and name[len("torch") :][:1] in ("<", ">", "=", "!", "~", ""):
            return name[len("torch") :].strip() or None
    return None


class BuildPy(build_py):
    """build_py that also writes torch_fl/compatibility.json into the build folder."""

    def run(self) -> None:
        super().run()
        loader, compatibility = _platform_layer()
        package = Path(self.build_lib) / "torch_fl"
        # the descriptors being packaged (invalid ones fail the build)
        shipped = sorted(p.parent for p in (package / "platforms").glob(f"*/{loader.DESCRIPTOR_FILE}"))
        descriptors = {folder.name: loader.load_descriptor(folder) for folder in shipped}
        manifest = compatibility.build_manifest(
            self.distribution.get_version(), _torch_requirement(self.distribution.install_requires or []), descriptors
        )
        target = package / compatibility.MANIFEST_NAME
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n", encoding="utf-8")
