"""Incremental re-validation: after an edit of platform sources, re-run only the cases it decides.

What decides a case:

- descriptor fields and the torch line decide every case (a change needs a full run);
- a kernel library's version decides its path's cases (flaggems);
- a platform source decides the vendor cases of the ops whose kernels it holds, or every vendor
  case when that is not certain (see `sources_decide`).

The vendor cases of an op are the only cases its kernel decides: workers pin every routed op to
native, so only suites that force an op onto a path (ops, sweep, captured, workload) reach a
vendor kernel, and each such case names its op and path.

`plan` is the run that re-validates a complete record stale only because platform sources
changed: the items of the changed ops' vendor cases (by node id), on the vendor path, added to the
record (--add) with those ops' old vendor cases dropped first, so the new verdicts replace them.
"""

from __future__ import annotations

import ast
import importlib.util
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from torch_fl.platform.descriptor import PlatformDescriptor
from torch_fl.platform.record import (
    Binding,
    Record,
    binding_differences,
    inconsistencies,
    load_raw,
    platform_sources,
)

EVERY = "*"
"""The op list of a source that decides every vendor case."""
VENDOR = "vendor"


def sources_decide(descriptor: PlatformDescriptor) -> dict[str, list[str]]:
    """Platform source -> the vendor ops whose cases it decides (`[EVERY]`: every vendor case).

    A source decides only its own ops when it is certain that nothing else depends on it: the
    vendor module imports those ops' functions from it by name (`from kernels_b import silu`) and
    uses them nowhere else, no other source imports it, and its top level only defines functions,
    binds literals and imports modules that exist. Everything else decides every vendor case: the
    vendor module itself (its top level binds every function), helpers, unreadable files.
    """
    assert descriptor.directory is not None, "a loaded descriptor knows its folder"
    folder = Path(descriptor.directory)
    sources = sorted(platform_sources(folder))
    decide: dict[str, list[str]] = {source: [EVERY] for source in sources}
    vendor = descriptor.kernels.vendor
    trees = {source: _parse(folder / source) for source in sources}
    module_tree = trees.get(vendor.module) if vendor is not None else None
    if vendor is None or module_tree is None or any(tree is None for tree in trees.values()):
        return decide
    module = vendor.module
    homes = _function_homes(module_tree, module, set(sources))
    op_homes = {op: homes.get(function) for op, function in vendor.ops.items()}
    if any(home is None for home in op_homes.values()):
        return decide  # a function bound some other way may wrap any of the others
    used = {node.id for node in ast.walk(module_tree) if isinstance(node, ast.Name)}
    for source in sources:
        ops = sorted(op for op, home in op_homes.items() if home == source)
        names = {name for name, home in homes.items() if home == source}
        importers = [other for other in sources if other != source and _mentions(trees[other], source)]
        if (
            ops
            and source != module
            and importers == [module]
            and all(isinstance(node, ast.ImportFrom) for node in _mentions(module_tree, source))
            and names <= {vendor.ops[op] for op in ops}
            and not names & used
            and _only_definitions(trees[source], set(sources))
        ):
            decide[source] = ops
    return decide


def _parse(path: Path) -> ast.Module | None:
    try:
        return ast.parse(path.read_bytes(), filename=str(path))
    except (SyntaxError, ValueError, OSError):
        return None


def _source_of(name: str, sources: set[str]) -> str | None:
    """The platform source an absolute import of `name` loads, if it is one."""
    base = name.replace(".", "/")
    return next((f for f in (f"{base}.py", f"{base}/__init__.py") if f in sources), None)


def _function_homes(tree: ast.Module, module: str, sources: set[str]) -> dict[str, str | None]:
    """Name -> the source its top-level binding in the vendor `module` comes from (None: not known)."""
    homes: dict[str, str | None] = {}
    for statement in tree.body:
        if isinstance(statement, (ast.FunctionDef, ast.AsyncFunctionDef)):
            homes[statement.name] = module
        elif isinstance(statement, ast.ImportFrom) and statement.level == 0 and statement.module:
            home = _source_of(statement.module, sources)
            for alias in statement.names:
                homes[alias.asname or alias.name] = home
        else:
            for node in ast.walk(statement):
                for name in _bound_names(node):
                    homes[name] = None
    return homes


def _bound_names(node: ast.AST) -> list[str]:
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return [node.name]
    if isinstance(node, (ast.Import, ast.ImportFrom)):
        return [(a.asname or a.name).split(".")[0] for a in node.names]
    if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
        return [node.id]
    return []


