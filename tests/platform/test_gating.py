"""Gating: native and cpu always run; other kernel sets only where a valid record shows them passing."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from torch_fl.platform import Gate, descriptor_hash, load_descriptor
from torch_fl.platform.discovery import shipped_root
from torch_fl.platform.record import record_path

GEMS = {"flag_gems": "5.0.2"}


def case(op, dtype, path, status, direction="forward"):
    return {"id": f"ops/{op}/{dtype}/{path}/{direction}", "suite": "ops", "op": op, "dtype": dtype,
            "path": path, "status": status, "message": "", "fingerprint": None, "duration_s": 0.0}


@pytest.fixture
def h200(tmp_path: Path) -> Path:
    folder = tmp_path / "nvidia_h200"
    # the descriptor alone: these tests write the records they need
    shutil.copytree(shipped_root() / "nvidia_h200", folder, ignore=shutil.ignore_patterns("records"))
    return folder


def record(folder: Path, cases: list, **fields) -> None:
    descriptor = load_descriptor(folder)
    data = {"format": 1, "platform": descriptor.name, "descriptor_hash": descriptor_hash(descriptor),
            "torch": "2.11", "torch_version": "2.11.0+cu130", "kernel_libraries": GEMS,
            "started": "2026-10-01T10:00:00Z", "finished": "2026-10-01T11:00:00Z", "complete": True,
            "machine": {}, "cases": cases, "summary": {}}
    data.update(fields)
    path = record_path(folder, "2.11")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data))


CASES = [
    case("aten::mm", "bfloat16", "flaggems", "passed"),
    case("aten::mm", "bfloat16", "flaggems", "passed", "backward"),
    case("aten::mm", "float32", "flaggems", "passed"),
    case("aten::mm", "float32", "flaggems", "failed", "backward"),
    case("aten::softmax.int", "float16", "flaggems", "skipped"),
    case("aten::add.Tensor", "int64", "flaggems", "passed"),
    case("aten::add.Tensor", "int64", "flaggems", "skipped", "backward"),
    case("aten::sum", "float32", "flaggems", "crashed"),
]


def gate(folder: Path, **kw) -> Gate:
    kw.setdefault("kernel_versions", GEMS)
    kw.setdefault("forced", False)
    return Gate.for_platform(load_descriptor(folder), "2.11.0+cu130", **kw)


def test_valid_record_enables_exactly_what_passed(h200):
    record(h200, CASES)
    g = gate(h200)
    assert g.state == "valid" and g.warning() is None
    assert g.allows("aten::mm", "bfloat16", "flaggems")
    assert not g.allows("aten::mm", "float32", "flaggems")        # one direction failed
    assert not g.allows("aten::softmax.int", "float16", "flaggems")  # only skipped: never proven
    assert g.allows("aten::add.Tensor", "int64", "flaggems")       # skipped is neutral next to a pass
    assert not g.allows("aten::sum", "float32", "flaggems")        # crashed
    assert not g.allows("aten::mm", "float16", "flaggems")         # never tried


def test_native_and_cpu_need_no_record(h200):
    g = gate(h200)
    assert g.state == "missing"
    for path in ("native", "cpu"):
        assert g.allows("aten::anything", "float32", path)
    assert not g.allows("aten::mm", "bfloat16", "flaggems")


def test_torch_dtype_objects_are_accepted(h200):
    record(h200, CASES)

    class FakeDtype:
        def __str__(self):
            return "torch.bfloat16"

    assert gate(h200).allows("aten::mm", FakeDtype(), "flaggems")


def test_undeclared_kernel_set_is_never_allowed(h200):
    record(h200, CASES + [case("aten::mm", "bfloat16", "vendor", "passed")])
    assert not gate(h200).allows("aten::mm", "bfloat16", "vendor")
    assert not gate(h200, forced=True).allows("aten::mm", "bfloat16", "vendor")


def test_stale_record_enables_nothing_beyond_native_and_warns(h200):
    record(h200, CASES)
    g = gate(h200, kernel_versions={"flag_gems": "5.1.0"})
    assert g.state == "stale"
    assert not g.allows("aten::mm", "bfloat16", "flaggems")
    warning = g.warning()
    assert warning is not None and "\n" not in warning
    assert "flag_gems differs" in warning and "only native and cpu routes run" in warning
    assert warning.endswith("torch-fl conformance run nvidia_h200")


def test_missing_record_warning_names_the_command(h200):
    warning = gate(h200).warning()
    assert "no conformance record" in warning and "torch-fl conformance run nvidia_h200" in warning


def test_forced_mode_allows_everything_declared_and_warns(h200):
    g = gate(h200, forced=True)
    assert g.forced and g.allows("aten::mm", "float32", "flaggems")
    assert "FLAGOS_ALLOW_UNVALIDATED=1" in g.warning()


def test_forced_defaults_to_the_environment(h200, monkeypatch):
    monkeypatch.setenv("FLAGOS_ALLOW_UNVALIDATED", "1")
    assert Gate.for_platform(load_descriptor(h200), "2.11.0", kernel_versions=GEMS).forced
    monkeypatch.setenv("FLAGOS_ALLOW_UNVALIDATED", "0")
    assert not Gate.for_platform(load_descriptor(h200), "2.11.0", kernel_versions=GEMS).forced


def test_forcing_does_not_override_a_valid_record(h200):
    record(h200, CASES)
    g = gate(h200, forced=True)
    assert not g.forced
    assert not g.allows("aten::mm", "float32", "flaggems")
