"""The declared constraint that would exclude a failure group: what `triage` offers a vendor to accept.

A failing case refuses its op x path at every size unless the descriptor declares a limit that puts
the case wholly outside (torch_fl.platform.record.outside_constraints). Given the failing cases of
one op x path and the passing ones, this finds the one-dimension limit (`max` or `min` on a named
extent) that excludes every failing call and keeps the most passing cases inside. It only reads
the record: accepting it is the vendor's edit of platform.yaml, and the next run proves the kernel
inside the limit and probes both sides of it.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, NamedTuple

from torch_fl.platform.extents import GENERIC_DIMS, dims_of
from torch_fl.platform.record import GATED_PATHS, Case


class Proposal(NamedTuple):
    """`op` on `path` limited along `dim` to `bound` (`side` "max" or "min"), keeping `keeps` of `passing`."""

    op: str
    path: str
    dim: str
    side: str
    bound: int
    excludes: int
    keeps: int
    passing: int
    alike: tuple[tuple[str, str, int], ...] = ()
    """Other limits (dim, side, bound) that keep as many passing cases: the evidence does not tell
    them apart (a case that varied several dimensions at once failed); a one-dimension sweep does."""

    def as_dict(self) -> dict[str, Any]:
        limit = f"{{{self.dim}: {{{self.side}: {self.bound}}}}}"
        return {
            **self._asdict(),
            "alike": [{"dim": d, "side": s, "bound": b} for d, s, b in self.alike],
            "yaml": f"kernels:\n  {self.path}:\n    constraints:\n      {self.op}: {limit}",
        }


def _spans(case: Case, dim: str) -> list[list[int]] | None:
    """The [least, most] of `dim` over each key the case made a call with; None when a key lacks it."""
    if not case.keys or any(dim not in case.extents.get(k, {}) for k in case.keys):
        return None
    return [case.extents[k][dim] for k in case.keys]


def _candidates(op: str, failing: list[Case]) -> Iterable[tuple[str, str, int]]:
    for dim in dims_of(op):
        spans = [_spans(c, dim) for c in failing]
        if any(s is None for s in spans):
            continue
        lows = [lo for per_case in spans if per_case for lo, _ in per_case]
        highs = [hi for per_case in spans if per_case for _, hi in per_case]
        if min(lows) > 1:
            yield dim, "max", min(lows) - 1
        yield dim, "min", max(highs) + 1


def _inside(case: Case, dim: str, side: str, bound: int) -> bool:
    spans = _spans(case, dim)
    if not spans:
        return False
    return all((hi <= bound) if side == "max" else (lo >= bound) for lo, hi in spans)


def propose(op: str, path: str, failing: list[Case], cases: list[Case]) -> Proposal | None:
    """The limit on `op` x `path` that puts every case of `failing` outside and keeps the most passing
    cases of `cases` inside; None when no single limit does (a case died before its first call,
    or every limit that excludes the failures also excludes every pass).

    Ties go to an op's own dimensions (K of a matmul) over the generic ones, then to `max`."""
    if path not in GATED_PATHS or not failing:
        return None
    passing = [c for c in cases if c.op == op and c.path == path and c.status == "passed"]
    ranked = []
    for dim, side, bound in _candidates(op, failing):
        keeps = sum(_inside(c, dim, side, bound) for c in passing)
        if keeps:
            ranked.append(((keeps, dim not in GENERIC_DIMS, side == "max"), (dim, side, bound)))
    if not ranked:
        return None
    ranked.sort(key=lambda r: r[0], reverse=True)
    (keeps, *_), (dim, side, bound) = ranked[0]
    alike = tuple(limit for rank, limit in ranked[1:] if rank[0] == keeps)
    return Proposal(op, path, dim, side, bound, len(failing), keeps, len(passing), alike)


def proposals(failing: list[Case], cases: list[Case]) -> list[dict[str, Any]]:
    """One proposal per op x gated path among `failing` (a failure group), where one exists."""
    by_target: dict[tuple[str, str], list[Case]] = {}
    for case in failing:
        if case.op and case.path in GATED_PATHS:
            by_target.setdefault((case.op, case.path), []).append(case)
    found = (propose(op, path, group, cases) for (op, path), group in sorted(by_target.items()))
    return [p.as_dict() for p in found if p is not None]
