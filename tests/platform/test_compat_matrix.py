"""The Markdown compatibility matrix is computed from descriptors and records, never hand-written."""

from __future__ import annotations

import shutil
from pathlib import Path

from torch_fl.conformance import recordfile
from torch_fl.conformance.recordfile import identity
from torch_fl.platform import load_all, load_descriptor, matrix_markdown, matrix_row
from torch_fl.platform.discovery import discover, shipped_root
from torch_fl.platform.matrix import COLUMNS
from torch_fl.platform.record import record_path


def with_record(tmp_path: Path, name: str, torch: str, hash_ok: bool = True, cases=None) -> Path:
    folder = tmp_path / name
    if not folder.exists():
        shutil.copytree(shipped_root() / name, folder)
    header = identity(load_descriptor(folder))
    header["binding"].update(torch=torch, torch_version=f"{torch}.0", kernel_libraries={})
    if not hash_ok:
        header["binding"]["descriptor_hash"] = "sha256:0"
    header["started"] = "2026-10-01T00:00:00Z"
    recordfile.write_cases(record_path(folder, torch), header, cases or [])
    return folder


def test_shipped_matrix_lists_every_platform_unvalidated():
    loaded, broken = load_all(discover(path_env=""))
    assert not broken
    table = matrix_markdown(loaded)
    lines = table.strip().splitlines()
    assert lines[0] == "| " + " | ".join(COLUMNS) + " |"
    assert len(lines) == 2 + len(loaded)
    assert all(line.count("|") == len(COLUMNS) + 1 for line in lines)
    a100 = next(line for line in lines if line.startswith("| nvidia_a100 "))
    assert "| A100, H800 |" in a100 and "| unvalidated |" in a100 and "| CUDA 13.3 |" in a100
    assert "| nccl (basic, ddp, fsdp2) | flagtree | cupti | bfloat16, float16 | - |" in a100


def test_records_set_status_and_pass_counts(tmp_path):
    cases = [
        {"id": "a", "suite": "ops", "op": "aten::mm", "dtype": "float32", "path": "native", "status": "passed"},
        {"id": "b", "suite": "ops", "op": "aten::mm", "dtype": "float16", "path": "native", "status": "failed"},
        {"id": "c", "suite": "amp", "status": "passed"},
    ]
    folder = with_record(tmp_path, "host_ref", "2.13", cases=cases)
    with_record(tmp_path, "host_ref", "2.11", hash_ok=False)
    row = matrix_row(load_descriptor(folder))
    assert row.status == "validated (torch 2.13), stale (torch 2.11)"
    assert row.conformance == "torch 2.13: native 1/2; torch 2.11: no op cases"


def test_pipes_in_cells_are_escaped(tmp_path):
    folder = tmp_path / "host_ref"
    shutil.copytree(shipped_root() / "host_ref", folder)
    path = folder / "platform.yaml"
    path.write_text(path.read_text().replace("vendor: torch-fl", "vendor: a|b"))
    line = matrix_markdown({"host_ref": load_descriptor(folder)}).splitlines()[2]
    assert "a\\|b" in line and line.count(" | ") == len(COLUMNS) - 1
