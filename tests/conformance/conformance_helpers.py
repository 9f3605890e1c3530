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
    """Run `torch-fl conformance run ... --json` and return its JSON (asserting it printed one), with
    the command's exit status added as `cli_exit`."""
    proc = subprocess.run(
        [*cli_command(), "conformance", "run", *args, "--json"],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    try:
        data = json.loads(proc.stdout)
    except json.JSONDecodeError:
        pytest.fail(f"no JSON from torch-fl (exit {proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    data["cli_exit"] = proc.returncode  # not part of the CLI's JSON: the exit status it ended with
    return data


def cases_by_id(record_file: Path) -> dict[str, dict[str, Any]]:
    """Every case of a record (its evidence file), by id."""
    from torch_fl.platform.record import load_evidence

    cases = [c.model_dump() for c in load_evidence(Path(record_file))]
    ids = [c["id"] for c in cases]
    assert len(ids) == len(set(ids)), "a case appears twice in the record"
    return {c["id"]: c for c in cases}
