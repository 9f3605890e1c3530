"""Building the package's wheel from a copy of the checkout, as the release does."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


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


def build_wheel(tmp_path: Path) -> Path:
    """The wheel built from a copy of this checkout (skips where there is no git checkout)."""
    if shutil.which("git") is None or not (REPO / ".git").exists():
        pytest.skip("needs a git checkout to list the files to build")
    tree = source_tree(tmp_path / "src")
    dist = tmp_path / "dist"
    run(
        sys.executable,
        "-m",
        "pip",
        "wheel",
        "--no-deps",
        "--no-build-isolation",
        "-q",
        "-w",
        str(dist),
        str(tree),
        cwd=tmp_path,
        timeout=300,
    )
    return next(dist.glob("torch_fl-*.whl"))
