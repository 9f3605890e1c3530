"""Conformance records: what a run on the board proved, and whether that proof still holds.

A record is `platforms/<name>/records/torch-<major.minor>.json`, written by `torch-fl
conformance run`. It is small enough to read at every `import torch`: the gate's verdicts per op,
path and gate key (torch_fl.routing.gatekey), the failing cases in full, and counts. Every case
of the run, passed ones included, is the evidence beside it (`torch-<line>.cases.jsonl.gz`),
which the gate never reads; the record binds it by hash.

The record binds everything that decides a verdict (`binding`): the descriptor's hash (comments
and layout do not count, any field does), the torch line, the kernel libraries' versions and the
content hash of every Python source in the platform's folder (vendor kernels). When any of those
moved, or the run did not finish, the record is stale. A checksum over the record's content makes
a record edited by hand `tampered`, and the counts in its summary are recomputed from its
verdicts and failures, so a summary that disagrees with them is caught the same way.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import re
import zlib
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, ValidationError

from torch_fl.fileio import RefusedFile, load_json, read_bounded
from torch_fl.platform.descriptor import RECORDS_DIR, PlatformDescriptor
from torch_fl.platform.errors import RecordError, clip
from torch_fl.platform.versions import minor_line, release

RECORD_FORMAT: Literal[2] = 2
MAX_RECORD_BYTES = 32 << 20  # twenty times the largest record made (a full sweep on nvidia_h200)
MAX_SOURCE_BYTES = 16 << 20  # a vendor kernel module
MAX_EVIDENCE_BYTES = 256 << 20  # a run's cases, unpacked
CaseStatus = Literal["passed", "failed", "error", "crashed", "timeout", "skipped", "unjudged"]
FAILING: frozenset[str] = frozenset({"failed", "error", "crashed", "timeout"})
"""Statuses that veto what the case covers. `skipped` (not tried) and `unjudged` (tried, but not
every part it claims to check could be compared) neither prove nor veto anything."""
PYTORCH_PATHS: frozenset[str] = frozenset({"native", "cpu"})
"""Paths that run PyTorch's own kernels, whose failures no platform can fix. Everything else a
platform owns: its paths (vendor, flaggems, emulated) and the device features (cases without a
path); exit criteria count those."""
RecordState = Literal["valid", "stale", "missing", "tampered"]
STATUS_WORDS: dict[str, str] = {
    "valid": "validated",
    "stale": "stale",
    "missing": "unvalidated",
    "tampered": "tampered",
}
"""How a record state is shown to people: the platform's real status."""
GATED_PATHS: frozenset[str] = frozenset({"flaggems", "vendor", "emulated"})
"""Paths that run only where a record proves them; native and cpu are PyTorch's own kernels."""
ANY_KEY = "*"
"""The gate key of a failure that happened before its first call had a key (it vetoes every key)."""
Verdict = Literal["passed", "failed", "unjudged"]


def without_size(key: str) -> str:
    """`float32,float32@large` -> `float32,float32`: what a gate key says of a call but its size
    class. The gate refuses every size of it once one size failed (verdicts never widen past the
    evidence: a kernel wrong at one size is not trusted at the sizes nobody tried)."""
    return key.rpartition("@")[0] if "@" in key else key


class Case(BaseModel):
    """One conformance case: what ran (op x path, the gate keys of the calls it made), and how it ended.

    Capability checks have no op. `dtype` is the dtype the case's inputs were made in (the OpInfo
    dtype of an ops case); what the gate cares about is `keys`.
    """

    model_config = ConfigDict(extra="forbid")

    id: str
    suite: str
    op: str | None = None
    dtype: str | None = None
    path: str | None = None
    keys: list[str] = []
    status: CaseStatus
    message: str = ""
    fingerprint: str | None = None
    duration_s: float = 0.0
    item: str | None = None
    """The pytest item that ran the case (its node id): what re-runs it."""
    extents: dict[str, dict[str, list[int]]] = {}
    """Gate key -> named extent (torch_fl.platform.extents) -> [smallest, largest] over the case's calls."""
    outside_constraints: bool = False
    """A failure whose every call lies outside a constraint the descriptor declares: it refuses nothing."""


