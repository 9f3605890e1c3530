"""Docs that are generated from the code stay in step with it."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_environment_table_matches_the_declarations():
    # The table lists every variable the code declares through torch_fl.env (`torch-fl env --markdown`).
    generated = subprocess.run(
        [sys.executable, "-c", "from torch_fl.cli import main; main()",
         "env", "--markdown"],
        capture_output=True, text=True, check=True,
    ).stdout
    documented = (ROOT / "docs" / "environment.md").read_text()
    assert generated in documented, "docs/environment.md is stale: regenerate it with `torch-fl env --markdown`"
