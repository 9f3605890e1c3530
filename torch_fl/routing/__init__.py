"""Routing: per-op choice among native, flaggems, vendor, emulated and cpu paths.

Public API: `set_route(op, paths)`, `clear_route(op)`, `forced(op, path)`, `explain(op)`,
`stats()`, `reset_stats()`, `strict(on)`.
"""
from __future__ import annotations

from torch_fl.routing.explain import Explanation, explain, normalize
from torch_fl.routing.router import forced, router
from torch_fl.routing.stats import RouteCount, reset_stats, route_stats as stats


def set_route(op: str, paths: list[str]) -> None:
    """Use `paths` (in order, still gated by conformance) for `op` in this process."""
    router().set_route(normalize(op), list(paths))


def clear_route(op: str) -> None:
    router().clear_route(normalize(op))


def strict(on: bool = True) -> None:
    """Make a failing route raise instead of falling back to the next candidate."""
    router().strict = on


__all__ = [
    "Explanation", "RouteCount", "clear_route", "explain", "forced", "reset_stats", "set_route", "stats", "strict",
]