class Binding(BaseModel):
    """What a record must share with this machine and checkout to vouch for them."""

    model_config = ConfigDict(extra="forbid")

    descriptor_hash: str
    torch: str
    torch_version: str
    kernel_libraries: dict[str, str] = {}
    sources: dict[str, str] = {}


class Evidence(BaseModel):
    """The file with every case of the run, bound by its hash."""

    model_config = ConfigDict(extra="forbid")

    file: str
    sha256: str
    cases: int


class Record(BaseModel):
    """The results of one conformance run of one platform on one torch line."""

    model_config = ConfigDict(extra="forbid")

    format: Literal[2] = RECORD_FORMAT
    platform: str
    binding: Binding
    started: str
    finished: str | None = None
    complete: bool
    machine: dict[str, Any] = {}
    gate: dict[str, dict[str, dict[str, Verdict]]] = {}
    failures: list[Case] = []
    counts: dict[str, dict[str, int]] = {}
    summary: dict[str, Any] = {}
    limits: dict[str, dict[str, dict[str, dict[str, int]]]] | None = None
    """op -> path -> dtypes (a gate key without its size class) -> named extent -> the largest one a
    passing case reached: the proof reaches no further. None in records made before extents were kept."""
    sources_decide: dict[str, list[str]] = {}
    """Platform source -> the vendor ops whose cases it decides (`["*"]`: every vendor case); see
    torch_fl.conformance.incremental. Descriptor fields decide every case, kernel libraries their path's."""
    evidence: Evidence | None = None
    checksum: str = ""

    @property
    def torch(self) -> str:
        return self.binding.torch

    @property
    def torch_version(self) -> str:
        return self.binding.torch_version

    @property
    def kernel_libraries(self) -> dict[str, str]:
        return self.binding.kernel_libraries

    def counts_by_path(self) -> dict[str, tuple[int, int]]:
        """path -> (passed, total) over op cases, for the compatibility matrix."""
        return {path: (c.get("passed", 0), sum(c.values())) for path, c in sorted(self.counts.items()) if path != "-"}


def gate_verdicts(cases: list[dict[str, Any]]) -> dict[str, dict[str, dict[str, Verdict]]]:
    """op -> path -> gate key -> verdict, over the cases of gated paths.

    A key is `failed` when any case that made a call with it failed, else `passed` when one passed
    with it, else `unjudged`. A failing case that made no keyed call (it died first) vetoes every
    key of its op and path (ANY_KEY). A failure outside the declared constraints refuses nothing.
    """
    gate: dict[str, dict[str, dict[str, Verdict]]] = {}
    for case in cases:
        op, path, status = case.get("op"), case.get("path"), case["status"]
        if op is None or path not in GATED_PATHS or status == "skipped" or case.get("outside_constraints"):
            continue
        keys = case.get("keys") or ([ANY_KEY] if status in FAILING else [])
        if not keys:
            continue
        verdicts = gate.setdefault(op, {}).setdefault(path, {})
        for key in keys:
            now = verdicts.get(key)
            if status in FAILING or now == "failed":
                verdicts[key] = "failed"
            elif status == "passed" or now == "passed":
                verdicts[key] = "passed"
            else:
                verdicts[key] = "unjudged"
    return {op: {p: dict(sorted(v.items())) for p, v in sorted(paths.items())} for op, paths in sorted(gate.items())}


def proven_limits(cases: list[dict[str, Any]]) -> dict[str, dict[str, dict[str, dict[str, int]]]]:
    """op -> path -> dtypes -> named extent -> the largest extent a passing case of a gated path reached."""
    limits: dict[str, dict[str, dict[str, dict[str, int]]]] = {}
    for case in cases:
        op, path = case.get("op"), case.get("path")
        if op is None or path not in GATED_PATHS or case["status"] != "passed":
            continue
        for key, extents in (case.get("extents") or {}).items():
            reached = limits.setdefault(op, {}).setdefault(path, {}).setdefault(without_size(key), {})
            for name, (_, largest) in extents.items():
                reached[name] = max(reached.get(name, 0), int(largest))
    return {
        op: {p: {k: dict(sorted(e.items())) for k, e in sorted(f.items())} for p, f in sorted(paths.items())}
        for op, paths in sorted(limits.items())
    }


