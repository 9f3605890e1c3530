"""The shipped list of captured model calls (conformance/capture.py makes it), and how much of
each model the `captured` suite judged. No torch here: the run's controller reads it too."""

from __future__ import annotations

import functools
import gzip
import json
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

CAPTURED = Path(__file__).with_name("zoo_calls.json.gz")
"""The shipped list (regenerate: `torch-fl conformance capture`)."""
JUDGED = frozenset({"passed", "failed", "error", "crashed", "timeout"})


@functools.lru_cache(maxsize=4)
def load(path: Path = CAPTURED) -> dict[str, Any]:
    """The captured calls (none when no list is shipped). Read once per process: a run's record
    is merged every few seconds, and the suite's items each look calls up in it."""
    if not Path(path).is_file():
        return {"calls": [], "calls_by_model": {}}
    data: dict[str, Any] = json.loads(gzip.decompress(Path(path).read_bytes()))
    return data


def call_index(case_id: str) -> int | None:
    """`captured/<op>/<path>/<n>[/<key>]` -> n."""
    parts = case_id.split("/")
    return int(parts[3]) if len(parts) >= 4 and parts[0] == "captured" and parts[3].isdigit() else None


def coverage(cases: Iterable[Mapping[str, Any]], calls: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per model and mode (`llama/train`): of its calls (counted as often as it makes them) those a
    gated path could serve (the suite has a case for them) and those judged on one (passed or
    failed, not skipped), with the judged share of the first."""
    gated: set[int] = set()
    judged: set[int] = set()
    for case in cases:
        index = call_index(str(case.get("id", "")))
        if index is None:
            continue
        gated.add(index)
        if case.get("status") in JUDGED:
            judged.add(index)
    out: dict[str, dict[str, Any]] = {}
    for index, call in enumerate(calls):
        for label, count in call.get("models", {}).items():
            row = out.setdefault(label, {"calls": 0, "gated": 0, "judged": 0})
            row["calls"] += count
            row["gated"] += count if index in gated else 0
            row["judged"] += count if index in judged else 0
    for row in out.values():
        row["judged_share"] = round(row["judged"] / row["gated"], 4) if row["gated"] else None
    return dict(sorted(out.items()))
