"""Progress on stderr: a rich progress bar on a terminal, a count line now and then elsewhere (CI logs)."""

from __future__ import annotations

import sys
import time
from collections import Counter

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.progress import Progress as RichProgress

PLAIN_EVERY_S = 30.0


class Progress:
    """Counts finished items and recorded cases; `plain` (--json mode, where stdout is the JSON
    document) gives count lines only, never a bar: an agent still sees a long run move."""

    def __init__(self, platform: str, plain: bool = False) -> None:
        self.platform = platform
        self.plain = plain
        self.total = 0
        self.done = 0
        self.cases: Counter[str] = Counter()
        self._console = Console(stderr=True)
        self._rich: RichProgress | None = None
        self._task = None
        self._last_line = 0.0

    def start(self, total: int) -> None:
        self.total = total
        if self._console.is_terminal and not self.plain:
            self._rich = RichProgress(
                TextColumn(f"conformance {self.platform}"),
                BarColumn(),
                MofNCompleteColumn(),
                TextColumn("{task.fields[counts]}"),
                TimeElapsedColumn(),
                TimeRemainingColumn(),
                console=self._console,
                transient=False,
            )
            self._rich.start()
            self._task = self._rich.add_task("items", total=total, counts="")
        else:
            self._line(force=True)

    def _counts(self) -> str:
        bad = {s: n for s, n in self.cases.items() if s not in ("passed", "skipped") and n}
        text = f"{self.cases['passed']} passed"
        text += "".join(f", {n} {s}" for s, n in sorted(bad.items()))
        return text + (f", {self.cases['skipped']} skipped" if self.cases["skipped"] else "")

    def _line(self, force: bool = False) -> None:
        now = time.monotonic()
        if force or now - self._last_line >= PLAIN_EVERY_S:
            self._last_line = now
            print(
                f"conformance {self.platform}: {self.done}/{self.total} items; cases: {self._counts()}",
                file=sys.stderr,
                flush=True,
            )

    def update(self, items_done: int, statuses: Counter[str]) -> None:
        self.done = items_done
        self.cases = statuses
        if self._rich is not None and self._task is not None:
            self._rich.update(self._task, completed=items_done, counts=self._counts())
        else:
            self._line()

    def close(self) -> None:
        if self._rich is not None:
            self._rich.stop()
            self._rich = None
        else:
            self._line(force=True)
