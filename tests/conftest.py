"""What every test folder shares: a fresh Python interpreter to run code in."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import pytest

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="session")
def load_bench() -> Callable[[str], ModuleType]:
    """load_bench(name): bench/NAME.py as a module, with bench/ on sys.path as when the script runs
    (the scripts import their siblings by name)."""

    def load(name: str) -> ModuleType:
        bench = str(REPO / "bench")
        if bench not in sys.path:
            sys.path.insert(0, bench)
        spec = importlib.util.spec_from_file_location(f"bench_{name}", REPO / "bench" / f"{name}.py")
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module  # dataclasses look their module up while the class is made
        spec.loader.exec_module(module)
        return module

    return load


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
