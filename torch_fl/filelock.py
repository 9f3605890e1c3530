"""One process at a time on a resource: an exclusive lock file that names its holder.

The lock is an `flock` on a file beside the resource. The kernel drops it when its holder ends,
however it ends (SIGKILL included), so the lock of a dead process is simply taken over. While it
is held the file says who holds it (pid, start time, command), for the refusal the next process
prints; the holder removes it on release. A process that finds the file replaced after locking it
(its holder removed it meanwhile) locks the new one instead, so two processes never both hold.

While a lock is held in the main thread, SIGTERM and SIGHUP raise SystemExit there: every
`finally` on the way out runs (temporary files removed, child processes ended, the lock released).
"""

from __future__ import annotations

import datetime
import fcntl
import json
import os
import signal
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

TERMINATING = (signal.SIGTERM, signal.SIGHUP)


class LockHeld(RuntimeError):
    """Another living process holds the lock; the message names it."""

    def __init__(self, path: Path, what: str, holder: dict[str, Any]) -> None:
        self.path, self.holder = path, holder
        who = f"pid {holder.get('pid', '?')}, started {holder.get('started', '?')}"
        command = holder.get("command")
        super().__init__(
            f"{what} is already in progress ({who}{f': {command}' if command else ''}); "
            f"wait for it to end, or stop that process (lock file {path})"
        )


def _holder(fd: int) -> dict[str, Any]:
    try:
        data = json.loads(os.pread(fd, 4096, 0) or b"{}")
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _lock(path: Path, what: str) -> int:
    """An open descriptor of `path`, exclusively locked; raises LockHeld when a living process holds it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _holder(fd)
            os.close(fd)
            raise LockHeld(path, what, holder) from None
        try:
            if os.fstat(fd).st_ino == os.stat(path).st_ino:
                return fd
        except FileNotFoundError:
            pass
        os.close(fd)  # the holder removed this file as we locked it: lock the current one


def _signal_to_exit(signum: int, frame: Any) -> None:
    raise SystemExit(128 + signum)


@contextmanager
def hold(path: Path, what: str) -> Iterator[None]:
    """Hold the lock file `path` for the duration; `what` names the work in a refusal
    ("a conformance run of host_ref on torch 2.13")."""
    fd = _lock(Path(path), what)
    started = datetime.datetime.now().astimezone().isoformat(timespec="seconds")
    command = " ".join([Path(sys.argv[0]).name, *sys.argv[1:]])
    me = json.dumps({"pid": os.getpid(), "started": started, "command": command})
    os.ftruncate(fd, 0)
    os.pwrite(fd, me.encode(), 0)
    previous = {}
    if threading.current_thread() is threading.main_thread():
        previous = {sig: signal.signal(sig, _signal_to_exit) for sig in TERMINATING}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, signal.SIG_DFL if handler is None else handler)
        Path(path).unlink(missing_ok=True)  # while still locked: a waiting process then locks a new file
        os.close(fd)