def _mentions(tree: ast.Module | None, source: str) -> list[ast.AST]:
    """The nodes of `tree` that import `source`, or name its module in a string (as a loader would)."""
    stem = Path(source).stem
    found: list[ast.AST] = []
    for node in ast.walk(tree) if tree is not None else ():
        if isinstance(node, ast.ImportFrom) and (node.level or (node.module or "").split(".")[-1] == stem):
            found.append(node)
        elif isinstance(node, ast.Import) and any(a.name.split(".")[-1] == stem for a in node.names):
            found.append(node)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and stem in node.value:
            found.append(node)
    return found


def _only_definitions(tree: ast.Module | None, sources: set[str]) -> bool:
    """Is importing this file certain to only define things (so it cannot break the other kernels)?"""
    for statement in tree.body if tree is not None else [ast.Pass()]:
        if isinstance(statement, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        if isinstance(statement, ast.Expr) and isinstance(statement.value, ast.Constant):
            continue  # a docstring
        if isinstance(statement, (ast.Assign, ast.AnnAssign)) and statement.value is not None:
            if _literal(statement.value):
                continue
            return False
        if isinstance(statement, ast.Import) and all(_findable(a.name, sources) for a in statement.names):
            continue
        if isinstance(statement, ast.ImportFrom) and statement.level == 0 and _findable(statement.module, sources):
            continue
        return False
    return True


def _literal(node: ast.expr) -> bool:
    try:
        ast.literal_eval(node)
    except ValueError:
        return False
    return True


def _findable(name: str | None, sources: set[str]) -> bool:
    """Is an imported module there (found without importing it), and not a platform source?"""
    if not name or name == "__future__":
        return bool(name)
    if _source_of(name, sources) is not None:
        return False  # another platform source: it could break this one's import
    try:
        return importlib.util.find_spec(name.split(".")[0]) is not None
    except (ImportError, ValueError):
        return False


@dataclass(frozen=True)
class Plan:
    """An incremental run: the changed sources, the ops whose vendor cases they decide, the pytest
    items (node ids) that re-run those cases, and their suites."""

    changed: list[str]
    ops: list[str]
    items: list[str]
    suites: list[str]

    def as_dict(self) -> dict[str, Any]:
        return {"changed": self.changed, "ops": self.ops, "suites": self.suites, "items": len(self.items)}


def changed_sources(recorded: dict[str, str], now: dict[str, str]) -> list[str]:
    """Sources changed, added or removed between a record's binding and the folder now."""
    return sorted(s for s in set(recorded) | set(now) if recorded.get(s) != now.get(s))


def decided_ops(
    changed: list[str], before: dict[str, list[str]], now: dict[str, list[str]], ops: list[str]
) -> list[str]:
    """The vendor ops whose cases the changed sources decide, by the record's attribution and the
    current one (a source either does not know decides every case)."""
    decided: set[str] = set()
    for source in changed:
        for attribution in (before, now):
            decided |= set(ops) if EVERY in attribution.get(source, [EVERY]) else set(attribution[source])
    return sorted(decided & set(ops))


def plan(descriptor: PlatformDescriptor, record_file: Path, expected: Binding) -> Plan | None:
    """The incremental run for this record, or None when only a full run will do: no complete,
    intact record of this platform; something besides platform sources changed (descriptor, torch,
    kernel libraries); nothing changed; no vendor kernels; or cases it cannot attribute to items."""
    from torch_fl.platform.errors import RecordError
    from torch_fl.platform.record import load_evidence

    vendor = descriptor.kernels.vendor
    try:
        raw = load_raw(Path(record_file))
        record = Record.model_validate(raw)
        cases = load_evidence(record_file)
    except (OSError, ValueError, RecordError):
        return None
    if vendor is None or not record.complete or record.platform != descriptor.name or inconsistencies(record, raw):
        return None
    changed = changed_sources(record.binding.sources, expected.sources)
    same_sources = expected.model_copy(update={"sources": record.binding.sources})
    if not changed or binding_differences(record.binding, same_sources):
        return None
    ops = decided_ops(changed, record.sources_decide, sources_decide(descriptor), sorted(vendor.ops))
    rerun = [c for c in cases if c.path == VENDOR and (c.op is None or c.op in ops)]
    if not rerun or any(c.item is None for c in rerun):
        return None
    return Plan(changed, ops, costliest_first(rerun), sorted({c.suite for c in rerun}))


def costliest_first(cases: list[Any]) -> list[str]:
    """The items of `cases`, those whose cases took longest last time first: idle workers take the
    cheap ones from the end of a busy worker's queue, so no costly item is left for last."""
    seconds: dict[str, float] = {}
    for c in cases:
        seconds[c.item] = seconds.get(c.item, 0.0) + float(c.duration_s or 0.0)
    return sorted(seconds, key=lambda item: (-seconds[item], item))


def replaced(case: dict[str, Any], ops: frozenset[str]) -> bool:
    """Is this case of the record one an incremental run of `ops` re-runs (so its verdict goes)?"""
    return case.get("path") == VENDOR and (case.get("op") is None or case.get("op") in ops)
