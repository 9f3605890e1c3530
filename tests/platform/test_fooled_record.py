"""A record cannot be fooled: it binds the platform's sources, and an edited record reads as tampered."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from torch_fl.conformance import recordfile
from torch_fl.conformance.recordfile import identity
from torch_fl.platform import Gate, load_descriptor, record_path, record_status

FIXTURE = Path(__file__).parents[1] / "conformance" / "fixtures" / "broken_chip"
RELU = "float32@tiny"


def relu_case(status: str, key: str = RELU) -> dict:
    return {
        "id": f"ops/relu/float32/vendor/aten::relu/{key}",
        "suite": "ops",
        "op": "aten::relu",
        "dtype": "float32",
        "path": "vendor",
        "keys": [key],
        "status": status,
        "message": "" if status == "passed" else "wrong values",
    }


@pytest.fixture
def chip(tmp_path: Path) -> Path:
    folder = tmp_path / "broken_chip"
    shutil.copytree(FIXTURE, folder, ignore=shutil.ignore_patterns("records", "__pycache__"))
    return folder


def write(folder: Path, cases: list[dict]) -> Path:
    header = identity(load_descriptor(folder))
    header["binding"].update(torch="2.13", torch_version="2.13.0", kernel_libraries={})
    header["started"] = "2026-10-01T10:00:00Z"
    path = record_path(folder, "2.13")
    recordfile.write_cases(path, header, cases)
    return path


def gate(folder: Path) -> Gate:
    return Gate.for_platform(load_descriptor(folder), "2.13.0", kernel_versions={}, forced=False)


def test_a_valid_record_serves_the_vendor_kernel(chip):
    write(chip, [relu_case("passed")])
    assert gate(chip).state == "valid" and gate(chip).allows("aten::relu", RELU, "vendor")


def test_a_vendor_kernel_edited_after_the_run_makes_the_record_stale(chip):
    write(chip, [relu_case("passed")])
    kernels = chip / "kernels.py"
    kernels.write_text(
        kernels.read_text().replace(
            "def relu_correct(self):",
            "def relu_correct(self):\n    return torch.full_like(self, 42)\n\n\ndef _was(self):",
        )
    )
    g = gate(chip)
    assert g.state == "stale" and "platform source kernels.py changed since the record was made" in g.status.reasons
    assert not g.allows("aten::relu", RELU, "vendor")


def test_a_new_helper_module_beside_the_vendor_kernels_makes_the_record_stale(chip):
    write(chip, [relu_case("passed")])
    (chip / "helpers.py").write_text("SCALE = 2\n")
    assert "platform source helpers.py is new since the record was made" in gate(chip).status.reasons


def test_a_failed_case_flipped_to_passed_by_hand_is_tampered(chip):
    path = write(chip, [relu_case("failed")])
    data = json.loads(path.read_text())
    data["gate"]["aten::relu"]["vendor"][RELU] = "passed"
    path.write_text(json.dumps(data, indent=1))
    g = gate(chip)
    assert g.state == "tampered" and not g.allows("aten::relu", RELU, "vendor")
    warning = g.warning()
    assert warning is not None and str(path) in warning and "checksum" in warning


def test_a_summary_that_disagrees_with_the_failures_is_tampered_even_with_a_fresh_checksum(chip):
    path = write(chip, [relu_case("failed")])
    data = json.loads(path.read_text())
    data["failures"] = []  # hide the failure and forge the checksum: the counts still say one failed
    data["gate"]["aten::relu"]["vendor"][RELU] = "passed"
    from torch_fl.platform.record import checksum

    data["checksum"] = checksum(data)
    path.write_text(json.dumps(data, indent=1))
    status = record_status(load_descriptor(chip), chip, "2.13.0", {})
    assert status.state == "tampered" and any("failing cases" in r for r in status.reasons)


def test_another_record_with_the_same_size_and_time_is_read_afresh(chip):
    path = write(chip, [relu_case("passed")])
    path.write_text(path.read_text() + " " * 4000)  # layout is not content: the checksum still holds
    first = path.stat()
    assert gate(chip).allows("aten::relu", RELU, "vendor")
    write(chip, [relu_case("failed")])
    text = path.read_text()
    path.write_text(text + " " * (first.st_size - len(text.encode())))
    os.utime(path, ns=(first.st_atime_ns, first.st_mtime_ns))
    assert (path.stat().st_size, path.stat().st_mtime_ns) == (first.st_size, first.st_mtime_ns)
    assert not gate(chip).allows("aten::relu", RELU, "vendor")