Constraints = dict[str, dict[str, dict[str, dict[str, int | None]]]]
"""path -> op -> named extent -> {"min": ..., "max": ...}: a descriptor's declared constraints as data."""


def declared_constraints(descriptor: PlatformDescriptor) -> Constraints:
    """The constraints `descriptor` declares, as data (what a run's journal header carries)."""
    out: Constraints = {}
    for path in GATED_PATHS:
        for op, limits in descriptor.kernels.constraints(path).items():
            out.setdefault(path, {})[op] = {name: limit.model_dump() for name, limit in limits.items()}
    return out


def outside_constraints(case: Mapping[str, Any], constraints: Constraints) -> bool:
    """Does a failing case lie wholly outside what its path declares for its op? Then it refuses
    nothing: the runtime never sends it that path. Sure only when, for every key the case made,
    one extent puts all its calls out (a case that died before its first keyed call is not)."""
    limits = constraints.get(case.get("path") or "", {}).get(case.get("op") or "", {})
    spans = case.get("extents") or {}
    keys = case.get("keys") or []
    if not limits or not keys or any(k not in spans for k in keys):
        return False
    return all(_all_out(spans[k], limits) for k in keys)


def _all_out(span: Mapping[str, list[int]], limits: Mapping[str, Mapping[str, int | None]]) -> bool:
    for name, limit in limits.items():
        if name not in span:
            continue
        low, high = span[name]
        most, least = limit.get("max"), limit.get("min")
        if (most is not None and low > most) or (least is not None and high < least):
            return True
    return False


def case_counts(cases: list[dict[str, Any]]) -> dict[str, dict[str, int]]:
    """path ("-" for capability cases) -> status -> cases."""
    counts: dict[str, Counter[str]] = {}
    for case in cases:
        counts.setdefault(case.get("path") or "-", Counter())[case["status"]] += 1
    return {path: dict(sorted(c.items())) for path, c in sorted(counts.items())}


def checksum(data: Mapping[str, Any]) -> str:
    """`sha256:<hex>` of a record's canonical JSON, its own checksum field left out."""
    body = {k: v for k, v in data.items() if k != "checksum"}
    canonical = json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return "sha256:" + hashlib.sha256(canonical.encode("utf-8")).hexdigest()


def inconsistencies(record: Record, raw: Mapping[str, Any]) -> list[str]:
    """Why a record is not what its run wrote (empty: it is)."""
    problems = []
    if record.checksum != checksum(raw):
        problems.append("its checksum does not match its content (edited after the run)")
    failing = Counter(c.status for c in record.failures if c.status in FAILING)
    counted: Counter[str] = Counter()
    for statuses in record.counts.values():
        counted.update({s: n for s, n in statuses.items() if s in FAILING})
    if counted != failing:
        problems.append(f"its counts list {dict(counted)} failing cases, its failures {dict(failing)}")
    failed_keys = {
        (c.op, c.path) for c in record.failures if c.path in GATED_PATHS and c.op and not c.outside_constraints
    }
    for op, path in failed_keys:
        if "failed" not in record.gate.get(op or "", {}).get(path or "", {}).values():
            problems.append(f"{op} on {path} failed, yet no gate key of it is marked failed")
            break
    return problems


# Fields added to the model after records were written: left out of the hash while unset, so a
# descriptor that does not use them keeps the hash (and the records) it had.
_HASHED_WHEN_SET = (
    ("capabilities", "features"),
    ("kernels", "flaggems", "constraints"),
    ("kernels", "vendor", "constraints"),
    ("kernels", "emulated", "constraints"),
)


