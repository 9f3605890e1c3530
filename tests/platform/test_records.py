"""Conformance records: the descriptor hash, loading, and when a record goes stale."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from torch_fl.conformance import recordfile
from torch_fl.conformance.recordfile import identity
from torch_fl.platform import RecordError, descriptor_hash, load_descriptor, load_record, record_path, record_status
from torch_fl.platform.discovery import shipped_root
from torch_fl.platform.record import Record, current_status, evidence_path, load_evidence, record_lines


def copy_platform(tmp_path: Path, name: str) -> Path:
    folder = tmp_path / name
    # the descriptor alone: these tests write the records they need
    shutil.copytree(shipped_root() / name, folder, ignore=shutil.ignore_patterns("records"))
    return folder


NATIVE_CASE = {
    "id": "ops/add/float32/native",
    "suite": "ops",
    "op": "aten::add.Tensor",
    "dtype": "float32",
    "path": "native",
    "status": "passed",
}


def write_record(
    folder: Path, torch_version: str = "2.13.0+cpu", cases: list | None = None, complete: bool = True, **binding
) -> Record:
    """A record made by the conformance writer for the descriptor and sources in `folder`."""
    descriptor = load_descriptor(folder)
    header = identity(descriptor)
    header["binding"].update(
        {
            "torch": ".".join(torch_version.split(".")[:2]),
            "torch_version": torch_version,
            "kernel_libraries": {},
            **binding,
        }
    )
    header.update(started="2026-10-01T10:00:00+00:00", machine={"host": "ci"})
    path = record_path(folder, header["binding"]["torch"])
    recordfile.write_cases(path, header, cases if cases is not None else [NATIVE_CASE], complete)
    return Record.model_validate_json(path.read_text())


def test_hash_ignores_comments_and_layout_but_not_fields(tmp_path):
    folder = copy_platform(tmp_path, "host_ref")
    path = folder / "platform.yaml"
    original = descriptor_hash(load_descriptor(folder))
    assert original.startswith("sha256:") and len(original) == len("sha256:") + 64
    path.write_text("# another comment\n" + path.read_text().replace("boards: [host-cpu]", "boards:\n  - host-cpu"))
    assert descriptor_hash(load_descriptor(folder)) == original
    path.write_text(path.read_text().replace("timeout_minutes: 60", "timeout_minutes: 61"))
    assert descriptor_hash(load_descriptor(folder)) != original


def test_load_record_roundtrip_and_missing(tmp_path):
    folder = copy_platform(tmp_path, "host_ref")
    assert load_record(folder, "2.13") is None
    written = write_record(folder)
    assert load_record(folder, "2.13") == written
    assert record_path(folder, "2.13") == folder / "records" / "torch-2.13.json"


def test_the_evidence_holds_every_case_and_the_record_only_failures_and_verdicts(tmp_path):
    folder = copy_platform(tmp_path, "host_ref")
    emulated = {
        "id": "ops/fp8/to/emulated/aten::_to_copy",
        "suite": "ops",
        "op": "aten::_to_copy",
        "path": "emulated",
        "keys": ["float32,dtype=float8_e4m3fn@tiny"],
        "status": "passed",
    }
    broken = {
        **emulated,
        "id": "ops/fp8/to/emulated/aten::_to_copy/big",
        "keys": ["float32,dtype=float8_e4m3fn@huge"],
        "status": "failed",
        "message": "wrong",
    }
    record = write_record(folder, cases=[NATIVE_CASE, emulated, broken])
    assert record.gate == {
        "aten::_to_copy": {
            "emulated": {"float32,dtype=float8_e4m3fn@huge": "failed", "float32,dtype=float8_e4m3fn@tiny": "passed"}
        }
    }
    assert [c.id for c in record.failures] == [broken["id"]]
    assert record.counts == {"emulated": {"failed": 1, "passed": 1}, "native": {"passed": 1}}
    evidence = load_evidence(record_path(folder, "2.13"))
    assert sorted(c.id for c in evidence) == sorted(c["id"] for c in (NATIVE_CASE, emulated, broken))


def test_the_evidence_keeps_each_case_item_and_the_record_what_decides_it(tmp_path):
    folder = copy_platform(tmp_path, "host_ref")
    failed = {
        **NATIVE_CASE,
        "id": "ops/add/float32/native/2",
        "status": "failed",
        "item": "ops.py::test_op[add-float32]",
    }
    record = write_record(folder, cases=[{**NATIVE_CASE, "item": "ops.py::test_op[add-float32]"}, failed])
    assert record.sources_decide == {}  # a record made without an attribution: every source decides everything
    assert {c.item for c in load_evidence(record_path(folder, "2.13"))} == {"ops.py::test_op[add-float32]"}
    assert [c.item for c in record.failures] == [None]  # only a re-run needs it: the gate's record stays small
    path = record_path(folder, "2.13")
    header = {**identity(load_descriptor(folder)), "sources_decide": {"vendor_kernels.py": ["*"]}}
    recordfile.write_cases(path, header, [NATIVE_CASE])
    assert load_record(folder, "2.13").sources_decide == {"vendor_kernels.py": ["*"]}


def test_evidence_that_does_not_match_its_hash_is_refused(tmp_path):
    folder = copy_platform(tmp_path, "host_ref")
    write_record(folder)
    path = evidence_path(record_path(folder, "2.13"))
    path.write_bytes(path.read_bytes() + b"\0")
    with pytest.raises(RecordError, match="does not match the hash"):
        load_evidence(record_path(folder, "2.13"))


def test_malformed_record_is_an_error(tmp_path):
    folder = copy_platform(tmp_path, "host_ref")
    write_record(folder)
    path = record_path(folder, "2.13")
    data = json.loads(path.read_text())
    data["failures"] = [{"id": "x", "suite": "ops", "status": "exploded"}]
    path.write_text(json.dumps(data))
    with pytest.raises(RecordError, match="torch-2.13.json: failures.0.status"):
        load_record(folder, "2.13")


@pytest.mark.parametrize("content", [b"{not json", b"\xff\xfe\x00garbage", bytes(range(256)) * 4, b"[1, 2]"])
def test_unreadable_record_is_stale_for_status_and_named(tmp_path, content):
    folder = copy_platform(tmp_path, "host_ref")
    record_path(folder, "2.13").parent.mkdir()
    record_path(folder, "2.13").write_bytes(content)
    status = record_status(load_descriptor(folder), folder, "2.13.0", {})
    assert status.state == "stale" and status.reasons[0].startswith("unreadable record:")
    assert str(record_path(folder, "2.13")) in status.reasons[0]


def test_a_record_of_the_previous_format_is_stale_and_says_how_to_renew_it(tmp_path):
    folder = copy_platform(tmp_path, "host_ref")
    record_path(folder, "2.13").parent.mkdir()
    record_path(folder, "2.13").write_text(json.dumps({"format": 1, "platform": "host_ref", "cases": []}))
    status = record_status(load_descriptor(folder), folder, "2.13.0", {})
    assert status.state == "stale" and "format 1" in status.reasons[0] and "conformance run" in status.reasons[0]


def test_valid_record(tmp_path):
    folder = copy_platform(tmp_path, "host_ref")
    write_record(folder)
    status = record_status(load_descriptor(folder), folder, "2.13.0+cpu", {})
    assert (status.state, status.reasons, status.torch_line) == ("valid", [], "2.13")
    assert status.record is not None and status.record.counts_by_path() == {"native": (1, 1)}


def test_missing_record(tmp_path):
    folder = copy_platform(tmp_path, "host_ref")
    status = record_status(load_descriptor(folder), folder, "2.13.0+cpu", {})
    assert status.state == "missing" and status.reasons == ["no records/torch-2.13.json"]


def test_stale_when_the_descriptor_changes(tmp_path):
    folder = copy_platform(tmp_path, "host_ref")
    write_record(folder)
    path = folder / "platform.yaml"
    path.write_text(path.read_text().replace("timeout_minutes: 60", "timeout_minutes: 90"))
    status = record_status(load_descriptor(folder), folder, "2.13.0+cpu", {})
    assert status.state == "stale" and any("hash differs" in r for r in status.reasons)


def test_stale_when_the_torch_line_differs(tmp_path):
    folder = copy_platform(tmp_path, "host_ref")
    write_record(folder, torch_version="2.11.0+cpu")
    status = record_status(load_descriptor(folder), folder, "2.13.0+cpu", {})
    assert status.state == "stale"
    assert status.reasons == ["torch line differs: record is for 2.11, installed is 2.13"]
    assert status.torch_line == "2.11"


def test_newest_other_line_is_the_one_reported(tmp_path):
    folder = copy_platform(tmp_path, "host_ref")
    write_record(folder, torch_version="2.9.1")
    write_record(folder, torch_version="2.11.0")
    assert record_lines(folder) == ["2.11", "2.9"]
    assert record_status(load_descriptor(folder), folder, "2.13.0", {}).torch_line == "2.11"


def test_stale_when_a_kernel_library_version_differs(tmp_path):
    folder = copy_platform(tmp_path, "nvidia_h200")
    write_record(folder, torch_version="2.11.0+cu130", kernel_libraries={"flag_gems": "5.0.2"})
    descriptor = load_descriptor(folder)
    assert record_status(descriptor, folder, "2.11.0+cu130", {"flag_gems": "5.0.2"}).state == "valid"
    stale = record_status(descriptor, folder, "2.11.0+cu130", {"flag_gems": "5.1.0"})
    assert stale.state == "stale" and stale.reasons == ["flag_gems differs: record has 5.0.2, installed: 5.1.0"]
    absent = record_status(descriptor, folder, "2.11.0+cu130", {"flag_gems": None})
    assert absent.reasons == ["flag_gems differs: record has 5.0.2, installed: not installed"]


def test_stale_when_a_declared_kernel_library_was_not_checked(tmp_path):
    folder = copy_platform(tmp_path, "nvidia_h200")
    write_record(folder, torch_version="2.11.0", kernel_libraries={})
    status = record_status(load_descriptor(folder), folder, "2.11.0", {"flag_gems": "5.0.2"})
    assert status.reasons == ["flag_gems is declared but the record did not check it"]


def test_stale_when_the_run_did_not_complete(tmp_path):
    folder = copy_platform(tmp_path, "host_ref")
    write_record(folder, complete=False)
    status = record_status(load_descriptor(folder), folder, "2.13.0", {})
    assert status.state == "stale" and status.reasons == ["the conformance run did not complete"]


def test_without_torch_a_record_cannot_be_valid(tmp_path):
    folder = copy_platform(tmp_path, "host_ref")
    assert record_status(load_descriptor(folder), folder, None, {}).state == "missing"
    write_record(folder)
    status = record_status(load_descriptor(folder), folder, None, {})
    assert status.state == "stale" and "torch is not installed" in status.reasons[0]


def test_current_status_reads_installed_versions(tmp_path):
    folder = copy_platform(tmp_path, "host_ref")
    assert current_status(load_descriptor(folder)).state == "missing"
