"""The route table, `platforms/<name>/routes.yaml`: the default candidate order, then the exceptions:
per aten overload, its own ordered candidate paths and, optionally, a per-shape-bucket choice
written by the tuner, each with its provenance (the reason it differs from the default).

The file is read and rewritten with ruamel.yaml round-tripping, so a person's comments and key
order survive `torch-fl routes tune` and `torch-fl onboard`.

    format: 1
    default: [native, flaggems, cpu]   # every op without an entry; a path only where it offers the op
    ops:
      aten::mm:
        candidates: [native, flaggems]
        provenance: {source: onboard}
        buckets:                       # written by the tuner
          - max_numel: 1048576         # largest input has at most this many elements
            dtype: bfloat16            # of the first tensor argument; left out: any dtype
            choice: native
            measured_us: {native: 11.8, flaggems: 96.1}
            provenance: {source: tune, workload: bench/train_step.py, at: "2026-12-02T12:00:00Z"}
"""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any, Optional

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from torch_fl.fileio import RefusedFile, read_bounded, write_atomically
from torch_fl.platform.descriptor import KERNEL_SETS
from torch_fl.platform.errors import DescriptorError, Issue, short
from torch_fl.platform.loader import locate, validation_issues
from torch_fl.platform.yaml_source import YamlDocument, YamlInputError, decode, parse_yaml

FORMAT = 1
MAX_TABLE_BYTES = 512 << 10  # a tuned entry takes a few hundred bytes: a thousand ops fit


class RouteTableError(ValueError):
    """A routes.yaml that cannot be used; the message names the file and the entry."""


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Provenance(_Model):
    source: str = Field(description="onboard, tune, person, file, env or api")
    note: Optional[str] = None
    workload: Optional[str] = None
    record: Optional[str] = Field(None, description="The conformance record the choice relied on.")
    at: Optional[str] = None


class Bucket(_Model):
    max_numel: int = Field(ge=0, description="Upper bound on the element count of the largest tensor input.")
    dtype: Optional[str] = Field(
        None, description="The first tensor argument's dtype (float32, bfloat16...); none: any."
    )
    choice: str
    measured_us: dict[str, float] = Field(default_factory=dict)
    provenance: Optional[Provenance] = None


class OpRoute(_Model):
    candidates: list[str] = Field(min_length=1)
    provenance: Optional[Provenance] = None
    buckets: list[Bucket] = Field(default_factory=list)

    def bucket_for(self, numel: int, dtype: Optional[str] = None) -> Optional[Bucket]:
        """The first bucket of `dtype` (or of any dtype) that `numel` elements fit in."""
        for bucket in self.buckets:
            if numel <= bucket.max_numel and (bucket.dtype is None or bucket.dtype == dtype):
                return bucket
        return None


class RouteTable(_Model):
    format: int = FORMAT
    default: Optional[list[str]] = Field(
        None,
        min_length=1,
        description="Candidate order of every op without an entry; none: the descriptor's routes.defaults.",
    )
    ops: dict[str, OpRoute] = Field(default_factory=dict)

    def candidates(self, op: str) -> Optional[list[str]]:
        """The order the table gives `op`: its entry's, else the table's default; None when it gives none."""
        if op in self.ops:
            return list(self.ops[op].candidates)
        return None if self.default is None else list(self.default)


def _yaml() -> Any:
    """ruamel's round-trip YAML, for writing tables and for naming a syntax error's place."""
    from ruamel.yaml import YAML

    yaml = YAML()
    yaml.preserve_quotes = True
    yaml.indent(mapping=2, sequence=4, offset=2)
    yaml.width = 120
    return yaml


def unknown_path(name: str) -> str | None:
    """Why `name` is not an execution path, or None when it is one."""
    if name in KERNEL_SETS:
        return None
    return f"unknown path {short(name)}; expected {', '.join(KERNEL_SETS[:-1])} or {KERNEL_SETS[-1]}"


def _path_issues(table: RouteTable) -> list[Issue]:
    issues = [
        Issue(problem, ("default", i)) for i, name in enumerate(table.default or []) if (problem := unknown_path(name))
    ]
    for op, route in table.ops.items():
        if not op.startswith("aten::") and "::" not in op:
            issues.append(Issue(f"expected a qualified op name such as aten::mm; got {short(op)}", ("ops", op)))
        places: list[tuple[tuple[str | int, ...], str]] = [
            (("ops", op, "candidates", i), name) for i, name in enumerate(route.candidates)
        ]
        places += [(("ops", op, "buckets", i, "choice"), b.choice) for i, b in enumerate(route.buckets)]
        issues += [Issue(problem, loc) for loc, name in places if (problem := unknown_path(name))]
    return issues