def descriptor_hash(descriptor: PlatformDescriptor) -> str:
    """`sha256:<hex>` of the canonical JSON of the validated model."""
    data = descriptor.model_dump(mode="json")
    for *sections, name in _HASHED_WHEN_SET:
        part = data
        for section in sections:
            part = part.get(section) or {}
        if name in part and not part[name]:
            del part[name]
    canonical = json.dumps(data, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return "sha256:" + hashlib.sha256(canonical.encode("utf-8")).hexdigest()


def platform_sources(directory: Path) -> dict[str, str]:
    """Relative path -> `sha256:<hex>` of every Python source in a platform's folder.

    Vendor kernels live there (a vendor module must be a file inside the folder); hashing every
    source, not only the module the descriptor names, covers the helpers it imports.
    """
    folder = Path(directory)
    sources = {}
    for path in sorted(folder.rglob("*.py")):
        relative = path.relative_to(folder)
        if "__pycache__" in relative.parts or relative.parts[0] == RECORDS_DIR:
            continue
        try:
            sources[relative.as_posix()] = "sha256:" + hashlib.sha256(read_bounded(path, MAX_SOURCE_BYTES)).hexdigest()
        except RefusedFile as exc:
            sources[relative.as_posix()] = f"refused: {exc.reason}"  # binds nothing a record could match
    return sources


def record_path(directory: Path, torch_line: str) -> Path:
    """Where the record of `directory`'s platform for `torch_line` ("2.13") lives."""
    return Path(directory) / RECORDS_DIR / f"torch-{torch_line}.json"


def evidence_path(record_file: Path) -> Path:
    """The evidence file beside a record: every case of its run, one JSON object a line, gzipped."""
    return Path(record_file).with_name(Path(record_file).stem + ".cases.jsonl.gz")


def load_raw(path: Path) -> dict[str, Any]:
    """The JSON object of a record file, read within bounds, its format not checked; anything else
    is a RecordError naming the file."""
    try:
        raw = load_json(path, MAX_RECORD_BYTES)
    except RefusedFile as exc:
        raise RecordError(str(exc)) from None
    if not isinstance(raw, dict):
        raise RecordError(f"{path}: expected a JSON object, got {type(raw).__name__}")
    return raw


def _read_record(path: Path) -> tuple[Record, dict[str, Any]]:
    raw = load_raw(path)
    if raw.get("format") != RECORD_FORMAT:
        raise RecordError(
            f"{path}: record format {str(raw.get('format'))[:20]}, this torch-fl reads format {RECORD_FORMAT}; "
            "make a new record with `torch-fl conformance run`"
        )
    try:
        return Record.model_validate(raw), raw
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        raise RecordError(f"{path}: {where}: {first['msg']} ({exc.error_count()} problem(s))") from None


def load_record_file(path: Path) -> Record:
    """The record in `path`; a missing or malformed file is a RecordError that names it."""
    return _read_record(Path(path))[0]


def load_record(directory: Path, torch_line: str) -> Record | None:
    """The record for `torch_line`, None when there is none; a malformed file is a RecordError."""
    path = record_path(directory, torch_line)
    return load_record_file(path) if path.is_file() else None


def load_evidence(record_file: Path) -> list[Case]:
    """Every case of the run a record was made from (its evidence file), checked against its hash."""
    record, _ = _read_record(Path(record_file))
    if record.evidence is None:
        return list(record.failures)
    name = record.evidence.file
    if not name or Path(name).name != name or name in (".", ".."):
        raise RecordError(f"{record_file}: evidence.file {clip(name, 200)!r} is not a file name beside the record")
    path = Path(record_file).with_name(name)
    try:
        data = read_bounded(path, MAX_EVIDENCE_BYTES)
    except RefusedFile as exc:
        raise RecordError(f"{exc}: the evidence of {record_file}") from None
    if "sha256:" + hashlib.sha256(data).hexdigest() != record.evidence.sha256:
        raise RecordError(f"{path}: does not match the hash {record_file} binds (edited or from another run)")
    try:
        unpacked = zlib.decompressobj(wbits=31).decompress(data, MAX_EVIDENCE_BYTES + 1)  # gzip, bounded
        if len(unpacked) > MAX_EVIDENCE_BYTES:
            raise ValueError(f"more than {MAX_EVIDENCE_BYTES >> 20} MiB unpacked")
        return [Case.model_validate_json(line) for line in unpacked.splitlines() if line.strip()]
    except (OSError, ValidationError, ValueError, zlib.error) as exc:
        raise RecordError(f"{path}: unreadable evidence: {str(exc)[:200]}") from None


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
    file: Path | None = None


def binding_differences(binding: Binding, expected: Binding) -> list[str]:
    """What changed between the run a record binds and this machine and checkout."""
    reasons: list[str] = []
    if binding.descriptor_hash != expected.descriptor_hash:
        reasons.append("descriptor changed since the record was made (hash differs)")
    if expected.torch and binding.torch != expected.torch:
        reasons.append(f"torch line differs: record is for {binding.torch}, installed is {expected.torch}")
    for name in sorted(set(binding.kernel_libraries) | set(expected.kernel_libraries)):
        recorded, now = binding.kernel_libraries.get(name), expected.kernel_libraries.get(name)
        if recorded is None:
            reasons.append(f"{name} is declared but the record did not check it")
        elif now is None:
            reasons.append(f"{name} is no longer declared (the record checked {recorded})")
        elif now != recorded:
            reasons.append(f"{name} differs: record has {recorded}, installed: {now}")
    for source in sorted(set(binding.sources) | set(expected.sources)):
        recorded, now = binding.sources.get(source), expected.sources.get(source)
        if recorded != now:
            what = "is new" if recorded is None else "was removed" if now is None else "changed"
            reasons.append(f"platform source {source} {what} since the record was made")
    return reasons


def expected_binding(
    descriptor: PlatformDescriptor,
    directory: Path,
    torch_version: str | None,
    kernel_versions: Mapping[str, str | None],
) -> Binding:
    """The binding a record made here and now would have."""
    return Binding(
        descriptor_hash=descriptor_hash(descriptor),
        torch=minor_line(torch_version) if torch_version else "",
        torch_version=torch_version or "",
        kernel_libraries={name: version or "not installed" for name, version in kernel_versions.items()},
        sources=platform_sources(directory),
    )


def record_status(
    descriptor: PlatformDescriptor,
    directory: Path,
    torch_version: str | None,
    kernel_versions: Mapping[str, str | None],
) -> RecordStatus:
    """Compare the record for `torch_version`'s line with the descriptor, its folder and the installed kernels.

    `kernel_versions` maps each kernel library to its installed version (None: not installed).
    With no record for this torch line but one for another line, the newest other record is
    returned as stale (the torch line differs); with none at all, the state is "missing". An
    unreadable record is stale and an edited one tampered, so callers that only gate never have
    to handle RecordError.
    """
    line = minor_line(torch_version) if torch_version else None
    candidates = ([line] if line and record_path(directory, line).is_file() else []) or record_lines(directory)[:1]
    if not candidates:
        why = f"no {RECORDS_DIR}/torch-{line}.json" if line else "no record, and torch is not installed"
        return RecordStatus("missing", [why], None, line)
    path = record_path(directory, candidates[0])
    try:
        record, raw = _read_record(path)
    except RecordError as exc:
        # An unreadable record proves nothing, but must not stop native and cpu from running.
        return RecordStatus("stale", [f"unreadable record: {exc}"], None, candidates[0], path)
    tampered = inconsistencies(record, raw)
    if tampered:
        return RecordStatus("tampered", [f"{path}: {p}" for p in tampered], None, record.torch, path)
    reasons: list[str] = []
    if record.platform != descriptor.name:
        reasons.append(f"record is for platform {record.platform!r}")
    if line is None:
        reasons.append(f"torch is not installed (record is for torch {record.torch})")
    reasons += binding_differences(
        record.binding, expected_binding(descriptor, directory, torch_version, kernel_versions)
    )
    if not record.complete:
        reasons.append("the conformance run did not complete")
    return RecordStatus("stale" if reasons else "valid", reasons, record, record.torch, path)


def current_status(descriptor: PlatformDescriptor) -> RecordStatus:
    """The record status against the torch and kernel libraries installed here (nothing imported)."""
    if descriptor.directory is None:
        raise ValueError("the descriptor was not loaded from a file, so it has no records")
    return record_status(
        descriptor, descriptor.directory, installed_version("torch"), installed_kernel_versions(descriptor)
    )
