"""`triage` proposes the declared limit that would exclude a failure group (torch_fl.platform.proposal),
and that limit, once declared, is what the record's gate accepts."""

from __future__ import annotations

from typing import Any

from torch_fl.platform.proposal import proposals, propose
from torch_fl.platform.record import Case, outside_constraints


def mm_case(name: str, status: str, m: int, k: int, n: int, *, keys: list[str] | None = None) -> Case:
    key = "float32@small"
    extents = {"numel": [m * n, m * n], "rank": [2, 2], "last": [max(k, n), max(k, n)]}
    extents |= {"M": [m, m], "K": [k, k], "N": [n, n]}
    return Case(
        id=f"sweep/aten::mm/float32/vendor/{name}",
        suite="sweep",
        op="aten::mm",
        dtype="float32",
        path="vendor",
        status=status,
        keys=[key] if keys is None else keys,
        extents={key: extents} if keys is None else {},
    )


def test_a_one_dimension_threshold_gets_a_max_on_that_dimension() -> None:
    passing = [mm_case(f"k{k}", "passed", 8, k, 8) for k in (1, 7, 63, 255, 511)]
    passing += [mm_case(f"m{m}", "passed", m, 16, 16) for m in (1023, 4096, 8193)]
    failing = [mm_case(f"k{k}", "timeout", 8, k, 8) for k in (512, 1025, 8191)]
    found = propose("aten::mm", "vendor", failing, passing + failing)
    assert found is not None
    assert (found.dim, found.side, found.bound) == ("K", "max", 511)
    assert (found.excludes, found.keeps, found.passing) == (3, 8, 8)
    # declared as proposed, every failing case lies outside it: the gate refuses nothing for them
    declared = {"vendor": {"aten::mm": {"K": {"max": found.bound}}}}
    assert all(outside_constraints(c.model_dump(), declared) for c in failing)
    assert not any(outside_constraints(c.model_dump(), declared) for c in passing)


def test_a_failure_below_a_size_gets_a_min() -> None:
    passing = [mm_case(f"m{m}", "passed", m, 64, 64) for m in (65, 128, 1025)]
    failing = [mm_case(f"m{m}", "failed", m, 64, 64) for m in (1, 7, 63)]
    found = propose("aten::mm", "vendor", failing, passing + failing)
    assert found is not None
    assert (found.dim, found.side, found.bound, found.keeps) == ("M", "min", 64, 3)


def test_limits_the_evidence_cannot_tell_apart_are_offered_together() -> None:
    passing = [mm_case(f"s{n}", "passed", n, n, n) for n in (7, 31, 63)]
    failing = [mm_case("s255", "timeout", 127, 255, 129)]  # M, N and K all grew past what passed
    found = propose("aten::mm", "vendor", failing, passing + failing)
    assert found is not None and found.keeps == 3
    offered = {(found.dim, found.bound), *((d, b) for d, side, b in found.alike if side == "max")}
    assert {("M", 126), ("K", 254), ("N", 128)} <= offered
    assert all(d != found.dim or b != found.bound for d, _, b in found.alike)


def test_no_proposal_when_failures_lie_on_both_sides_of_every_pass() -> None:
    passing = [mm_case("a", "passed", 32, 32, 32)]
    failing = [mm_case("b", "failed", 16, 16, 16), mm_case("c", "failed", 64, 64, 64)]
    assert propose("aten::mm", "vendor", failing, passing + failing) is None


def test_no_proposal_for_a_case_that_died_before_its_first_call() -> None:
    passing = [mm_case("a", "passed", 16, 16, 16)]
    failing = [mm_case("c", "crashed", 0, 0, 0, keys=[])]
    assert propose("aten::mm", "vendor", failing, passing + failing) is None


def test_native_failures_get_no_proposal_and_groups_split_by_op_and_path() -> None:
    native = mm_case("n", "failed", 8, 600, 8).model_copy(update={"path": "native"})
    passing = [mm_case("a", "passed", 8, 100, 8)]
    failing = [mm_case("f", "failed", 8, 600, 8), native]
    found: list[dict[str, Any]] = proposals(failing, passing + failing)
    assert [(p["op"], p["path"], p["dim"], p["bound"]) for p in found] == [("aten::mm", "vendor", "K", 599)]
    assert "aten::mm: {K: {max: 599}}" in found[0]["yaml"]
