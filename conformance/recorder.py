"""Worker side of a run: records cases to the journal, marks what is in flight, ends hangs.

Before a case runs, its description is written to an in-flight file named after the pytest item,
and a watchdog is armed: `faulthandler.dump_traceback_later(exit=True)` runs in a C thread that
needs no GIL, so even a kernel spinning in C with the GIL held is stopped. It writes the stacks
to this worker's trace file and exits the process; pytest-xdist then reports the item as crashed
and starts a new worker, and the controller (`crash.py`) turns the in-flight file and the trace
into the case's `timeout` or `crashed` entry. A segfault takes the same path (faulthandler writes
the fatal-signal trace to the same file). Markers are per worker, so the controller finds the
one of the worker xdist says died.
"""

from __future__ import annotations

import faulthandler
import json
import os
import time
import traceback
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import pytest

from torch_fl.conformance import journal
from torch_fl.conformance.fingerprint import fingerprint
from torch_fl.platform.extents import merge
from torch_fl.platform.record import FAILING, Constraints, outside_constraints

# Errors after which a CUDA context is unusable: every later case in the process would fail too.
STICKY_ERRORS = (
    "illegal memory access",
    "device-side assert",
    "unspecified launch failure",
    "misaligned address",
    "CUDA error: an illegal instruction",
    "CUBLAS_STATUS_EXECUTION_FAILED",
    "uncorrectable ECC error",
)


def inflight_path(run_dir: Path, worker: str) -> Path:
    """The in-flight marker of one worker (rewritten in place before each case)."""
    return run_dir / "inflight" / f"{worker}.json"


def trace_path(run_dir: Path, worker: str) -> Path:
    """Where one worker's faulthandler writes (fatal signals, watchdog timeouts)."""
    return run_dir / "inflight" / f"{worker}.trace"


@dataclass
class CaseInfo:
    """The identity of a case and, once it ran, its result (the record's Case fields).

    `keys` are the gate keys of the calls the case made on its path (the router reports them),
    in first-seen order, each with the phases (whatever the suite named with `Recorder.phase`)
    it was seen in; `extents` the span of those calls' named extents per key (how far a pass
    proves). A suite that judges keys apart sets `by_key`: the case is then journaled as one case
    per key, `<id>/<key>`, each with its own status.
    """

    id: str
    suite: str
    op: str | None = None
    dtype: str | None = None
    path: str | None = None
    status: str = "passed"
    message: str = ""
    duration_s: float = 0.0
    notes: list[str] = field(default_factory=list)
    keys: dict[str, set[Any]] = field(default_factory=dict)
    extents: dict[str, dict[str, list[int]]] = field(default_factory=dict)  # key -> extent -> [least, most]
    by_key: dict[str, tuple[str, str]] | None = None
    vetoes_only: bool = False  # a pass of this case proves no key (it checked too loosely); a failure vetoes

    def fail(self, message: str) -> None:
        self.status, self.message = "failed", message

    def skip(self, message: str) -> None:
        self.status, self.message = "skipped", message

    def unjudged(self, message: str) -> None:
        self.status, self.message = "unjudged", message

    def entry(self, item: str) -> dict[str, Any]:
        data = {k: v for k, v in asdict(self).items() if k not in ("notes", "by_key", "vetoes_only")}
        data["keys"] = [] if self.vetoes_only and self.status == "passed" else list(self.keys)
        data["extents"] = {k: self.extents[k] for k in data["keys"] if k in self.extents}
        if self.notes and self.status == "passed" and not self.message:
            data["message"] = "; ".join(self.notes)
        data["duration_s"] = round(self.duration_s, 4)
        data["fingerprint"] = fingerprint(self.status, self.op, self.message) if self.status != "passed" else None
        return {"kind": "case", **data, "item": item}

    def entries(self, item: str) -> list[dict[str, Any]]:
        """The journal entries of this case: one, or one per key when judged by key."""
        whole = self.entry(item)
        if self.by_key is None or self.status != "passed":
            return [whole]
        out = []
        for key, (status, message) in self.by_key.items():
            out.append(
                {
                    **whole,
                    "id": f"{self.id}/{key}",
                    "keys": [key],
                    "extents": {key: self.extents[key]} if key in self.extents else {},
                    "status": status,
                    "message": message,
                    "fingerprint": fingerprint(status, self.op, message) if status != "passed" else None,
                    "run": self.id,
                }
            )
        return out


