"""Conformance records: what a run on the board proved, and whether that proof still holds.

A record is `platforms/<name>/records/torch-<major.minor>.json`, written by `torch-fl
conformance run`. It is tied to the descriptor by a hash of the validated model (comments and
layout do not count, any field does), to a torch line, and to the kernel libraries' versions;
when any of those moved, or the run did not finish, the record is stale.
"""
from __future__ import annotations

import hashlib
import importlib.metadata
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, ValidationError

from torch_fl import env
from torch_fl.fileio import write_atomically
from torch_fl.platform.descriptor import PlatformDescriptor
from torch_fl.platform.errors import RecordError
from torch_fl.platform.versions import minor_line, release

RECORD_FORMAT = 1
RECORDS_DIR = "records"
env.register(
    "FLAGOS_CACHE_DIR", None,
    "Where torch-fl keeps data derived from platform files, such as the gated part of each conformance "
    "record read during `import torch` (default: ~/.cache/torch_fl/records).",
)
CaseStatus = Literal["passed", "failed", "error", "crashed", "timeout", "skipped"]
RecordState = Literal["valid", "stale", "missing"]
STATUS_WORDS: dict[str, str] = {"valid": "validated", "stale": "stale", "missing": "unvalidated"}
"""How a record state is shown to people: the platform's real status."""


class Case(BaseModel):
    """One conformance case: an op x dtype x path x direction, or a capability check (op None)."""

    model_config = ConfigDict(extra="forbid")

    id: str
    suite: str
    op: str | None = None
    dtype: str | None = None
    path: str | None = None
    status: CaseStatus
    message: str = ""
    fingerprint: str | None = None
    duration_s: float = 0.0


class Record(BaseModel):
    """The results of one conformance run of one platform on one torch line."""

    model_config = ConfigDict(extra="forbid")

    format: Literal[1] = RECORD_FORMAT
    platform: str
    descriptor_hash: str
    torch: str
    torch_version: str
    kernel_libraries: dict[str, str] = {}
    started: str
    finished: str | None = None
    complete: bool
    machine: dict[str, Any] = {}
    cases: list[Case] = []
    summary: dict[str, Any] = {}

    def counts_by_path(self) -> dict[str, tuple[int, int]]:
        """path -> (passed, total) over op cases, for the compatibility matrix."""
        counts: dict[str, list[int]] = {}
        for case in self.cases:
            if case.path is None:
                continue
            c = counts.setdefault(case.path, [0, 0])
            c[0] += case.status == "passed"
            c[1] += 1
        return {path: (c[0], c[1]) for path, c in counts.items()}


# Fields added to the model after records were written: left out of the hash while unset, so a
# descriptor that does not use them keeps the hash (and the records) it had.
_HASHED_WHEN_SET = (("capabilities", "features"),)


def descriptor_hash(descriptor: PlatformDescriptor) -> str:
    """`sha256:<hex>` of the canonical JSON of the validated model."""
    data = descriptor.model_dump(mode="json")
    for section, name in _HASHED_WHEN_SET:
        if not data[section][name]:
            del data[section][name]
    canonical = json.dumps(data, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return "sha256:" + hashlib.sha256(canonical.encode("utf-8")).hexdigest()


def record_path(directory: Path, torch_line: str) -> Path:
    """Where the record of `directory`'s platform for `torch_line` ("2.13") lives."""
    return Path(directory) / RECORDS_DIR / f"torch-{torch_line}.json"


def _gated_copy(path: Path, skip_paths: frozenset[str]) -> Path:
    """Where the record at `path`, less its cases on `skip_paths`, is cached: named by the file's
    identity (place, size, modification time), so an edited or rewritten record is read afresh."""
    stat = path.stat()
    key = f"{path.resolve()}\0{stat.st_size}\0{stat.st_mtime_ns}\0{','.join(sorted(skip_paths))}"
    root = env.get("FLAGOS_CACHE_DIR") or Path.home() / ".cache" / "torch_fl" / "records"
    return Path(root) / f"{hashlib.sha256(key.encode()).hexdigest()[:32]}.json"


def load_record(directory: Path, torch_line: str, skip_paths: frozenset[str] = frozenset()) -> Record | None:
    """The record for `torch_line`, None when there is none; a malformed file is a RecordError.

    Cases on `skip_paths` are left out unread: gating, which runs during `import torch`, needs
    only the cases of the paths it gates, a few hundred of tens of thousands. That part is cached
    after the first read (parsing a record of megabytes costs about 0.1 s of every import).
    """
    path = record_path(directory, torch_line)
    if not path.is_file():
        return None
    try:
        if not skip_paths:
            return Record.model_validate_json(path.read_bytes())
        cached = _gated_copy(path, skip_paths)
        try:
            return Record.model_validate_json(cached.read_bytes())
        except (OSError, ValueError):  # not cached yet (or unreadable): read the record itself
            pass
        data = json.loads(path.read_bytes())
        if isinstance(data, dict) and isinstance(data.get("cases"), list):
            data["cases"] = [c for c in data["cases"] if not (isinstance(c, dict) and c.get("path") in skip_paths)]
        record = Record.model_validate(data)
        try:
            write_atomically(cached, record.model_dump_json())
        except OSError:  # a read-only home only costs the next import the full read
            pass
        return record
    except json.JSONDecodeError as exc:
        raise RecordError(f"{path}: not valid JSON: {exc}") from None
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        raise RecordError(f"{path}: {where}: {first['msg']} ({exc.error_count()} problem(s))") from None
    except OSError as exc:
        raise RecordError(f"{path}: cannot read: {exc}") from None


def record_lines(directory: Path) -> list[str]:
    """Torch lines that have a record in `directory`, newest first."""
    folder = Path(directory) / RECORDS_DIR
    lines = [m.group(1) for p in folder.glob("torch-*.json") if (m := re.fullmatch(r"torch-(\d+\.\d+)\.json", p.name))]
    return sorted(lines, key=release, reverse=True)


def kernel_libraries(descriptor: PlatformDescriptor) -> dict[str, str]:
    """Distribution name -> version the descriptor's kernel sets are pinned to."""
    libs: dict[str, str] = {}
    if descriptor.kernels.flaggems is not None:
        libs[descriptor.kernels.flaggems.package] = descriptor.kernels.flaggems.version
    if descriptor.kernels.vendor is not None and descriptor.kernels.vendor.package is not None:
        libs[descriptor.kernels.vendor.package.name] = descriptor.kernels.vendor.package.version
    return libs


def installed_version(distribution: str) -> str | None:
    """The installed version of a distribution (read from metadata, nothing is imported)."""
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None


def installed_kernel_versions(descriptor: PlatformDescriptor) -> dict[str, str | None]:
    """The installed versions of the descriptor's kernel libraries (None: not installed)."""
    return {name: installed_version(name) for name in kernel_libraries(descriptor)}


@dataclass(frozen=True)
class RecordStatus:
    """Whether the record for this torch line still vouches for the descriptor, and if not, why."""

    state: RecordState
    reasons: list[str] = field(default_factory=list)
    record: Record | None = None
    torch_line: str | None = None


def record_status(
    descriptor: PlatformDescriptor,
    directory: Path,
    torch_version: str | None,
    kernel_versions: Mapping[str, str | None],
    skip_paths: frozenset[str] = frozenset(),
) -> RecordStatus:
    """Compare the record for `torch_version`'s line with the descriptor and the installed kernels.

    `skip_paths`: cases of these paths are not loaded (see `load_record`).
    `kernel_versions` maps each kernel library to its installed version (None: not installed).
    With no record for this torch line but one for another line, the newest other record is
    returned as stale (the torch line differs); with none at all, the state is "missing". An
    unreadable record is stale, so callers that only gate never have to handle RecordError.
    """
    line = minor_line(torch_version) if torch_version else None
    candidates = ([line] if line and record_path(directory, line).is_file() else []) or record_lines(directory)[:1]
    if not candidates:
        why = f"no {RECORDS_DIR}/torch-{line}.json" if line else "no record, and torch is not installed"
        return RecordStatus("missing", [why], None, line)
    try:
        record = load_record(directory, candidates[0], skip_paths)
    except RecordError as exc:
        # An unreadable record proves nothing, but must not stop native and cpu from running.
        return RecordStatus("stale", [f"unreadable record: {exc}"], None, candidates[0])
    assert record is not None
    reasons: list[str] = []
    if record.platform != descriptor.name:
        reasons.append(f"record is for platform {record.platform!r}")
    if record.descriptor_hash != descriptor_hash(descriptor):
        reasons.append("descriptor changed since the record was made (hash differs)")
    if line is None:
        reasons.append(f"torch is not installed (record is for torch {record.torch})")
    elif record.torch != line:
        reasons.append(f"torch line differs: record is for {record.torch}, installed is {line}")
    for name, recorded in sorted(record.kernel_libraries.items()):
        now = kernel_versions.get(name)
        if now != recorded:
            reasons.append(f"{name} differs: record has {recorded}, installed is {now or 'none'}")
    for name in sorted(set(kernel_libraries(descriptor)) - set(record.kernel_libraries)):
        reasons.append(f"{name} is declared but the record did not check it")
    if not record.complete:
        reasons.append("the conformance run did not complete")
    return RecordStatus("stale" if reasons else "valid", reasons, record, record.torch)


def current_status(descriptor: PlatformDescriptor) -> RecordStatus:
    """The record status against the torch and kernel libraries installed here (nothing imported)."""
    if descriptor.directory is None:
        raise ValueError("the descriptor was not loaded from a file, so it has no records")
    return record_status(
        descriptor, descriptor.directory, installed_version("torch"), installed_kernel_versions(descriptor)
    )
