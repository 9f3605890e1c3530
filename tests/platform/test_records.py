"""Conformance records: the descriptor hash, loading, and when a record goes stale."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from torch_fl.platform import RecordError, descriptor_hash, load_descriptor, load_record, record_path, record_status
from torch_fl.platform.discovery import shipped_root
from torch_fl.platform.record import Record, current_status, record_lines


def copy_platform(tmp_path: Path, name: str) -> Path:
    folder = tmp_path / name
    # the descriptor alone: these tests write the records they need
    shutil.copytree(shipped_root() / name, folder, ignore=shutil.ignore_patterns("records"))
    return folder


def write_record(folder: Path, torch_version: str = "2.13.0+cpu", **fields) -> Record:
    descriptor = load_descriptor(folder)
    data = {
        "format": 1, "platform": descriptor.name, "descriptor_hash": descriptor_hash(descriptor),
        "torch": ".".join(torch_version.split(".")[:2]), "torch_version": torch_version,
        "kernel_libraries": {}, "started": "2026-10-01T10:00:00+00:00", "finished": "2026-10-01T10:30:00+00:00",
        "complete": True, "machine": {"host": "ci"},
        "cases": [{"id": "ops/aten::add.Tensor/float32/native/forward", "suite": "ops", "op": "aten::add.Tensor",
                   "dtype": "float32", "path": "native", "status": "passed", "message": "", "fingerprint": None,
                   "duration_s": 0.01}],
        "summary": {"passed": 1},
    }
    data.update(fields)
    record = Record.model_validate(data)
    path = record_path(folder, data["torch"])
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=2))
    return record


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


def test_gated_cases_are_cached_and_a_rewritten_record_is_read_afresh(tmp_path, monkeypatch):
    monkeypatch.setenv("FLAGOS_CACHE_DIR", str(tmp_path / "cache"))
    folder = copy_platform(tmp_path, "host_ref")
    emulated = {"id": "ops/aten::_to_copy/float8_e4m3fn/emulated/forward", "suite": "ops", "op": "aten::_to_copy",
                "dtype": "float8_e4m3fn", "path": "emulated", "status": "passed", "message": "", "fingerprint": None,
                "duration_s": 0.01}
    written = write_record(folder, cases=[write_record(folder).cases[0].model_dump(), emulated])
    skip = frozenset({"native", "cpu"})
    first = load_record(folder, "2.13", skip_paths=skip)
    assert [c.path for c in first.cases] == ["emulated"] and first.descriptor_hash == written.descriptor_hash
    assert len(list((tmp_path / "cache").glob("*.json"))) == 1
    assert load_record(folder, "2.13", skip_paths=skip) == first  # from the cache
    write_record(folder, cases=[{**emulated, "status": "failed"}])  # a new run rewrites the record
    assert [c.status for c in load_record(folder, "2.13", skip_paths=skip).cases] == ["failed"]
    assert load_record(folder, "2.13").cases[0].status == "failed"


def test_malformed_record_is_an_error(tmp_path):
    folder = copy_platform(tmp_path, "host_ref")
    write_record(folder)
    path = record_path(folder, "2.13")
    data = json.loads(path.read_text())
    data["cases"][0]["status"] = "exploded"
    path.write_text(json.dumps(data))
    with pytest.raises(RecordError, match="torch-2.13.json: cases.0.status"):
        load_record(folder, "2.13")


def test_unreadable_record_is_stale_for_status(tmp_path):
    folder = copy_platform(tmp_path, "host_ref")
    record_path(folder, "2.13").parent.mkdir()
    record_path(folder, "2.13").write_text("{not json")
    status = record_status(load_descriptor(folder), folder, "2.13.0", {})
    assert status.state == "stale" and status.reasons[0].startswith("unreadable record:")


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
    assert stale.state == "stale" and stale.reasons == ["flag_gems differs: record has 5.0.2, installed is 5.1.0"]
    absent = record_status(descriptor, folder, "2.11.0+cu130", {"flag_gems": None})
    assert absent.reasons == ["flag_gems differs: record has 5.0.2, installed is none"]


def test_stale_when_a_declared_kernel_library_was_not_checked(tmp_path):
    folder = copy_platform(tmp_path, "nvidia_h200")
    write_record(folder, torch_version="2.11.0", kernel_libraries={})
    status = record_status(load_descriptor(folder), folder, "2.11.0", {"flag_gems": "5.0.2"})
    assert status.reasons == ["flag_gems is declared but the record did not check it"]


def test_stale_when_the_run_did_not_complete(tmp_path):
    folder = copy_platform(tmp_path, "host_ref")
    write_record(folder, complete=False, finished=None)
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
