"""Gating: native and cpu always run; other kernel sets only where a valid record shows them passing."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from torch_fl.conformance import recordfile
from torch_fl.conformance.recordfile import identity
from torch_fl.platform import Gate, load_descriptor
from torch_fl.platform.discovery import shipped_root
from torch_fl.platform.record import record_path

GEMS = {"flag_gems": "5.0.2"}
BF16 = "bfloat16,bfloat16@tiny"
FP32 = "float32,float32@tiny"
FP32_BIG = "float32,float32@huge"


def case(op, key, path, status, part="forward"):
    return {
        "id": f"ops/{op}/{path}/{part}/{key}",
        "suite": "ops",
        "op": op,
        "dtype": key.split(",")[0],
        "path": path,
        "keys": [key] if key else [],
        "status": status,
    }


@pytest.fixture
def h200(tmp_path: Path) -> Path:
    folder = tmp_path / "nvidia_h200"
    # the descriptor alone: these tests write the records they need
    shutil.copytree(shipped_root() / "nvidia_h200", folder, ignore=shutil.ignore_patterns("records"))
    return folder


def record(folder: Path, cases: list) -> None:
    header = identity(load_descriptor(folder))
    header["binding"].update(torch="2.11", torch_version="2.11.0+cu130", kernel_libraries=GEMS)
    header["started"] = "2026-10-01T10:00:00Z"
    recordfile.write_cases(record_path(folder, "2.11"), header, cases)


CASES = [
    case("aten::mm", BF16, "flaggems", "passed"),
    case("aten::mm", BF16, "flaggems", "passed", "backward"),
    case("aten::mm", FP32, "flaggems", "passed"),
    case("aten::mm", FP32, "flaggems", "failed", "backward"),
    case("aten::mm", FP32_BIG, "flaggems", "passed"),
    case("aten::softmax.int", "float16@tiny", "flaggems", "skipped"),
    case("aten::softmax.int", "float32@tiny", "flaggems", "unjudged"),
    case("aten::add.Tensor", "int64,int64@tiny", "flaggems", "passed"),
    case("aten::add.Tensor", "int64,int64@tiny", "flaggems", "skipped", "backward"),
    case("aten::sum", "", "flaggems", "crashed"),  # died before its first call had a key
    case("aten::sum", FP32, "flaggems", "passed"),
]


def gate(folder: Path, **kw) -> Gate:
    kw.setdefault("kernel_versions", GEMS)
    kw.setdefault("forced", False)
    return Gate.for_platform(load_descriptor(folder), "2.11.0+cu130", **kw)


def test_valid_record_enables_exactly_what_passed(h200):
    record(h200, CASES)
    g = gate(h200)
    assert g.state == "valid" and g.warning() is None
    assert g.allows("aten::mm", BF16, "flaggems")
    assert not g.allows("aten::mm", FP32, "flaggems")  # one direction failed
    assert not g.allows("aten::mm", FP32_BIG, "flaggems")  # passed, but its dtypes failed at another size
    assert not g.allows("aten::softmax.int", "float16@tiny", "flaggems")  # only skipped: never proven
    assert not g.allows("aten::softmax.int", "float32@tiny", "flaggems")  # unjudged proves nothing
    assert g.allows("aten::add.Tensor", "int64,int64@tiny", "flaggems")  # skipped is neutral next to a pass
    assert not g.allows("aten::sum", FP32, "flaggems")  # a keyless crash vetoes every key
    assert not g.allows("aten::mm", "float16,float16@tiny", "flaggems")  # never tried
    assert not g.allows("aten::mm", "bfloat16,float32@tiny", "flaggems")  # a mix of proven dtypes is its own key
    assert g.allows("aten::mm", None, "flaggems") and not g.allows("aten::sum", None, "flaggems")


def test_native_and_cpu_need_no_record(h200):
    g = gate(h200)
    assert g.state == "missing"
    for path in ("native", "cpu"):
        assert g.allows("aten::anything", FP32, path)
    assert not g.allows("aten::mm", BF16, "flaggems")


def test_undeclared_kernel_set_is_never_allowed(h200):
    record(h200, CASES + [case("aten::mm", BF16, "vendor", "passed")])
    assert not gate(h200).allows("aten::mm", BF16, "vendor")
    assert not gate(h200, forced=True).allows("aten::mm", BF16, "vendor")


def test_stale_record_enables_nothing_beyond_native_and_warns(h200):
    record(h200, CASES)
    g = gate(h200, kernel_versions={"flag_gems": "5.1.0"})
    assert g.state == "stale"
    assert not g.allows("aten::mm", BF16, "flaggems")
    warning = g.warning()
    assert warning is not None and "\n" not in warning
    assert "flag_gems differs" in warning and "only native and cpu routes run" in warning
    assert warning.endswith("torch-fl conformance run nvidia_h200")


def test_missing_record_warning_names_the_command(h200):
    warning = gate(h200).warning()
    assert "no conformance record" in warning and "torch-fl conformance run nvidia_h200" in warning


def test_forced_mode_allows_everything_declared_and_warns(h200):
    g = gate(h200, forced=True)
    assert g.forced and g.allows("aten::mm", FP32, "flaggems")
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
    assert not g.allows("aten::mm", FP32, "flaggems")
