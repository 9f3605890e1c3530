"""The wheel ships every Python package of the source tree: pyproject lists them by hand (the
repository's top-level folders are mapped into torch_fl), so a new package must be added there."""

from __future__ import annotations

import sys

if sys.version_info >= (3, 11):
    import tomllib
else:  # Python 3.10 has no tomllib; tomli is its source
    import tomli as tomllib

from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_every_package_folder_is_shipped():
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    mapping = config["package-dir"]
    shipped = set(config["packages"])
    missing = []
    for package, folder in mapping.items():
        for init in (ROOT / folder).rglob("__init__.py"):
            relative = init.parent.relative_to(ROOT / folder)
            name = ".".join([package, *relative.parts]) if relative.parts else package
            if name not in shipped:
                missing.append(name)
    assert not missing, f"packages missing from pyproject.toml [tool.setuptools] packages: {sorted(set(missing))}"
