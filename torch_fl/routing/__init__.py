"""Routing: per-op choice among native, flaggems, vendor, emulated and cpu paths.

Public API: `set_route(op, paths)`, `clear_route(op)`, `forced(op, path)`, `explain(op)`,
`stats()`, `reset_stats()`, `strict(on)`. The submodules that need torch are imported on first
use, so `torch_fl.routing.table` (route files) stays usable without torch.
"""

from __future__ import annotations

import importlib
from typing import Any

_LAZY = {
    "Explanation": ("torch_fl.routing.explanation", "Explanation"),
    "explain": ("torch_fl.routing.explanation", "explain"),
    "normalize": ("torch_fl.routing.explanation", "normalize"),
    "forced": ("torch_fl.routing.runtime", "forced"),
    "router": ("torch_fl.routing.runtime", "router"),
    "RouteCount": ("torch_fl.routing.counters", "RouteCount"),
    "reset_stats": ("torch_fl.routing.counters", "reset_stats"),
    "stats": ("torch_fl.routing.counters", "route_stats"),
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        module, attribute = _LAZY[name]
        return getattr(importlib.import_module(module), attribute)
    raise AttributeError(f"module 'torch_fl.routing' has no attribute {name!r}")


def set_route(op: str, paths: list[str]) -> None:
    """Use `paths` (in order, still gated by conformance) for `op` in this process."""
    from torch_fl.routing.explanation import normalize
    from torch_fl.routing.runtime import router

    router().set_route(normalize(op), list(paths))


def clear_route(op: str) -> None:
    from torch_fl.routing.explanation import normalize
    from torch_fl.routing.runtime import router

    router().clear_route(normalize(op))


def strict(on: bool = True) -> None:
    """Make a failing route raise instead of falling back to the next candidate."""
    from torch_fl.routing.runtime import router

    router().strict = on


__all__ = [
    "Explanation",
    "RouteCount",
    "clear_route",
    "explain",
    "forced",
    "reset_stats",
    "set_route",
    "stats",
    "strict",
]
