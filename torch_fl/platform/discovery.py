"""Find platform folders: the ones shipped in the package, then those on FLAGOS_PLATFORM_PATH.

A platform is a folder holding `platform.yaml`; its folder name is its name. Shipped platforms
are read through importlib.resources, so the same code works from a checkout and from a wheel.
FLAGOS_PLATFORM_PATH works like PATH: earlier entries win, and every platform that is hidden by
another of the same name is recorded on the winner (`overrides`) so listings can say so.
"""

from __future__ import annotations

import importlib.resources
import os
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from torch_fl import env
from torch_fl.platform.descriptor import PlatformDescriptor
from torch_fl.platform.errors import DescriptorError, SelectionError, did_you_mean
from torch_fl.platform.loader import DESCRIPTOR_FILE, load_descriptor

Origin = Literal["shipped", "path"]


@dataclass(frozen=True)
class PlatformSource:
    """Where one platform comes from, and which same-named platforms it hides."""

    name: str
    directory: Path
    origin: Origin
    overrides: tuple[Path, ...] = field(default=())

    @property
    def descriptor_path(self) -> Path:
        return self.directory / DESCRIPTOR_FILE


def shipped_root() -> Path:
    """The folder of the platforms shipped inside the installed package (`torch_fl.platforms`)."""
    return Path(str(importlib.resources.files("torch_fl.platforms")))


def _platform_dirs(folder: Path) -> list[Path]:
    """`folder` itself when it is a platform, else the platforms directly inside it, by name.

    A descriptor that is not a regular file (a FIFO, a link to a device) still makes a platform, so
    that loading it says what is wrong instead of the platform silently missing."""
    if os.path.lexists(folder / DESCRIPTOR_FILE):
        return [folder]
    return sorted(p for p in folder.iterdir() if os.path.lexists(p / DESCRIPTOR_FILE))


def discover(path_env: str | None = None) -> dict[str, PlatformSource]:
    """Every platform visible here, by name, sorted by name.

    `path_env` defaults to FLAGOS_PLATFORM_PATH. A path platform with a shipped name replaces the
    shipped one; between path entries the earlier one wins. Entries that are not folders are
    reported with a warning and skipped.
    """
    found: dict[str, PlatformSource] = {
        d.name: PlatformSource(d.name, d, "shipped") for d in _platform_dirs(shipped_root())
    }
    from_path: set[str] = set()
    raw = path_env if path_env is not None else env.get("FLAGOS_PLATFORM_PATH")
    for entry in filter(None, (raw or "").split(os.pathsep)):
        folder = Path(entry).expanduser()
        if not folder.is_dir():
            warnings.warn(f"FLAGOS_PLATFORM_PATH entry {entry!r} is not a folder; skipped", stacklevel=2)
            continue
        try:
            directories = _platform_dirs(folder)
        except OSError as exc:
            warnings.warn(
                f"FLAGOS_PLATFORM_PATH entry {entry!r} cannot be read ({exc.strerror}); skipped", stacklevel=2
            )
            continue
        for directory in directories:
            name = directory.name
            known = found.get(name)
            if known is not None and name in from_path:
                # An earlier path entry already provides this name: it keeps it, and says what it hides.
                found[name] = PlatformSource(name, known.directory, "path", known.overrides + (directory,))
                continue
            hidden = (known.directory,) if known is not None else ()
            found[name] = PlatformSource(name, directory, "path", hidden)
            from_path.add(name)
    return dict(sorted(found.items()))


def load_platform(name: str, sources: dict[str, PlatformSource] | None = None) -> PlatformDescriptor:
    """Load one platform by name; an unknown name is a SelectionError listing the known ones."""
    sources = discover() if sources is None else sources
    if name not in sources:
        known = ", ".join(sources) or "none"
        raise SelectionError(f"unknown platform {name!r}; {did_you_mean(name, sources)}known platforms: {known}")
    return load_descriptor(sources[name].directory)


def load_all(
    sources: dict[str, PlatformSource] | None = None,
) -> tuple[dict[str, PlatformDescriptor], dict[str, DescriptorError]]:
    """Load every discovered platform: the good ones, and the errors of the broken ones by name.

    A broken descriptor on a user's path must not hide the others, so errors are returned, not raised.
    """
    sources = discover() if sources is None else sources
    loaded: dict[str, PlatformDescriptor] = {}
    broken: dict[str, DescriptorError] = {}
    for name, source in sources.items():
        try:
            loaded[name] = load_descriptor(source.directory)
        except DescriptorError as exc:
            broken[name] = exc
    return loaded, broken
