"""Platform files, read within bounds and written so that no reader ever sees them half-written
(descriptors, route tables, records, journals, onboarding).

Platform folders come from anywhere on FLAGOS_PLATFORM_PATH and are read during `import torch`, so
a read must end, fit in memory and parse without exhausting the stack whatever the file is: only
regular files are opened (a FIFO blocks, /dev/zero never ends), each kind of file has a size cap
checked before reading, and parsed data a nesting cap checked before it is used.
"""

from __future__ import annotations

import contextlib
import errno
import glob
import json
import os
import stat
import tempfile
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any, BinaryIO

MAX_DEPTH = 32
"""How deeply a platform file's data may nest: the formats need a few levels, and parsers and
validators recurse once per level (Python's stack holds about a thousand frames)."""

_KINDS = {
    stat.S_IFDIR: "a folder",
    stat.S_IFIFO: "a FIFO",
    stat.S_IFCHR: "a character device",
    stat.S_IFBLK: "a block device",
    stat.S_IFSOCK: "a socket",
}


class RefusedFile(ValueError):
    """A file not read or not used: unreadable, not a regular file, larger than its kind may be, or
    nested too deeply. `str()` is one line, `PATH: reason`."""

    def __init__(self, path: Path, reason: str) -> None:
        super().__init__(f"{path}: {reason}")
        self.path = Path(path)
        self.reason = reason


def _size(n: int) -> str:
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if n >= 1 << shift:
            return f"{n / (1 << shift):.4g} {unit}"
    return f"{n} bytes"


@contextlib.contextmanager
def open_bounded(path: Path, limit: int) -> Iterator[BinaryIO]:
    """The regular file `path` open for reading, when it holds at most `limit` bytes.

    Anything else is a RefusedFile naming it, decided before a byte is read: the path is checked
    with stat before it is opened (a device is never opened) and opened non-blocking (a FIFO put
    there in between cannot block). Errors while reading are RefusedFile too."""
    try:
        kind = stat.S_IFMT(os.stat(path).st_mode)
        if kind != stat.S_IFREG:
            raise RefusedFile(path, f"not a regular file ({_KINDS.get(kind, 'a special file')})")
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        raise RefusedFile(path, f"cannot read: {exc.strerror or exc}") from None
    with os.fdopen(fd, "rb") as f:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise RefusedFile(path, "not a regular file (replaced while it was opened)")
        if info.st_size > limit:
            raise RefusedFile(
                path, f"larger than {_size(limit)} ({_size(info.st_size)}), the most a file of its kind may be"
            )
        try:
            yield f
        except OSError as exc:
            raise RefusedFile(path, f"cannot read: {exc.strerror or exc}") from None


def read_bounded(path: Path, limit: int) -> bytes:
    """The bytes of the regular file `path`, when it holds at most `limit` (see open_bounded); a file
    that grows past the cap while it is read is refused."""
    with open_bounded(path, limit) as f:
        data = f.read(limit + 1)
    if len(data) > limit:
        raise RefusedFile(path, f"larger than {_size(limit)} (it grew while it was read)")
    return data


def load_json(path: Path, limit: int) -> Any:
    """The JSON value in `path`, read within bounds (read_bounded, at most MAX_DEPTH levels deep);
    anything else, text that is not UTF-8 JSON included, is a RefusedFile naming the file."""
    raw = read_bounded(path, limit)
    try:
        value = json.loads(raw)
    except RecursionError:
        raise too_deep(path) from None
    except ValueError as exc:  # JSONDecodeError and UnicodeDecodeError
        raise RefusedFile(path, f"not JSON ({type(exc).__name__}: {str(exc)[:200]})") from None
    check_depth(value, path)
    return value


def too_deep(path: Path) -> RefusedFile:
    return RefusedFile(path, f"nested more than {MAX_DEPTH} levels deep")


def check_depth(data: Any, path: Path) -> None:
    """Raise too_deep(path) when the lists and mappings of `data` nest more than MAX_DEPTH levels.

    Measured without recursion, so data of any depth is measured."""
    pending = [(data, 1)]
    while pending:
        node, depth = pending.pop()
        children = node.values() if isinstance(node, dict) else node if isinstance(node, list) else None
        if children is None:
            continue
        if depth > MAX_DEPTH:
            raise too_deep(path)
        pending.extend((child, depth + 1) for child in children)


def write_atomically(path: Path, content: str | bytes) -> None:
    """Replace `path` with `content` (text as UTF-8): written to a temporary file beside it, flushed,
    renamed, read back (an OSError when it differs).

    The temporary file, `.NAME.PID.XXXXXXXX.tmp`, is removed on any exception; one left by a killed
    process is recognised by its PID (see remove_orphans)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    data = content.encode("utf-8") if isinstance(content, str) else content
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.{os.getpid()}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        # mkstemp makes the file private (0600); give it the mode a plain write would have.
        os.chmod(tmp, path.stat().st_mode & 0o7777 if path.exists() else 0o666 & ~_umask())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    # What is on disk now is what callers report as written: read it back rather than trust the rename.
    try:
        same = read_bounded(path, len(data)) == data
    except RefusedFile:
        same = False
    if not same:
        raise OSError(errno.EIO, "the file reads back other bytes than were written", str(path))


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
