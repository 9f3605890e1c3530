"""Controller side: turn a worker that died into the case it died in (`crashed` or `timeout`).

The dead worker left its in-flight marker (which case, when it started, its time limit, where its
trace goes) and, unless it was killed from outside, a faulthandler trace: "Timeout (0:00:05)!"
from the watchdog, or "Fatal Python error: Segmentation fault" from a fatal signal.
"""

from __future__ import annotations

import json
import re
import time
from pathlib import Path
from typing import Any

from torch_fl.conformance.fingerprint import fingerprint
from torch_fl.conformance.recorder import inflight_path

_FRAME = re.compile(r'^\s*File "(?P<file>[^"]+)", line (?P<line>\d+) in (?P<name>\S+)')


def _trace_text(marker: dict[str, Any]) -> str:
    try:
        with open(marker["trace"], "rb") as f:
            f.seek(int(marker.get("trace_offset", 0)))
            return f.read(200_000).decode(errors="replace")
    except (OSError, KeyError, ValueError):
        return ""


def _threads(trace: str) -> list[list[str]]:
    """The trace split into per-thread blocks (each starts with its "Thread ..." header line)."""
    blocks: list[list[str]] = []
    for line in trace.splitlines():
        if line.startswith(("Thread 0x", "Current thread 0x")):
            blocks.append([line])
        elif blocks:
            blocks[-1].append(line)
    return blocks


def _innermost_frame(trace: str) -> str | None:
    """The innermost frame of the thread that ran the case.

    After a fatal signal that is faulthandler's "Current thread"; after a watchdog timeout (its
    own C thread) it is the thread running pytest, not xdist's I/O thread.
    """
    blocks = _threads(trace)
    current = [b for b in blocks if b[0].startswith("Current thread")]
    running = [b for b in blocks if any("_pytest" in line or "pluggy" in line for line in b)]
    for block in current + running + blocks:
        frames = [m for m in map(_FRAME.match, block[1:]) if m]
        if not frames:
            continue
        where = f"{Path(frames[0]['file']).name}:{frames[0]['line']} in {frames[0]['name']}"
        # Name the kernel too when the innermost frame is library code (ctypes, torch).
        own = next((m for m in frames if not _is_library(m["file"])), None)
        if own is not None and own is not frames[0]:
            where += f", called from {Path(own['file']).name}:{own['line']} in {own['name']}"
        return where
    return None


_OWN = (str(Path(__file__).resolve().parent) + "/", str(Path(__file__).resolve().parents[1] / "torch_fl") + "/")


def _is_library(path: str) -> bool:
    """Python's, torch's, torch_fl's or this suite's own code: not the kernel that failed."""
    return "/site-packages/" in path or "/lib/python3" in path or path.startswith(_OWN)


def _fatal_line(trace: str) -> str | None:
    for line in trace.splitlines():
        if line.startswith("Fatal Python error:"):
            return line.removeprefix("Fatal Python error:").strip()
    return None


def diagnose(run_dir: Path, worker: str, nodeid: str) -> dict[str, Any] | None:
    """The journal entry for the case `worker` was running in item `nodeid` when it died.

    None when the worker left no marker for that item (it died between cases of no item). The
    marker is consumed, so nothing stale is read again. The entry says `item_level` when the
    worker died outside the item's finer cases.
    """
    path = inflight_path(run_dir, worker)
    try:
        marker = json.loads(path.read_text() or "null")
    except (OSError, json.JSONDecodeError):
        return None
    path.unlink(missing_ok=True)
    if not marker or marker.get("item") != nodeid:
        return None
    if marker.get("restart"):
        return {"kind": "restart", "item": nodeid}  # ended itself after a sticky device error
    trace = _trace_text(marker)
    elapsed = time.time() - float(marker.get("started", time.time()))
    limit = float(marker.get("timeout", 0) or 0)
    frame = _innermost_frame(trace)
    timed_out = "Timeout (" in trace or (limit > 0 and elapsed >= limit * 0.95)
    if timed_out:
        status = "timeout"
        message = f"hung: no result after {limit:g} s; the worker was stopped"
    else:
        status = "crashed"
        fatal = _fatal_line(trace)
        message = (
            f"the worker process died ({fatal})"
            if fatal
            else "the worker process died without a Python trace (killed, or exit() in a kernel)"
        )
    if frame:
        message += f" in {frame}"
    case = marker["case"]
    return {
        "kind": "case",
        **case,
        "status": status,
        "message": message,
        "fingerprint": fingerprint(status, case.get("op"), message),
        "duration_s": round(elapsed, 3),
        "item": nodeid,
        "item_level": bool(marker.get("item_level")),
    }
