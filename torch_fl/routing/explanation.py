"""`torch_fl.explain("aten::mm")`: which route serves an op here, and why."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass
class PathStatus:
    path: str
    available: bool
    implements: bool
    validated_keys: list[str]
    note: str = ""
    limits: dict[str, dict[str, list[int]]] = field(default_factory=dict)
    """Gate key -> named extent -> [min, max or -1] this path serves (proven reach within the declared limits)."""


@dataclass
class Explanation:
    op: str
    platform: str
    candidates: list[str]
    source: str
    python_kernel: bool
    served_by: str
    paths: list[PathStatus] = field(default_factory=list)
    buckets: list[dict[str, Any]] = field(default_factory=list)
    calls: dict[str, int] = field(default_factory=dict)
    outside: dict[str, int] = field(default_factory=dict)
    """Calls a path's extent limits sent on to the next candidate, by path ("filter": those the C++
    route filter sent to native before any Python ran)."""
    gate: str = ""

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    def __str__(self) -> str:
        lines = [
            f"{self.op} on platform {self.platform} (record: {self.gate})",
            f"  candidates: {', '.join(self.candidates)}   (from {self.source})",
            f"  served by: {self.served_by}",
        ]
        for p in self.paths:
            state = "ok" if p.available and p.implements else "unavailable"
            keys = ", ".join(p.validated_keys) or "none"
            lines.append(f"  - {p.path}: {state}; allowed gate keys: {keys}{'; ' + p.note if p.note else ''}")
            for key, limits in p.limits.items():
                reach = ", ".join(f"{n} {lo}..{'' if hi < 0 else hi}" for n, (lo, hi) in limits.items())
                lines.append(f"      {key}: {reach}")
        for b in self.buckets:
            of = f" {b['dtype']}" if b.get("dtype") else ""
            lines.append(f"  bucket <= {b['max_numel']} elements{of} -> {b['choice']} {b.get('measured_us', '')}")
        if self.calls:
            lines.append("  calls: " + ", ".join(f"{k}={v}" for k, v in self.calls.items()))
        if self.outside:
            lines.append("  sent on by extent limits: " + ", ".join(f"{k}={v}" for k, v in self.outside.items()))
        return "\n".join(lines)


def normalize(op: str) -> str:
    """Accepts "mm", "aten::mm", "aten::mm.default", "add.Tensor"."""
    name = op if "::" in op else f"aten::{op}"
    return name[: -len(".default")] if name.endswith(".default") else name


def explain(op: str) -> Explanation:
    """Which candidates `op` has, where they come from, which gate keys each may serve, what runs."""
    from torch_fl.kernels.base import resolve
    from torch_fl.routing.runtime import router

    r = router()
    name = normalize(op)
    try:
        resolve(name)
    except AttributeError:
        raise ValueError(f"{op!r} is not an operator of this torch") from None
    plan = r.plan(name)
    statuses = []
    for path in plan.candidates:
        kernels = r.kernel_sets.get(path)
        note = getattr(kernels, "unavailable", None) or ("" if kernels else "not declared by the platform")
        if path in ("native", "cpu") or plan.bypass_gate or r.gate.forced:
            allowed = ["any"]
        else:
            allowed = sorted(r.gate.proven_keys(name, path))
        limits = {}
        if not plan.bypass_gate and r.gate.measures(name, path):
            for key in allowed:
                limits[key] = {
                    n: list(span) for n, span in r.gate.limits(name, path, "" if key == "any" else key).items()
                }
        statuses.append(
            PathStatus(
                path, kernels is not None, bool(kernels and kernels.implements(name)), allowed, note or "", limits
            )
        )
    python = name in r.installed
    if python:
        served = "Python route kernel: first candidate allowed for the call's gate key (and shape bucket)"
    else:
        served = "C++ native route (backing kernel on zero-copy aliases; cpu fallback if the backing lacks it)"
    route = r.table.ops.get(name)
    calls = {path: n for (o, path), n in r.counts.items() if o == name}
    outside = {path: n for (o, path), n in r.outside.items() if o == name and n}
    route_filter = r.installed[name].filter if python else None
    if route_filter is not None and route_filter.outside:
        outside["filter"] = route_filter.outside
    return Explanation(
        op=name,
        platform=r.descriptor.name,
        candidates=plan.candidates,
        source=plan.source,
        python_kernel=python,
        served_by=served,
        paths=statuses,
        buckets=[b.model_dump(exclude_none=True) for b in route.buckets] if route else [],
        calls=calls,
        outside=outside,
        gate=r.gate.state,
    )
