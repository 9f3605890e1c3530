"""Starting the extra processes some suites need (distributed ranks, a reference run), with limits.

Every child gets a deadline and is killed past it, so a hung collective fails its case instead of
holding the worker until the case watchdog ends the whole worker.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any


def child_env(changes: dict[str, str | None]) -> dict[str, str]:
    """This process's environment for a child, with `changes` applied (None removes a variable)."""
    env = dict(os.environ, PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1")
    for key, value in changes.items():
        if value is None:
            env.pop(key, None)
        else:
            env[key] = value
    return env


def run_ranks(module: str, case: str, world: int, timeout: float) -> list[dict[str, Any]]:
    """`python -m module case rank world init out` for each rank; each rank's JSON result.

    Raises AssertionError naming the rank and its output tail when a rank fails or hangs.
    """
    with tempfile.TemporaryDirectory(prefix="flagos-ranks-") as tmp:
        init_file = os.path.join(tmp, "rendezvous")
        outs = [os.path.join(tmp, f"rank{r}.json") for r in range(world)]
        procs = [
            subprocess.Popen(
                [sys.executable, "-m", module, case, str(r), str(world), init_file, outs[r]],
                env=child_env({}),
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
                cwd=tmp,
            )
            for r in range(world)
        ]
        logs = [""] * world
        try:
            for r, p in enumerate(procs):
                try:
                    logs[r] = p.communicate(timeout=timeout)[0]
                except subprocess.TimeoutExpired:
                    raise AssertionError(
                        f"rank {r} of {case} did not finish within {timeout:g} s (a hung collective?)"
                    ) from None
        finally:
            for p in procs:
                if p.poll() is None:
                    p.kill()
                    p.wait()
        results = []
        for r, p in enumerate(procs):
            if p.returncode != 0 or not os.path.exists(outs[r]):
                tail = " | ".join(logs[r].strip().splitlines()[-8:])
                raise AssertionError(f"rank {r} of {case} exited with {p.returncode}: {tail[-1500:]}")
            results.append(json.loads(Path(outs[r]).read_text()))
        return results


def run_script(path: Path, args: list[str], env: dict[str, str | None], timeout: float) -> dict[str, Any]:
    """`python path args... OUT_JSON` in a fresh interpreter; its JSON result."""
    with tempfile.TemporaryDirectory(prefix="flagos-ref-") as tmp:
        out = os.path.join(tmp, "out.json")
        proc = subprocess.run(
            [sys.executable, str(path), *args, out],
            env=child_env(env),
            capture_output=True,
            text=True,
            timeout=timeout,
            cwd=tmp,
        )
        if proc.returncode != 0 or not os.path.exists(out):
            tail = " | ".join((proc.stdout + proc.stderr).strip().splitlines()[-8:])
            raise AssertionError(f"{path.name} exited with {proc.returncode}: {tail[-1500:]}")
        return json.loads(Path(out).read_text())
