"""What the end-to-end onboarding tests share: the installed `torch-fl` command and a `Session`
that runs commands in a scratch repository, as an agent following the skills would, timing each.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest


def torch_fl_command() -> str:
    installed = Path(sys.executable).with_name("torch-fl")
    found = str(installed) if installed.exists() else shutil.which("torch-fl")
    if found is None:
        pytest.skip("the torch-fl command is not installed")
    return found


class Session:
    """Runs commands in the test's scratch repository with FLAGOS_PLATFORM_PATH set, timing each
    (`timings`: label -> wall seconds, in the order run)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("FLAGOS_")}
        self.env["FLAGOS_PLATFORM_PATH"] = str(root / "plats")
        self.env["PYTHONUNBUFFERED"] = "1"
        self.timings: dict[str, float] = {}

    def run(
        self, label: str, argv: list[str], timeout: float, env: dict[str, str] | None = None
    ) -> subprocess.CompletedProcess:
        started = time.monotonic()
        try:
            return subprocess.run(
                argv, cwd=self.root, env={**self.env, **(env or {})}, capture_output=True, text=True, timeout=timeout
            )
        finally:
            self.timings[label] = round(self.timings.get(label, 0.0) + time.monotonic() - started, 1)

    def torch_fl(self, *args: str, timeout: float = 180, label: str | None = None) -> dict:
        """`torch-fl ARGS --json`, which must exit 0; its JSON document (timed as `label`, by
        default the command's first two words)."""
        result = self.run(label or " ".join(args[:2]), [torch_fl_command(), *args, "--json"], timeout)
        assert result.returncode == 0, (
            f"torch-fl {' '.join(args)}: exit {result.returncode}\n{result.stdout}\n{result.stderr[-4000:]}"
        )
        return json.loads(result.stdout)

    def python(
        self, label: str, code: str, *args: str, timeout: float = 240, env: dict[str, str] | None = None
    ) -> dict:
        """Run `code` (with `args` as sys.argv[1:]) in a fresh interpreter; it must exit 0 and print
        one JSON document as its last line."""
        result = self.run(label, [sys.executable, "-c", code, *args], timeout=timeout, env=env)
        assert result.returncode == 0, result.stdout + result.stderr[-4000:]
        return json.loads(result.stdout.strip().splitlines()[-1])

    def report(self) -> str:
        total = sum(self.timings.values())
        steps = ", ".join(f"{label} {seconds:.1f}" for label, seconds in self.timings.items())
        return f"timings (s): {steps}; total {total:.1f}"
