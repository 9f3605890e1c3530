"""Shared helpers for the conformance suite's own tests: running `torch-fl conformance run` for real."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

HERE = Path(__file__).resolve().parent
FIXTURES = HERE / "fixtures"


def cli_command() -> list[str]:
    """The installed `torch-fl` script, else its entry point run by this interpreter."""
    script = Path(sys.executable).with_name("torch-fl")
    if script.exists():
        return [str(script)]
    return [sys.executable, "-c", "from torch_fl.cli import main; main()"]


def run_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("FLAGOS_", "PYTEST_"))}
    env.update(extra)
    return env


def conformance(args: list[str], env: dict[str, str], timeout: float = 600) -> dict[str, Any]:
    """Run `torch-fl conformance run ... --json` and return its JSON (asserting it printed one)."""
    proc = subprocess.run(
        [*cli_command(), "conformance", "run", *args, "--json"], env=env, capture_output=True, text=True, timeout=timeout
    )
    try:
        return json.loads(proc.stdout)
    except json.JSONDecodeError:
        pytest.fail(f"no JSON from torch-fl (exit {proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")


def cases_by_id(record_file: Path) -> dict[str, dict[str, Any]]:
    record = json.loads(Path(record_file).read_text())
    ids = [c["id"] for c in record["cases"]]
    assert len(ids) == len(set(ids)), "a case appears twice in the record"
    return {c["id"]: c for c in record["cases"]}
