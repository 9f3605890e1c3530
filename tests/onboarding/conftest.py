"""Shared set-up for the onboarding tests: a clean platform environment and a scratch repository.

Every test writes into its own temporary folder (a FLAGOS_PLATFORM_PATH folder and a repository
root), never into the checkout's platforms/.
"""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for var in ("FLAGOS_PLATFORM", "FLAGOS_PLATFORM_PATH", "FLAGOS_ALLOW_UNVALIDATED", "FLAGOS_ROUTES"):
        monkeypatch.delenv(var, raising=False)


@pytest.fixture
def repo(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty repository root (the current directory); its plats/ folder is on FLAGOS_PLATFORM_PATH."""
    root = tmp_path / "repo"
    (root / "plats").mkdir(parents=True)
    monkeypatch.setenv("FLAGOS_PLATFORM_PATH", str(root / "plats"))
    monkeypatch.chdir(root)
    return root
