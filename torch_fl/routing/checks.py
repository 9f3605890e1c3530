"""Everything that chooses routes, checked when a platform activates: the FLAGOS_ROUTE_<op> and
FLAGOS_ROUTE_DEFAULTS variables, FLAGOS_ROUTES, and each entry of the route table in use.

The router itself skips what cannot run (an unknown op, an undeclared path), so without these
checks a typo would silently change nothing. Each problem names the variable, or the file and
line; activation warns with each once, or, under FLAGOS_STRICT=1, refuses to start.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

import torch

from torch_fl.platform import PlatformDescriptor
from torch_fl.platform.errors import DescriptorError, Issue, PlatformError, clip, short
from torch_fl.platform.loader import locate, op_exists
from torch_fl.routing import overrides
from torch_fl.routing import table as route_table
from torch_fl.routing.table import RouteTable, RouteTableError, unknown_path

SHOWN = 5
"""Route-table problems named one by one at activation; the rest are counted in one more line, so a
table of ten thousand bad entries does not print ten thousand warnings."""


class RoutingError(PlatformError):
    """Routing settings that cannot be used, under FLAGOS_STRICT=1; one problem per line."""


@dataclass
class RoutingCheck:
    """The problems found, and the route table to activate with (empty where it cannot be read, so
    a platform whose table is broken still activates with its descriptor's routes)."""

    problems: list[str] = field(default_factory=list)
    table: RouteTable = field(default_factory=lambda: RouteTable())
    source: str = "no route table"

    def enforce(self, strict: bool) -> None:
        """Raise a RoutingError listing every problem when `strict` (FLAGOS_STRICT=1)."""
        if strict and self.problems:
            raise RoutingError("\n".join(self.problems) + "\n(FLAGOS_STRICT=1 makes these errors)")


def _path_problem(descriptor: PlatformDescriptor, op: Optional[str], path: str) -> Optional[str]:
    """Why `path` cannot serve `op` (any op when None) on this platform, or None."""
    unknown = unknown_path(path)
    if unknown is not None:
        return unknown
    if path not in descriptor.kernels.declared():
        return f"{short(path)}: {descriptor.name} declares no {path} kernels (kernels.{path} in platform.yaml)"
    vendor = descriptor.kernels.vendor
    if path == "vendor" and op is not None and vendor is not None and op not in vendor.ops:
        return f"'vendor': the vendor module has no kernel for {op} (kernels.vendor.ops in platform.yaml)"
    return None


def _op_problem(op: str) -> Optional[str]:
    if op_exists(torch, op):
        return None
    return f"unknown op {short(op)}: this torch has no such operator or overload"


def _variable_problems(descriptor: PlatformDescriptor) -> list[str]:
    problems = []
    for op in overrides.env_ops():
        variable = overrides.env_name(op)
        found = [_op_problem(op)] + [_path_problem(descriptor, op, p) for p in overrides.env_route(op)]
        problems += [f"{variable}: {problem}" for problem in found if problem]
    for path in overrides.env_defaults():
        problem = _path_problem(descriptor, None, path)
        if problem:
            problems.append(f"FLAGOS_ROUTE_DEFAULTS: {problem}")
    return problems


def _entry_issues(descriptor: PlatformDescriptor, table: RouteTable) -> list[Issue]:
    issues = []
    for op, route in table.ops.items():
        problem = _op_problem(op)
        if problem:
            issues.append(Issue(problem, ("ops", op)))
            continue
        for i, path in enumerate(route.candidates):
            problem = _path_problem(descriptor, op, path)
            if problem:
                issues.append(Issue(problem, ("ops", op, "candidates", i)))
        for i, bucket in enumerate(route.buckets):
            if bucket.choice not in route.candidates:
                issues.append(
                    Issue(
                        f"choice {short(bucket.choice)} is not among the candidates",
                        ("ops", op, "buckets", i, "choice"),
                    )
                )
    return issues


def check_routing(descriptor: PlatformDescriptor) -> RoutingCheck:
    """Check the routing variables and the route table `descriptor` activates with."""
    check = RoutingCheck(_variable_problems(descriptor))
    path = overrides.routes_file()
    if path is None:
        path = Path(descriptor.directory or ".") / descriptor.routes.file
        check.source = str(path)
    else:
        check.source = f"file {path} (FLAGOS_ROUTES)"
        if not path.is_file():
            check.problems.append(
                f"FLAGOS_ROUTES: {clip(str(path), 200)}: no such file; the route table is empty, "
                "so every op takes the descriptor's routes"
            )
            return check
    try:
        table, doc = route_table.load_document(path)
        check.table = table
        issues = _entry_issues(descriptor, table)  # in the file's order
        if issues and doc is not None:
            shown = locate(issues[:SHOWN], doc)
            check.problems += str(DescriptorError(shown, file=path)).splitlines() + _more(path, len(issues))
    except (RouteTableError, DescriptorError) as exc:
        lines = str(exc).splitlines()
        check.problems += lines[:SHOWN] + _more(path, len(lines))
    return check


def _more(path: Path, count: int) -> list[str]:
    """The line that counts the problems past the first SHOWN, if there are any."""
    return [f"{path}: {count - SHOWN} more problems in this route table"] if count > SHOWN else []
