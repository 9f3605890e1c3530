"""The built wheel ships the descriptors and lists them in a fresh environment without torch."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from torch_fl.platform.discovery import discover, shipped_root

REPO = Path(__file__).resolve().parents[2]
CLI_DEPS = ["pydantic", "pyyaml", "ruamel.yaml", "typer", "rich"]


def run(*cmd: str, cwd: Path, timeout: int = 120) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("FLAGOS_", "PYTHON", "VIRTUAL_ENV"))}
    out = subprocess.run(list(cmd), cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert out.returncode == 0, f"{' '.join(cmd)}\n{out.stdout}\n{out.stderr}"
    return out


def source_tree(dest: Path) -> Path:
    """A copy of the files git would ship (tracked and not ignored), so the build leaves the checkout alone."""
    listed = run("git", "ls-files", "--cached", "--others", "--exclude-standard", "-z", cwd=REPO).stdout
    for rel in filter(None, listed.split("\0")):
        src = REPO / rel
        if src.is_file():
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / rel)
    return dest


@pytest.mark.slow
def test_wheel_lists_shipped_platforms_without_torch(tmp_path):
    if shutil.which("git") is None or not (REPO / ".git").exists():
        pytest.skip("needs a git checkout to list the files to build")
    tree = source_tree(tmp_path / "src")
    run(sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(tmp_path / "dist"), str(tree), cwd=tmp_path)
    wheel = next((tmp_path / "dist").glob("torch_fl-*.whl"))

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
