"""Errors of the platform layer, worded so a person can fix the file they name."""

from __future__ import annotations

import difflib
import reprlib
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from pathlib import Path

Loc = tuple[str | int, ...]


class PlatformError(Exception):
    """Base of every error the platform layer raises on purpose."""


def clip(text: str, limit: int = 60) -> str:
    """`text` cut to `limit` characters: messages quote input, and input may be any size."""
    return text if len(text) <= limit else text[: limit - 3] + "..."


_BOUNDED = reprlib.Repr()
_BOUNDED.maxstring, _BOUNDED.maxother, _BOUNDED.maxlist, _BOUNDED.maxdict, _BOUNDED.maxlevel = 60, 60, 6, 4, 3


def short(value: object, limit: int = 60) -> str:
    """A repr of `value` of at most `limit` characters, built without rendering all of a huge value."""
    return clip(_BOUNDED.repr(value), limit)


def did_you_mean(name: str, known: Collection[str]) -> str:
    """`did you mean 'host_ref'? ` for a slip of a known name (case, a typo), else ''."""
    match = next((k for k in known if k.lower() == name.lower()), None)
    match = match or next(iter(difflib.get_close_matches(name.lower(), list(known), n=1, cutoff=0.9)), None)
    return f"did you mean {match!r}? " if match else ""


def format_loc(loc: Loc) -> str:
    """`('routes', 'overrides', 'aten::add.Tensor', 0)` -> `routes.overrides["aten::add.Tensor"][0]`."""
    out = ""
    for part in loc:
        part = part if isinstance(part, int) else clip(part)  # keys are input too: a key can be any size
        if isinstance(part, int):
            out += f"[{part}]"
        elif part.isidentifier():
            out += f".{part}" if out else part
        else:
            out += f'["{part}"]'
    return out


@dataclass(frozen=True)
class Issue:
    """One problem in a descriptor: where (line, field path) and what was expected."""

    message: str
    loc: Loc = ()
    line: int | None = None

    def render(self, file: str | None) -> str:
        where = ":".join(p for p in (file, str(self.line) if self.line else None) if p)
        parts = [p for p in (where, format_loc(self.loc), self.message) if p]
        return ": ".join(parts)


def display_path(path: Path) -> str:
    """The path relative to the working directory when it lies below it, else as given."""
    try:
        return str(path.resolve().relative_to(Path.cwd().resolve()))
    except (ValueError, OSError, RuntimeError):  # elsewhere, or a link loop that cannot be resolved
        return str(path)


class DescriptorError(PlatformError):
    """A descriptor that cannot be used; `str()` is `file:line: field.path: expected ...; got ...`.

    It carries every problem found (one per line of the message), so one run shows them all.
    """

    def __init__(self, issues: Sequence[Issue] | str, file: Path | None = None) -> None:
        self.issues: list[Issue] = [Issue(issues)] if isinstance(issues, str) else list(issues)
        self.file = file
        super().__init__(str(self))

    def __str__(self) -> str:
        shown = display_path(self.file) if self.file is not None else None
        return "\n".join(issue.render(shown) for issue in self.issues)

    @property
    def brief(self) -> str:
        """The first problem on one line, and how many more there are: for listings and warnings
        about a platform that is skipped (a file that is not a descriptor at all has dozens)."""
        first = self.issues[0].render(display_path(self.file) if self.file is not None else None)
        more = len(self.issues) - 1
        return f"{first} (and {more} more problem{'s' if more > 1 else ''})" if more else first

    @property
    def line(self) -> int | None:
        """The line of the first problem (1-based), when known."""
        return self.issues[0].line

    @property
    def field(self) -> str:
        """The dotted field path of the first problem."""
        return format_loc(self.issues[0].loc)

    @property
    def message(self) -> str:
        """What was expected, for the first problem."""
        return self.issues[0].message


class RecordError(PlatformError):
    """A conformance record file that cannot be read or does not follow the record format."""


class SelectionError(PlatformError):
    """No platform can be selected: an unknown forced name, or no detection rule matched."""
