"""Writing files so that no reader ever sees them half-written (route tables, records, onboarding)."""
from __future__ import annotations

import os
import tempfile
from pathlib import Path


def write_atomically(path: Path, content: str | bytes) -> None:
    """Replace `path` with `content` (text as UTF-8): written to a temporary file beside it, flushed, renamed."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
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


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask
