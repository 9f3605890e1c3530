"""The Markdown compatibility matrix, generated from descriptors and their conformance records.

The reference keeps a hand-written "internal capability sheet"; here the table is computed, so
it cannot claim more than the files say. Status comes from the records alone: a platform is
"validated" on a torch line when a complete record matches its current descriptor.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import astuple, dataclass

from torch_fl.platform.descriptor import PlatformDescriptor
from torch_fl.platform.errors import RecordError
from torch_fl.platform.record import (
    STATUS_WORDS,
    RecordStatus,
    load_record_file,
    record_lines,
    record_path,
    record_status,
)

COLUMNS = (
    "platform",
    "boards",
    "vendor",
    "backing",
    "status",
    "SDK",
    "distributed",
    "compile",
    "profiler",
    "AMP dtypes",
    "conformance (passed/cases by path)",
)


@dataclass(frozen=True)
class MatrixRow:
    """One platform's line of the matrix, as plain strings (also what `--json` shows)."""

    platform: str
    boards: str
    vendor: str
    backing: str
    status: str
    sdk: str
    distributed: str
    compile: str
    profiler: str
    amp_dtypes: str
    conformance: str

    def cells(self) -> list[str]:
        return list(astuple(self))


def _statuses(descriptor: PlatformDescriptor) -> list[RecordStatus]:
    """The status of each record the platform has, judged against the versions it recorded."""
    if descriptor.directory is None:
        return []
    statuses = []
    for line in record_lines(descriptor.directory):
        try:
            record = load_record_file(record_path(descriptor.directory, line))
        except RecordError as exc:
            statuses.append(RecordStatus("stale", [f"unreadable record: {exc}"], None, line))
            continue
        statuses.append(record_status(descriptor, descriptor.directory, record.torch_version, record.kernel_libraries))
    return statuses


def _status_cell(statuses: list[RecordStatus]) -> str:
    if not statuses:
        return "unvalidated"
    return ", ".join(f"{STATUS_WORDS[s.state]} (torch {s.torch_line})" for s in statuses)


def _conformance_cell(statuses: list[RecordStatus]) -> str:
    parts = []
    for s in statuses:
        if s.record is None:
            continue
        counts = s.record.counts_by_path()
        shown = " ".join(f"{path} {p}/{t}" for path, (p, t) in sorted(counts.items()))
        parts.append(f"torch {s.torch_line}: {shown or 'no op cases'}")
    return "; ".join(parts) or "-"


def matrix_row(descriptor: PlatformDescriptor) -> MatrixRow:
    """The matrix row of one platform."""
    caps = descriptor.capabilities
    sdk = descriptor.environment.sdk
    dist = caps.distributed
    statuses = _statuses(descriptor)
    return MatrixRow(
        platform=descriptor.name,
        boards=", ".join(descriptor.boards),
        vendor=descriptor.vendor,
        backing=descriptor.backing.device,
        status=_status_cell(statuses),
        sdk=" ".join(p for p in (sdk.name, sdk.version) if p) if sdk else "-",
        distributed=f"{dist.backend} ({', '.join(dist.features)})" if dist.features else dist.backend,
        compile=caps.compile.path,
        profiler=caps.profiler.tracer,
        amp_dtypes=", ".join(caps.amp_dtypes) or "-",
        conformance=_conformance_cell(statuses),
    )


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def matrix_markdown(descriptors: Mapping[str, PlatformDescriptor]) -> str:
    """The compatibility table of `descriptors` (sorted by name) as GitHub Markdown."""
    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    for name in sorted(descriptors):
        lines.append("| " + " | ".join(_cell(c) for c in matrix_row(descriptors[name]).cells()) + " |")
    return "\n".join(lines) + "\n"
