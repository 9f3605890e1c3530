"""The built wheel ships the descriptors and lists them in a fresh environment without torch."""

from __future__ import annotations

import json
import os
import sys

import pytest
from wheel_helpers import build_wheel, run

from torch_fl.platform.discovery import discover, shipped_root

pytestmark = pytest.mark.slow  # builds a wheel

CLI_DEPS = ["pydantic", "pyyaml", "ruamel.yaml", "typer", "rich"]


@pytest.mark.slow
def test_wheel_lists_shipped_platforms_without_torch(tmp_path):
    wheel = build_wheel(tmp_path)

    venv = tmp_path / "venv"
    run(sys.executable, "-m", "venv", str(venv), cwd=tmp_path)
    bindir = venv / ("Scripts" if os.name == "nt" else "bin")
    pip = [str(bindir / "python"), "-m", "pip", "install", "-q", "--disable-pip-version-check"]
    run(*pip, *CLI_DEPS, cwd=tmp_path, timeout=300)
    run(*pip, "--no-deps", str(wheel), cwd=tmp_path)

    workdir = tmp_path / "elsewhere"
    workdir.mkdir()
    out = run(str(bindir / "torch-fl"), "platforms", "list", "--json", cwd=workdir)
    data = json.loads(out.stdout)
    shipped = {name for name, s in discover(path_env="").items() if s.origin == "shipped"}
    listed = {p["name"]: p for p in data["platforms"]}
    assert set(listed) == shipped
    assert all(p["origin"] == "shipped" for p in listed.values())
    # a platform without records is unvalidated; one with a record shows that record's state
    for name, p in listed.items():
        has_records = (shipped_root() / name / "records").is_dir()
        assert (p["status"] == "unvalidated") != has_records, (name, p["status"])
    assert all(str(venv) in p["directory"] for p in listed.values())
    assert data["torch"] is None
    assert data["active"]["name"] == "host_ref"
