"""The suite survives and names every way a vendor kernel can be broken (fixtures/broken_chip).

One real run of `torch-fl conformance run broken_chip` (two workers, a 5 s case limit) over the
OpInfos that reach the broken kernels: a segfault and a hang each cost a worker, and the run
must still finish, with each failure recorded under its op, dtype and path, with the right
status and a message saying what was wrong; and the record it writes must make the loader's gate
enable exactly the vendor routes whose cases all passed.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest
from conformance_helpers import FIXTURES, cases_by_id, conformance, run_env

pytestmark = pytest.mark.slow  # a whole conformance run of the planted-defect chip

ITEMS = [
    "abs-float32",
    "exp-float32",
    "mul-float16",
    "mul-float32",
    "sin-float32",
    "sub-float32",
    "bernoulli-float32",
    "nn.functional.relu-float32",
    "cos-float32",
]


@pytest.fixture(scope="module")
def broken_run(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    # a copy of the fixture, so its record lands beside the sources it binds
    plats = tmp_path_factory.mktemp("plats")
    shutil.copytree(FIXTURES / "broken_chip", plats / "broken_chip")
    selection = " or ".join(f"test_op[{item}]" for item in ITEMS)
    out = conformance(
        # --add: the record the gate reads, started by this subset
        [
            "broken_chip",
            "--suite",
            "ops",
            "-k",
            selection,
            "--paths",
            "native,vendor",
            "-n",
            "2",
            "--timeout",
            "5",
            "--add",
        ],
        run_env(FLAGOS_PLATFORM_PATH=str(plats)),
        timeout=900,
    )
    records = plats / "broken_chip" / "records"
    return {"out": out, "records": records, "plats": plats, "cases": cases_by_id(Path(out["record"]))}


FAILING = ("crashed", "timeout", "failed", "error")


def _case(run: dict[str, Any], item: str, op: str, path: str = "vendor") -> dict[str, Any]:
    """The case of one item x path x op, its gate keys' cases (`<id>/<key>`) taken together: the
    worst status among them, and the messages of those that did not pass."""
    name, dtype = item.rsplit("-", 1)
    case_id = f"ops/{name}/{dtype}/{path}/{op}" if path != "native" else f"ops/{name}/{dtype}/native"
    parts = [c for i, c in run["cases"].items() if i == case_id or i.startswith(case_id + "/")]
    assert parts, f"{case_id} is not in the record; vendor cases: {sorted(i for i in run['cases'] if '/vendor/' in i)}"
    statuses = [c["status"] for c in parts]
    worst = next((s for s in FAILING if s in statuses), "passed" if "passed" in statuses else statuses[0])
    bad = [c for c in parts if c["status"] != "passed"]
    return {
        "id": case_id,
        "status": worst,
        "message": "; ".join(c["message"] for c in bad),
        "fingerprint": next((c["fingerprint"] for c in bad if c["fingerprint"]), None),
        "parts": parts,
    }


def test_the_run_completes_and_writes_record_and_summary(broken_run):
    out = broken_run["out"]
    assert out["ok"] and out["complete"], out
    assert Path(out["record"]) == broken_run["records"] / Path(out["record"]).name
    assert Path(out["summary"]).read_text().startswith("# Conformance: broken_chip")
    # every item's plain (native) case is there: nothing was lost to the crashes
    for item in ITEMS:
        assert _case(broken_run, item, "", "native")["status"] == "passed", item


def test_segfault_is_crashed(broken_run):
    case = _case(broken_run, "abs-float32", "aten::abs")
    assert case["status"] == "crashed", case
    assert "Segmentation fault" in case["message"] and "kernels.py" in case["message"], case["message"]
    assert case["fingerprint"]


def test_hang_is_timeout(broken_run):
    case = _case(broken_run, "exp-float32", "aten::exp")
    assert case["status"] == "timeout", case
    assert "hung" in case["message"] and "5 s" in case["message"], case["message"]


def test_wrong_values_in_one_dtype_only(broken_run):
    bad = _case(broken_run, "mul-float16", "aten::mul.Tensor")
    assert bad["status"] == "failed" and "elements differ" in bad["message"], bad
    good = _case(broken_run, "mul-float32", "aten::mul.Tensor")
    assert good["status"] == "passed", good


def test_wrong_strides(broken_run):
    case = _case(broken_run, "sin-float32", "aten::sin")
    assert case["status"] == "failed" and "strides" in case["message"], case


def test_inplace_that_is_not_in_place(broken_run):
    case = _case(broken_run, "sub-float32", "aten::sub_.Tensor")
    assert case["status"] == "failed", case
    assert "not 'self'" in case["message"], case["message"]


def test_ignored_out(broken_run):
    case = _case(broken_run, "sub-float32", "aten::sub.out")
    assert case["status"] == "failed", case
    assert "not 'out'" in case["message"], case["message"]


def test_nondeterministic_random_op(broken_run):
    case = _case(broken_run, "bernoulli-float32", "aten::bernoulli")
    assert case["status"] == "failed" and "not reproducible" in case["message"], case


def test_device_poisoning_error_fails_its_case_and_the_item_goes_on(broken_run):
    case = _case(broken_run, "cos-float32", "aten::cos")
    assert case["status"] == "failed" and "illegal memory access" in case["message"], case
    # the worker ended itself after journaling that case; the re-queued item finished in a fresh one
    later = [
        c
        for i, c in broken_run["cases"].items()
        if i.startswith("ops/cos/float32/vendor/") and not i.startswith(case["id"])
    ]
    assert later and all(c["status"] in ("passed", "skipped") for c in later), later


def test_correct_kernel_passes(broken_run):
    assert _case(broken_run, "nn.functional.relu-float32", "aten::relu")["status"] == "passed"


def test_gate_enables_exactly_the_passed_vendor_combinations(broken_run):
    from torch_fl.platform import Gate, load_platform, record_status
    from torch_fl.platform.discovery import discover
    from torch_fl.platform.record import installed_version, without_size

    descriptor = load_platform("broken_chip", discover(str(broken_run["plats"])))
    status = record_status(descriptor, broken_run["records"].parent, installed_version("torch"), {})
    assert status.state == "valid", status.reasons
    gate = Gate(descriptor, status)
    outcome: dict[tuple[str, str], bool] = {}
    for case in broken_run["cases"].values():
        if case["path"] == "vendor" and case["status"] not in ("skipped", "unjudged"):
            for key in case["keys"]:
                outcome[(case["op"], key)] = outcome.get((case["op"], key), True) and case["status"] == "passed"
    assert outcome[("aten::relu", "float32@tiny")]
    assert not any(passed for (op, _), passed in outcome.items() if op == "aten::abs")
    # a key that failed at one size refuses its op and dtypes at every size, the passed ones included
    refused = {(op, without_size(key)) for (op, key), passed in outcome.items() if not passed}
    for (op, key), passed in outcome.items():
        expected = passed and (op, without_size(key)) not in refused
        assert gate.allows(op, key, "vendor") == expected, (op, key, passed)
    assert not gate.allows("aten::relu", "float16@tiny", "vendor"), "a key never run must stay disabled"
