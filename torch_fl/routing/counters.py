"""Per op x path call counters: Python routes count in the router, C++ routes in the core."""

from __future__ import annotations

from dataclasses import asdict, dataclass


@dataclass(frozen=True)
class RouteCount:
    op: str
    path: str
    calls: int


def route_stats() -> list[RouteCount]:
    """Every (op, path) that served at least one call since start (or the last reset)."""
    from torch_fl.routing.runtime import router
    from torch_fl.runtime import core

    rows = [RouteCount(op, path, n) for (op, path), n in router().counts.items() if n]
    for op, (native, cpu) in core().route_counts().items():
        if native:
            rows.append(RouteCount(op, "native", native))
        if cpu:
            rows.append(RouteCount(op, "cpu", cpu))
    return sorted(rows, key=lambda r: (-r.calls, r.op, r.path))


def reset_stats() -> None:
    from torch_fl.routing.runtime import router
    from torch_fl.runtime import core

    router().counts.clear()
    core().reset_route_counts()


def as_dicts(rows: list[RouteCount]) -> list[dict[str, object]]:
    return [asdict(r) for r in rows]
