"""Installs the active platform's routes (placeholder until route tables land)."""
from __future__ import annotations


def install(active) -> None:  # noqa: ANN001
    return None
