"""Where `torch-fl onboard` writes, and what the CI job needs to know about that place.

Two places, one rule: `--root` is the repository the CI workflow belongs to (default: the current
directory); the platform folder is `<platforms-dir>/<name>`, where `--platforms-dir` defaults to
`<root>/platforms`. In a torch-fl checkout that default makes a shipped platform; any other
platforms dir is a FLAGOS_PLATFORM_PATH folder, and the workflow sets that variable for its run.
"""

from __future__ import annotations

import importlib.metadata
import os
import re
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Layout:
    root: Path
    platforms_dir: Path
    name: str

    @property
    def platform_dir(self) -> Path:
        return self.platforms_dir / self.name

    @property
    def workflow_path(self) -> Path:
        return self.root / ".github" / "workflows" / f"flagos-{self.name}.yml"

    @property
    def in_checkout(self) -> bool:
        """True when root is a torch-fl checkout and the platform is one of its shipped platforms."""
        return is_torch_fl_checkout(self.root) and same_dir(self.platforms_dir, self.root / "platforms")

    def relative(self, path: Path) -> str:
        """`path` relative to the repository root (posix), or absolute when it lies outside it."""
        try:
            return path.resolve().relative_to(self.root.resolve()).as_posix()
        except ValueError:
            return str(path.resolve())

    def inside_root(self, path: Path) -> bool:
        return not Path(self.relative(path)).is_absolute()

    def platform_path_env(self) -> str | None:
        """FLAGOS_PLATFORM_PATH for the CI job (None: the platform ships with the checked-out torch-fl)."""
        if self.in_checkout:
            return None
        if self.inside_root(self.platforms_dir):
            return "${{ github.workspace }}/" + self.relative(self.platforms_dir)
        return str(self.platforms_dir.resolve())

    def torch_fl_install(self) -> str:
        """What the CI job pip-installs for torch-fl: the checkout itself, or this release."""
        if is_torch_fl_checkout(self.root):
            return "-e ."
        try:
            version = importlib.metadata.version("torch-fl")
        except importlib.metadata.PackageNotFoundError:
            return "torch-fl"
        return f'"torch-fl=={version}"'


def same_dir(a: Path, b: Path) -> bool:
    """Do the two paths name the same folder (after resolving links and case on case-blind systems)?"""
    return os.path.normcase(a.resolve()) == os.path.normcase(b.resolve())


def is_torch_fl_checkout(root: Path) -> bool:
    """Does `root` hold torch-fl's own pyproject.toml (then CI installs it from the checkout)?"""
    try:
        text = (root / "pyproject.toml").read_text(encoding="utf-8")
    except OSError:
        return False
    return re.search(r'^name\s*=\s*"torch-fl"\s*$', text, re.MULTILINE) is not None


def make_layout(name: str, root: Path | None = None, platforms_dir: Path | None = None) -> Layout:
    root = Path(root) if root is not None else Path.cwd()
    return Layout(
        root=root, platforms_dir=Path(platforms_dir) if platforms_dir is not None else root / "platforms", name=name
    )
