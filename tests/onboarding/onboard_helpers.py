"""Helpers of the onboarding tests (a module of its own: `conftest` is a name every test folder uses)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from types import ModuleType
from typing import Any

from typer.testing import CliRunner

from torch_fl.cli import _register, app
from torch_fl.onboarding.onboard import OnboardReport, OnboardRequest, onboard

_register()
runner = CliRunner()


def make(repo: Path, chip: str = "demo_chip", **options: Any) -> OnboardReport:
    """Onboard `chip` into repo/plats (the API the CLI calls)."""
    return onboard(OnboardRequest(chip, root=repo, platforms_dir=repo / "plats", **options))


def cli(*args: str, code: int | None = 0) -> Any:
    """Run `torch-fl ARGS --json` in-process; check the exit code (None: any) and return the JSON."""
    result = runner.invoke(app, [*args, "--json"])
    if code is not None:
        assert result.exit_code == code, f"exit {result.exit_code}\n{result.output}\n{result.exception!r}"
    return json.loads(result.stdout)


def snapshot(folder: Path) -> dict[str, bytes]:
    """Every file below `folder` with its bytes (to show that nothing changed)."""
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def vendor_module(folder: Path) -> ModuleType:
    """Import a platform's vendor_kernels.py afresh, as a module of its own."""
    spec = importlib.util.spec_from_file_location(f"vendor_under_test_{folder.name}", folder / "vendor_kernels.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
