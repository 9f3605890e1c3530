"""Where a conformance run's time went: the `cost` part of a record's summary.

A board's time is scarce, so a run says what it spent: case seconds by suite, path and op (the
heaviest first), and what items spent outside their cases (building inputs, activating the
platform, compiling the native reference). Worker seconds are the run's wall time times its
workers; what no item used is start-up, waiting and restarts after crashes.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from typing import Any

TOP_OPS = 15


def cost(
    cases: Iterable[Mapping[str, Any]], item_seconds: Mapping[str, float], wall_s: float, workers: int
) -> dict[str, Any]:
    """The cost summary of a run's cases and finished items (`item_seconds`: item -> its seconds)."""
    by_suite: Counter[str] = Counter()
    by_path: Counter[str] = Counter()
    by_op: Counter[str] = Counter()
    per_item: Counter[str] = Counter()
    count_by_path: Counter[str] = Counter()
    for case in cases:
        seconds = float(case.get("duration_s") or 0.0)
        path = case.get("path") or "-"
        by_suite[case.get("suite") or "-"] += seconds
        by_path[path] += seconds
        count_by_path[path] += 1
        if case.get("op"):
            by_op[f"{case['op']} on {path}"] += seconds
        if case.get("item"):
            per_item[case["item"]] += seconds
    in_items = sum(item_seconds.values())
    outside = sum(max(0.0, s - per_item.get(item, 0.0)) for item, s in item_seconds.items())
    worker_s = wall_s * max(1, workers)
    return {
        "wall_s": round(wall_s, 1),
        "worker_s": round(worker_s, 1),
        "case_s": round(sum(by_suite.values()), 1),
        "items_outside_cases_s": round(outside, 1),
        "idle_or_starting_s": round(max(0.0, worker_s - in_items), 1) if item_seconds else None,
        "by_suite_s": _rounded(by_suite),
        "by_path_s": _rounded(by_path),
        "mean_case_s_by_path": {p: round(by_path[p] / n, 4) for p, n in sorted(count_by_path.items()) if n},
        "top_ops_s": dict((op, round(s, 1)) for op, s in by_op.most_common(TOP_OPS)),
    }


def _rounded(counter: Counter[str]) -> dict[str, float]:
    return {k: round(v, 1) for k, v in counter.most_common()}
