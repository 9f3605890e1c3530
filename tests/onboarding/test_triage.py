"""`torch-fl triage` on synthetic records: kinds, grouping by fingerprint, and comparison with an older run."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest
from onboard_helpers import cli, make

from torch_fl.conformance import recordfile
from torch_fl.platform.loader import load_descriptor
from torch_fl.platform.record import Case, descriptor_hash, record_path
from torch_fl.platform.triage import classify, group_failures, read_baseline, read_record, triage


def case(
    id: str,
    status: str,
    message: str = "",
    *,
    suite: str = "ops",
    op: str | None = "aten::silu",
    dtype: str | None = "float32",
    path: str | None = "vendor",
    fingerprint: str | None = None,
) -> Case:
    return Case(
        id=id, suite=suite, op=op, dtype=dtype, path=path, status=status, message=message, fingerprint=fingerprint
    )


@pytest.mark.parametrize(
    ("made", "kind"),
    [
        (
            case(
                "a",
                "failed",
                "NotImplementedError: Could not run 'aten::erfinv' with arguments from the 'PrivateUse1' backend",
            ),
            "unsupported-op",
        ),
        (case("a", "error", "RuntimeError: \"silu\" not implemented for 'Half'"), "unsupported-op"),
        (
            case(
                "a",
                "failed",
                "sample 0: forward: 3/16 elements differ, first at [2]: got 1.5, expected 1.25 (rtol 1.3e-06, atol 1e-05)",
            ),
            "precision",
        ),
        (case("a", "failed", "Tensor-likes are not close! Mismatched elements: 1 / 4"), "precision"),
        (case("a", "crashed", "worker died: SIGSEGV in vendor_kernels.py:12"), "crash"),
        (case("a", "timeout", "case took longer than 60 s"), "crash"),
        (
            case(
                "a",
                "error",
                "AttributeError: module 'torch.flagos' has no attribute 'Stream'",
                suite="streams",
                op=None,
                path=None,
            ),
            "missing-feature",
        ),
        (
            case(
                "a",
                "failed",
                "NotImplementedError: autocast is not supported for flagos",
                suite="amp",
                op=None,
                path=None,
            ),
            "missing-feature",
        ),
        (
            case("a", "failed", "RuntimeError: Generator of device flagos is not available", suite="rng", op=None),
            "missing-feature",
        ),
        (case("a", "failed", "dtype torch.float16, expected torch.float32"), "other"),
    ],
)
def test_classify(made, kind):
    assert classify(made) == kind


def test_groups_by_fingerprint_largest_first():
    cases = [
        case("ops/silu/float32/vendor/aten::silu", "failed", "3/16 elements differ (rtol 1e-5)", fingerprint="f1"),
        case(
            "ops/silu/float16/vendor/aten::silu",
            "failed",
            "5/16 elements differ (rtol 1e-3)",
            dtype="float16",
            fingerprint="f1",
        ),
        case(
            "ops/erf/float32/vendor/aten::erf",
            "error",
            "NotImplementedError: no kernel",
            op="aten::erf",
            fingerprint="f2",
        ),
        case("ops/add/float32/native", "passed", path="native"),
        case("ops/mul/float32/native", "skipped", "baseline", path="native"),
    ]
    groups = group_failures(cases)
    assert [(g.fingerprint, g.category, len(g.cases)) for g in groups] == [
        ("f1", "precision", 2),
        ("f2", "unsupported-op", 1),
    ]
    first = groups[0].as_dict("demo_chip")
    assert first["dtypes"] == ["float16", "float32"] and first["ops"] == ["aten::silu"]
    scratch = Path(".conformance-runs/rerun-demo_chip").resolve()
    assert first["rerun"] == (
        f"torch-fl conformance run demo_chip --suite ops --record-dir {shlex.quote(str(scratch))} "
        "-k silu-float32 --paths native,vendor --json"
    )


def test_cases_without_fingerprint_are_grouped_by_message():
    cases = [
        case(f"ops/x/{d}/vendor", "failed", f"got {v}, expected 0.5 (rtol 1e-5)", fingerprint=None)
        for d, v in (("float32", 0.25), ("float64", 0.125))
    ]
    assert len(group_failures(cases)) == 1


def write_record(path, cases: list[Case], platform: str = "demo_chip", descriptor_hash: str = "sha256:x"):
    """A record and its evidence, as the conformance writer makes them, at `path`."""
    binding = {"descriptor_hash": descriptor_hash, "torch": "2.13", "torch_version": "2.13.0"}
    header = {"platform": platform, "binding": binding, "started": "2026-01-01T00:00:00Z"}
    recordfile.write_cases(path, header, [c.model_dump() for c in cases])
    return path


def report_of(tmp_path, cases: list[Case], baseline=None) -> dict:
    path = write_record(tmp_path / "new" / "torch-2.13.json", cases)
    return triage(*read_record(path), str(path), baseline)


OLD = [
    case("c1", "failed", "3/16 elements differ (rtol 1e-5)", fingerprint="p"),
    case("c2", "failed", "NotImplementedError: no kernel", fingerprint="u"),
    case("c3", "passed"),
    case("c4", "crashed", "worker died", fingerprint="k"),
]
NEW = [
    case("c1", "passed"),
    case("c2", "failed", "NotImplementedError: no kernel", fingerprint="u"),
    case("c3", "failed", "2/4 elements differ (rtol 1e-5)", fingerprint="q"),
]


def test_report_and_comparison_with_a_record(tmp_path):
    old_file = write_record(tmp_path / "old" / "torch-2.13.json", OLD)
    report = report_of(tmp_path, NEW, read_baseline(old_file))
    assert report["ok"] is False and report["summary"]["failing"] == 2 and report["summary"]["groups"] == 2
    assert (
        report["summary"]["by_category"]["precision"] == 1 and report["summary"]["by_category"]["unsupported-op"] == 1
    )
    comparison = report["comparison"]
    assert comparison["new_failures"] == ["c3"]
    assert comparison["fixed"] == ["c1"]
    assert comparison["still_failing"] == ["c2"]
    assert comparison["not_run_now"] == ["c4"]
    assert comparison["new_fingerprints"] == ["q"] and comparison["gone_fingerprints"] == ["k", "p"]


def test_a_saved_triage_report_is_a_baseline(tmp_path):
    saved = tmp_path / "before.json"
    saved.write_text(json.dumps(triage(*read_record(write_record(tmp_path / "old" / "torch-2.13.json", OLD)), "old")))
    comparison = report_of(tmp_path, NEW, read_baseline(saved))["comparison"]
    assert (
        comparison["new_failures"] == ["c3"] and comparison["fixed"] == ["c1"] and comparison["still_failing"] == ["c2"]
    )


@pytest.fixture
def recorded(repo):
    make(repo)
    folder = repo / "plats" / "demo_chip"
    return write_record(record_path(folder, "2.13"), NEW, descriptor_hash=descriptor_hash(load_descriptor(folder)))


def test_cli_reads_the_platform_record(recorded, monkeypatch):
    monkeypatch.setattr("torch_fl.platform.triage.installed_version", lambda name: "2.13.0")
    data = cli("triage", "demo_chip")
    assert data["record"] == str(recorded) and data["summary"]["failing"] == 2 and data["kind"] == "triage"


def test_cli_against_a_saved_report(recorded, tmp_path):
    before = tmp_path / "before.json"
    before.write_text(json.dumps(triage(*read_record(write_record(tmp_path / "old" / "torch-2.13.json", OLD)), "old")))
    data = cli("triage", "demo_chip", "--record", str(recorded), "--against", str(before))
    assert data["comparison"]["new_failures"] == ["c3"]


def test_cli_errors(repo, tmp_path):
    make(repo)
    assert "no conformance record" in cli("triage", "demo_chip", code=1)["error"]
    other = write_record(tmp_path / "other" / "torch-2.13.json", NEW, platform="host_ref")
    assert "not 'demo_chip'" in cli("triage", "demo_chip", "--record", str(other), code=1)["error"]
    junk = tmp_path / "junk.json"
    junk.write_text("{}")
    assert "junk.json: record format None" in cli("triage", "demo_chip", "--record", str(junk), code=1)["error"]


def test_a_sweep_case_reruns_its_op_and_dtype_item(tmp_path, monkeypatch):
    from torch_fl.platform.triage import rerun_command

    monkeypatch.chdir(tmp_path)
    made = case(
        "sweep/aten::add.Tensor/int32/vendor/size=1048577/int32,int32@huge",
        "failed",
        "1 element differs",
        suite="sweep",
        op="aten::add.Tensor",
        dtype="int32",
    )
    assert rerun_command(made, "demo_chip") == (
        f"torch-fl conformance run demo_chip --suite sweep --record-dir {tmp_path}/.conformance-runs/rerun-demo_chip "
        "-k aten::add.Tensor-int32 --paths native,vendor --json"
    )


def test_cli_refuses_an_evidence_file_outside_the_records_folder(repo, tmp_path):
    make(repo)
    path = write_record(tmp_path / "r" / "torch-2.13.json", NEW)
    data = json.loads(path.read_text())
    data.pop("checksum")
    data["evidence"]["file"] = "../../../elsewhere.cases.jsonl.gz"
    data["checksum"] = recordfile.checksum(data)  # a record made to look whole
    path.write_text(json.dumps(data))
    error = cli("triage", "demo_chip", "--record", str(path), code=1)["error"]
    assert "evidence" in error and "elsewhere.cases.jsonl.gz" in error and "\n" not in error, error


def test_failures_are_counted_per_path_and_pytorchs_own_are_not_the_vendors(tmp_path):
    """PyTorch's native kernel failing (a low-precision backward, say) is nothing a vendor can fix:
    it is counted apart, and the exit criterion `.summary.failing_owned` leaves it out (device
    features, which have no path, are the platform's)."""
    cases = [
        case("n1", "failed", "2/4 elements differ (rtol 1e-2)", path="native", fingerprint="n"),
        case("v1", "failed", "2/4 elements differ (rtol 1e-5)", path="vendor", fingerprint="v"),
        case("p1", "passed", path="flaggems"),
        case("f1", "failed", "AttributeError: no autocast", suite="amp", op=None, path=None, fingerprint="f"),
    ]
    summary = report_of(tmp_path, cases)["summary"]
    assert summary["failing_by_path"] == {"native": 1, "none": 1, "vendor": 1} and summary["failing_owned"] == 2
    native_only = report_of(tmp_path, [cases[0]])
    assert native_only["summary"]["failing_owned"] == 0
    [group] = native_only["groups"]
    assert group["owned"] is False and "PyTorch's own kernel" in group["hint"]


def test_a_run_counts_the_failures_of_the_vendor_paths():
    from torch_fl.cli.conformance import owned_failures

    by_path = {"native": {"failed": 3}, "cpu": {"error": 1}, "vendor": {"failed": 1, "crashed": 1}, "emulated": {}}
    by_status = {"passed": 10, "failed": 5, "error": 1, "crashed": 1}  # one failure has no path: a device feature
    assert owned_failures(by_status, by_path) == 3
