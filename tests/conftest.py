"""What every test folder shares: a fresh Python interpreter to run code in."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="session")
def run_python() -> Callable[..., subprocess.CompletedProcess]:
    """run_python(code, env={...}, check=True, timeout=300, preexec_fn=None): runs `code` in a fresh
    interpreter (this one) from the repository root and returns the completed process. An env value
    of None removes that variable; `preexec_fn` runs in the child before Python starts."""

    def run(
        code: str,
        env: dict[str, str | None] | None = None,
        check: bool = True,
        timeout: float = 300,
        preexec_fn: Callable[[], None] | None = None,
    ) -> subprocess.CompletedProcess:
        full_env = dict(os.environ)
        full_env["PYTHONUNBUFFERED"] = "1"
        for key, value in (env or {}).items():
            if value is None:
                full_env.pop(key, None)
            else:
                full_env[key] = value
        result = subprocess.run(
            [sys.executable, "-c", textwrap.dedent(code)],
            cwd=REPO,
            env=full_env,
            capture_output=True,
            text=True,
            timeout=timeout,
            preexec_fn=preexec_fn,
        )
        if check:
            assert result.returncode == 0, (
                f"exit {result.returncode}\n--- stdout\n{result.stdout}\n--- stderr\n{result.stderr}"
            )
        return result

    return run
