"""Writing generated files safely: decide each file's action, keep a manifest, write atomically.

The manifest (`.onboard.json` in the platform folder) holds the sha256 of every file as onboard
last wrote it. A file whose bytes still match that hash is ours to update; a file that differs
(or that exists but onboard never wrote) was edited by a person and is skipped unless forced.
Everything is decided before the first byte is written. Before writing, the manifest records the
hashes about to be written as `pending`; after the last file it is rewritten without them. A run
interrupted in between leaves each file either as it was or as intended, and both are recognised
as onboard's own by the next run, which then completes the work.
"""

from __future__ import annotations

import hashlib
import json
import os
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from torch_fl.fileio import write_atomically
from torch_fl.filelock import hold

MANIFEST_FILE = ".onboard.json"
MANIFEST_FORMAT = 1

Action = Literal["created", "unchanged", "updated", "skipped-edited"]


def locked(folder: Path) -> AbstractContextManager[None]:
    """The lock of one platform folder (`.NAME.lock` beside it), held by `onboard` and `kernel add`
    from reading its manifest to writing it: two at once would leave a manifest that no longer
    matches the files. A second one refuses, naming the first."""
    return hold(folder.parent / f".{folder.name}.lock", f"torch-fl onboard or kernel add of {folder.name!r}")


def digest(text: str) -> str:
    return "sha256:" + hashlib.sha256(text.encode("utf-8")).hexdigest()


@dataclass(frozen=True)
class Planned:
    """One file to generate: where it goes and what it holds."""

    path: Path
    text: str


@dataclass(frozen=True)
class Outcome:
    """What happened (or, in a dry run, would happen) to one file."""

    path: Path
    action: Action
    reason: str = ""

    def as_dict(self, base: Path | None = None) -> dict[str, str]:
        shown = _shown(self.path, base)
        out = {"path": shown, "action": self.action}
        if self.reason:
            out["reason"] = self.reason
        return out


def _shown(path: Path, base: Path | None) -> str:
    if base is not None:
        try:
            return path.resolve().relative_to(base.resolve()).as_posix()
        except ValueError:
            pass
    return str(path)


@dataclass
class Manifest:
    """The hashes onboard wrote, keyed by path relative to the platform folder, and the options used."""

    folder: Path
    platform: str
    options: dict[str, Any] = field(default_factory=dict)
    files: dict[str, str] = field(default_factory=dict)
    pending: dict[str, str] = field(default_factory=dict)

    @property
    def path(self) -> Path:
        return self.folder / MANIFEST_FILE

    def key(self, path: Path) -> str:
        # Relative to the platform folder (the workflow lies outside it: ../../.github/...), so the
        # manifest stays right when the whole repository moves.
        return Path(os.path.relpath(path.resolve(), self.folder.resolve())).as_posix()

    def wrote(self, path: Path, text: str) -> bool:
        """Are these bytes what onboard last wrote (or was about to write) at `path`?"""
        key, h = self.key(path), digest(text)
        return self.files.get(key) == h or self.pending.get(key) == h

    def text(self) -> str:
        data = {
            "format": MANIFEST_FORMAT,
            "generator": "torch-fl onboard",
            "platform": self.platform,
            "options": dict(sorted(self.options.items())),
            "files": dict(sorted(self.files.items())),
        }
        if self.pending:
            data["pending"] = dict(sorted(self.pending.items()))
        return json.dumps(data, indent=2) + "\n"

    @classmethod
    def read(cls, folder: Path) -> Manifest | None:
        """The manifest of `folder`, or None when onboard never wrote there (or the file is unreadable)."""
        try:
            data = json.loads((folder / MANIFEST_FILE).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None
        if not isinstance(data, dict) or data.get("format") != MANIFEST_FORMAT:
            return None
        return cls(
            folder,
            str(data.get("platform", "")),
            dict(data.get("options") or {}),
            dict(data.get("files") or {}),
            dict(data.get("pending") or {}),
        )


def decide(planned: list[Planned], manifest: Manifest, force: bool) -> list[Outcome]:
    """Each file's action, from what is on disk and what the manifest says onboard wrote."""
    outcomes = []
    for item in planned:
        try:
            current = item.path.read_bytes().decode("utf-8")
        except FileNotFoundError:
            outcomes.append(Outcome(item.path, "created"))
            continue
        except (OSError, UnicodeDecodeError):
            current = None
        if current == item.text:
            outcomes.append(Outcome(item.path, "unchanged"))
        elif current is not None and manifest.wrote(item.path, current):
            outcomes.append(Outcome(item.path, "updated"))
        elif force:
            outcomes.append(Outcome(item.path, "updated", "overwrote a file edited since onboard wrote it (--force)"))
        else:
            known = manifest.key(item.path) in manifest.files or manifest.key(item.path) in manifest.pending
            why = "edited since onboard wrote it" if known else "exists and was not written by onboard"
            outcomes.append(Outcome(item.path, "skipped-edited", f"{why}; kept (use --force to overwrite)"))
    return outcomes


def with_hashes(manifest: Manifest, planned: list[Planned], outcomes: list[Outcome]) -> Manifest:
    """The manifest after this run: hashes of what was written or found equal, nothing pending.

    A skipped file keeps its old entry (if any), so the next run still sees it as edited.
    """
    files = dict(manifest.files)
    for item, outcome in zip(planned, outcomes):
        key = manifest.key(item.path)
        if outcome.action != "skipped-edited":
            files[key] = digest(item.text)
        elif key not in files and key in manifest.pending:
            files[key] = manifest.pending[key]
    return Manifest(manifest.folder, manifest.platform, dict(manifest.options), files)


def manifest_outcome(manifest: Manifest) -> Outcome:
    """What writing `manifest` would do to the file on disk."""
    try:
        current = manifest.path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return Outcome(manifest.path, "created")
    except (OSError, UnicodeDecodeError):
        current = None
    return Outcome(manifest.path, "unchanged" if current == manifest.text() else "updated")


def apply(planned: list[Planned], outcomes: list[Outcome], manifest: Manifest) -> None:
    """Write the created/updated files atomically; `manifest` (from `with_hashes`) says what they will be.

    The manifest goes first with the new hashes pending, and again last without them.
    """
    writes = [item for item, outcome in zip(planned, outcomes) if outcome.action in ("created", "updated")]
    if writes:
        pending = {manifest.key(item.path): digest(item.text) for item in writes}
        previous = Manifest.read(manifest.folder)
        intent = Manifest(
            manifest.folder, manifest.platform, manifest.options, previous.files if previous else {}, pending
        )
        write_atomically(intent.path, intent.text())
    for item in writes:
        write_atomically(item.path, item.text)
    if manifest_outcome(manifest).action != "unchanged":
        write_atomically(manifest.path, manifest.text())