def parse(text: str, where: str) -> RouteTable:
    """The table in `text`, read from `where`; a RouteTableError names `where:line: field: problem` per problem."""
    return parse_document(text, where)[0]


def parse_document(text: str, where: str) -> tuple[RouteTable, YamlDocument]:
    """`parse`, and the parsed document, which locates the lines of problems found later."""
    path = Path(where)
    try:
        doc = parse_yaml(text, path)  # libyaml: tables are read during `import torch`
        data = {} if doc.data is None else doc.data
        if not isinstance(data, dict):
            raise DescriptorError([Issue("expected a mapping with format and ops", line=1)], file=path)
        try:
            table = RouteTable.model_validate(_plain(data))
        except ValidationError as exc:
            raise DescriptorError(validation_issues(exc, doc), file=path) from None
        issues = _path_issues(table)
        if issues:
            raise DescriptorError(locate(issues, doc), file=path)
    except DescriptorError as exc:
        raise RouteTableError(str(exc)) from None
    return table, doc


def load(path: Path) -> RouteTable:
    """The table at `path`; a missing file is an empty table (every op uses the defaults)."""
    return load_document(path)[0]


def load_document(path: Path) -> tuple[RouteTable, YamlDocument | None]:
    """`load`, and the parsed document (None for a missing file)."""
    if not path.exists():
        return RouteTable(), None
    return parse_document(read_text(path), str(path))


def read_text(path: Path) -> str:
    """The text of the route table at `path`, read within bounds; a RouteTableError names what is wrong."""
    try:
        return decode(read_bounded(path, MAX_TABLE_BYTES))
    except RefusedFile as exc:
        raise RouteTableError(str(DescriptorError(exc.reason, file=path))) from None
    except YamlInputError as exc:
        raise RouteTableError(str(DescriptorError([Issue(str(exc), line=exc.line)], file=path))) from None


def _plain(data: Any) -> Any:
    if isinstance(data, dict):
        return {str(k): _plain(v) for k, v in data.items()}
    if isinstance(data, list):
        return [_plain(v) for v in data]
    return data


def _compact(data: Any, key: str = "") -> Any:
    """Plain data -> ruamel nodes: short lists and leaf mappings on one line, empty buckets dropped."""
    from ruamel.yaml.comments import CommentedMap, CommentedSeq

    if isinstance(data, dict):
        items = {k: _compact(v, k) for k, v in data.items() if not (k == "buckets" and not v)}
        mapping = CommentedMap(items)
        if key in ("provenance", "measured_us"):
            mapping.fa.set_flow_style()
        return mapping
    if isinstance(data, list):
        node = CommentedSeq([_compact(v) for v in data])
        if key in ("candidates", "default"):
            node.fa.set_flow_style()
        return node
    return data


def dumps(table: RouteTable, header: str = "") -> str:
    buffer = io.StringIO()
    buffer.write(header)
    _yaml().dump(_compact(table.model_dump(exclude_none=True)), buffer)
    return buffer.getvalue()


def save(table: RouteTable, path: Path, header: str = "") -> None:
    """Write `table` to `path` atomically, keeping the existing file's comments where keys remain.

    `header` (comment lines) is used only when the file is new.
    """
    yaml = _yaml()
    document = yaml.load(read_text(path)) if path.exists() else None
    if document is None:
        write_atomically(path, dumps(table, header))
        return
    _merge(document, _compact(table.model_dump(exclude_none=True)))
    buffer = io.StringIO()
    yaml.dump(document, buffer)
    write_atomically(path, buffer.getvalue())


def _merge(target: Any, source: Any) -> None:
    """Update the round-trip mapping `target` in place so it equals `source`, keeping comments."""
    for key in list(target.keys()):
        if key not in source:
            del target[key]
    for key, value in source.items():
        if isinstance(value, dict) and isinstance(target.get(key), dict):
            _merge(target[key], value)
        elif target.get(key) != value:
            target[key] = value