def exception_message(exc: BaseException) -> str:
    """`Type: message (file:line in function)`, pointing at the innermost frame."""
    frames = traceback.extract_tb(exc.__traceback__)
    where = f" ({Path(frames[-1].filename).name}:{frames[-1].lineno} in {frames[-1].name})" if frames else ""
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text[:1500]}{where}"


class Recorder:
    """One per worker process."""

    def __init__(
        self,
        journal_file: Path,
        run_dir: Path,
        worker: str,
        case_timeout: float,
        item_timeout: float,
        warmup_timeout: float,
        warmup_paths: frozenset[str] = frozenset(),
    ) -> None:
        self.journal_file = journal_file
        self.run_dir = run_dir
        self.case_timeout = case_timeout
        self.item_timeout = item_timeout
        self.warmup_timeout = warmup_timeout
        self.warmup_paths = warmup_paths
        (run_dir / "inflight").mkdir(parents=True, exist_ok=True)
        self.worker = worker
        self.trace_path = trace_path(run_dir, worker)
        self._trace = open(self.trace_path, "w")
        self._marker = os.open(inflight_path(run_dir, worker), os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
        faulthandler.enable(file=self._trace, all_threads=True)
        self._reader = journal.Reader(journal_file)
        self.done_cases: dict[str, str] = {}
        self.failed_keys: set[tuple[str, str, str]] = set()  # (op, path, gate key) of failing cases so far
        self.constraints: Constraints = {}  # the descriptor's: failures outside them refuse nothing
        self.done_items: set[str] = set()
        self._warm: set[tuple[str | None, str | None, str | None]] = set()
        self.item: str | None = None
        self.item_case: CaseInfo | None = None
        self.item_limit = item_timeout
        self.used_cases = False
        self.current: CaseInfo | None = None
        self._phase: Any = None
        self._deadline = 0.0
        self._started, self._limit = 0.0, 0.0
        self._item_started = 0.0
        self._in_flight: str | None = None  # the gate key of the call running now
        self._in_flight_extents: dict[str, int] = {}
        self.refresh()

    # ---- what is already recorded (resume, and the re-run of an item after a crash)
    def refresh(self) -> None:
        for entry in self._reader.new():
            if entry.get("kind") == "case":
                self._note_failure(entry)
                self.done_cases[entry["id"]] = entry.get("status", "")
                if entry.get("run"):
                    self.done_cases[entry["run"]] = entry.get("status", "")
            elif entry.get("kind") == "item":
                self.done_items.add(entry["item"])

    def _note_failure(self, entry: dict[str, Any]) -> None:
        if entry.get("status") in FAILING and entry.get("op") and entry.get("path"):
            if outside_constraints(entry, self.constraints):
                return
            self.failed_keys.update((entry["op"], entry["path"], key) for key in entry.get("keys") or ())

    def is_done(self, case_id: str) -> bool:
        return case_id in self.done_cases

    # ---- in-flight marker and watchdog
    def _mark(
        self,
        case: CaseInfo,
        timeout: float,
        item_level: bool = False,
        since: float | None = None,
        limit: float | None = None,
    ) -> None:
        """Point the marker at `case` and arm the watchdog for `timeout` s; a re-mark within a case
        keeps the case's start (`since`) and limit, which the report of a hang states."""
        assert self.item is not None
        marker = {
            "item": self.item,
            # the key of the call in flight: a kernel that kills the process is charged with that key
            "case": {
                "id": case.id,
                "suite": case.suite,
                "op": case.op,
                "dtype": case.dtype,
                "path": case.path,
                "keys": [self._in_flight] if self._in_flight in case.keys else [],
                # and with that call's own extents, which a declared constraint may put outside
                "extents": (
                    {self._in_flight: {n: [v, v] for n, v in self._in_flight_extents.items()}}
                    if self._in_flight in case.keys
                    else {}
                ),
            },
            "item_level": item_level,
            "started": since if since is not None else time.time(),
            "timeout": limit if limit is not None else timeout,
            "trace": str(self.trace_path),
            "trace_offset": self._trace.tell(),
            "pid": os.getpid(),
        }
        data = json.dumps(marker).encode()
        # Rewritten in place (no rename): a few microseconds, and read only after this process died.
        os.pwrite(self._marker, data, 0)
        os.ftruncate(self._marker, len(data))
        faulthandler.dump_traceback_later(timeout, repeat=False, file=self._trace, exit=True)

    def timeout_for(self, op: str | None, dtype: str | None, path: str | None) -> float:
        """The case timeout; the first call of a path that compiles or autotunes gets the warm-up one."""
        if path in self.warmup_paths and (op, dtype, path) not in self._warm:
            self._warm.add((op, dtype, path))
            return max(self.case_timeout, self.warmup_timeout)
        return self.case_timeout

    # ---- items
    def begin_item(self, nodeid: str, case: CaseInfo, timeout: float | None = None) -> None:
        self.refresh()
        self.item, self.item_case, self.used_cases = nodeid, case, False
        self._item_started = time.monotonic()
        self.item_limit = max(timeout or 0.0, self.item_timeout)
        self._mark(case, self.item_limit, item_level=True)

    def end_item(self, done: bool) -> None:
        faulthandler.cancel_dump_traceback_later()
        if self.item is None:
            return
        os.ftruncate(self._marker, 0)
        if done:
            seconds = round(time.monotonic() - self._item_started, 3)
            journal.append(self.journal_file, {"kind": "item", "item": self.item, **self._stamp(), "s": seconds})
        self.item = self.item_case = None

    def write(self, case: CaseInfo) -> None:
        assert self.item is not None
        stamp = self._stamp()
        for entry in case.entries(self.item):
            journal.append(self.journal_file, {**entry, **stamp})
            self._note_failure(entry)
            self.done_cases[entry["id"]] = entry["status"]
        self.done_cases[case.id] = case.status

    def _stamp(self) -> dict[str, Any]:
        """When and on which worker an entry ended: what the record's `cost` summary is made from."""
        return {"worker": self.worker, "t": round(time.time(), 3)}

    # ---- gate keys (the router tells them while a route runs)
    def phase(self, phase: Any) -> None:
        """Name what the current case is doing (a sample and part): keys seen next are filed under it."""
        self._phase = phase

    def note_key(self, op: str, key: str, extents: dict[str, int]) -> None:
        """The router runs `op` for a call of gate `key` with these extents: file it under the
        current case if it is about `op`."""
        case = self.current
        if case is None or (case.op is not None and op != case.op):
            return
        case.keys.setdefault(key, set()).add(self._phase)
        merge(case.extents.setdefault(key, {}), extents)
        if key != self._in_flight or extents != self._in_flight_extents:
            # a crash or hang from here on is charged to this call (same deadline)
            self._in_flight, self._in_flight_extents = key, extents
            self._mark(case, max(1.0, self._deadline - time.monotonic()), since=self._started, limit=self._limit)

    @contextmanager
    def case(
        self,
        case_id: str,
        suite: str,
        op: str | None = None,
        dtype: str | None = None,
        path: str | None = None,
        timeout: float | None = None,
    ) -> Iterator[CaseInfo]:
        """Run one case: exceptions fail it (pytest.skip skips it), and it is journaled at the end."""
        case = CaseInfo(case_id, suite, op, dtype, path)
        self.used_cases = True
        limit = timeout if timeout is not None else self.timeout_for(op, dtype, path)
        self._deadline = time.monotonic() + limit
        self._started, self._limit = time.time(), limit
        self._mark(case, limit)
        self.current, self._phase, self._in_flight, self._in_flight_extents = case, None, None, {}
        start = time.perf_counter()
        try:
            yield case
        except pytest.skip.Exception as exc:
            case.skip(str(exc.msg) if hasattr(exc, "msg") else str(exc))
        except (AssertionError, pytest.fail.Exception) as exc:
            case.fail(str(exc).strip()[:2000] or "assertion failed")
        except Exception as exc:
            case.fail(exception_message(exc))
        finally:
            self.current = None
            case.duration_s = time.perf_counter() - start
            faulthandler.cancel_dump_traceback_later()
            if self.item_case is not None:
                self._mark(self.item_case, self.item_limit, item_level=True)
        self.write(case)
        if case.status == "failed" and any(s in case.message for s in STICKY_ERRORS):
            self.restart()

    def restart(self) -> None:
        """End this worker after a device error that poisons the process; the controller re-queues
        the item, whose next run skips the cases already journaled."""
        assert self.item is not None
        data = json.dumps({"item": self.item, "restart": True}).encode()
        os.pwrite(self._marker, data, 0)
        os.ftruncate(self._marker, len(data))
        self._trace.flush()
        os._exit(3)
