"""Version specifiers as descriptors use them (`>=2.11`, `==5.0.2`, `>=3.10,<3.13`, `==2.11.*`).

Written here rather than taken from `packaging` because the preflight must run in the
environment it is checking, which may lack any package beyond the CLI's own. Versions compare
by their release numbers only: pre-release and local tags (`2.13.0a0`, `+cpu`) are ignored,
which is what a descriptor means by "torch 2.13".
"""

from __future__ import annotations

import re

_CLAUSE = re.compile(r"^\s*(~=|===|==|!=|<=|>=|<|>)\s*(\d+(?:\.\d+)*)(\.\*)?\s*$")
SPEC_PATTERN = (
    r"^\s*(~=|===|==|!=|<=|>=|<|>)\s*\d+(\.\d+)*(\.\*)?\s*(,\s*(~=|===|==|!=|<=|>=|<|>)\s*\d+(\.\d+)*(\.\*)?\s*)*$"
)
"""What a descriptor's version specifier must look like (used by the model and its JSON Schema)."""


def release(version: str) -> tuple[int, ...]:
    """`"2.13.0+cpu"` -> `(2, 13, 0)`; the leading dotted numbers of a version string."""
    match = re.match(r"^\s*v?(\d+(?:\.\d+)*)", version)
    if match is None:
        raise ValueError(f"not a version: {version!r}")
    return tuple(int(p) for p in match.group(1).split("."))


def minor_line(version: str) -> str:
    """`"2.13.0+cpu"` -> `"2.13"`: the torch line a conformance record is made for."""
    parts = release(version)
    return ".".join(str(p) for p in (parts + (0,))[:2])


def _pad(a: tuple[int, ...], n: int) -> tuple[int, ...]:
    return a + (0,) * (n - len(a))


def _clause_holds(found: tuple[int, ...], op: str, wanted: tuple[int, ...], wildcard: bool) -> bool:
    if wildcard:
        prefix = _pad(found, len(wanted))[: len(wanted)] == wanted
        if op == "==":
            return prefix
        if op == "!=":
            return not prefix
        raise ValueError(f"'.*' is only allowed with == and !=, not {op}")
    n = max(len(found), len(wanted))
    f, w = _pad(found, n), _pad(wanted, n)
    if op in ("==", "==="):
        return f == w
    if op == "!=":
        return f != w
    if op == ">=":
        return f >= w
    if op == "<=":
        return f <= w
    if op == ">":
        return f > w
    if op == "<":
        return f < w
    # ~=X.Y.Z means >=X.Y.Z and ==X.Y.*
    if len(wanted) < 2:
        raise ValueError("~= needs at least two version numbers")
    return f >= w and found[: len(wanted) - 1] == wanted[:-1]


def satisfies(version: str, spec: str) -> bool:
    """True when `version` meets every comma-separated clause of `spec` (empty spec: always)."""
    found = release(version)
    for clause in filter(str.strip, spec.split(",")):
        match = _CLAUSE.match(clause)
        if match is None:
            raise ValueError(f"not a version specifier: {clause.strip()!r}")
        op, number, star = match.groups()
        if not _clause_holds(found, op, release(number), bool(star)):
            return False
    return True
