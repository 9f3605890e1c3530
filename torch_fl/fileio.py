"""Writing files so that no reader ever sees them half-written (route tables, records, onboarding)."""

from __future__ import annotations

import glob
import os
import tempfile
from collections.abc import Iterable
from pathlib import Path


def write_atomically(path: Path, content: str | bytes) -> None:
    """Replace `path` with `content` (text as UTF-8): written to a temporary file beside it, flushed, renamed.

    The temporary file, `.NAME.PID.XXXXXXXX.tmp`, is removed on any exception; one left by a killed
    process is recognised by its PID (see remove_orphans)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.{os.getpid()}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(content.encode("utf-8") if isinstance(content, str) else content)
            f.flush()
            os.fsync(f.fileno())
        # mkstemp makes the file private (0600); give it the mode a plain write would have.
        os.chmod(tmp, path.stat().st_mode & 0o7777 if path.exists() else 0o666 & ~_umask())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def remove_orphans(paths: Iterable[Path]) -> list[Path]:
    """Remove the temporary files that write_atomically left beside `paths` in processes that no
    longer run (killed mid-write); a file without a PID is an orphan too. Returns those removed."""
    removed = []
    for path in paths:
        for tmp in path.parent.glob(f".{glob.escape(path.name)}.*.tmp"):
            writer = tmp.name[len(path.name) + 2 :].split(".", 1)[0]
            if not (writer.isdigit() and int(writer) > 0 and _running(int(writer))):
                tmp.unlink(missing_ok=True)
                removed.append(tmp)
    return removed


def _running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # another user's process
    except OverflowError:
        return False  # no such PID on this system
    return True


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask
