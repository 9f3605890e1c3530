"""Every platform file is read within bounds: a regular file only, of a size and nesting depth capped
per kind, checked before anything is parsed. A file past a bound is one line naming it, and costs
only its own platform (and a record or route table only its gate or its table: native and cpu go on).
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

import torch_fl.cli.platforms  # noqa: F401  (registers the commands)
from torch_fl.cli import app
from torch_fl.conformance import journal
from torch_fl.fileio import RefusedFile, read_bounded
from torch_fl.platform import DescriptorError, load_descriptor, record_path, record_status
from torch_fl.platform.discovery import PlatformSource, load_all, shipped_root
from torch_fl.routing.table import RouteTableError
from torch_fl.routing.table import load as load_table

HOST_REF = shipped_root() / "host_ref"
DEEP_YAML = "x: " + "[" * 300 + "]" * 300 + "\n"
DEEP_JSON = '{"format": 3, "x": ' + "[" * 5000 + "]" * 5000 + "}"

pytestmark = pytest.mark.timeout(15)  # a FIFO that blocks a read fails the test instead of hanging it


@pytest.fixture(autouse=True)
def plain_machine(monkeypatch):
    for var in [v for v in os.environ if v.startswith("FLAGOS_")]:
        monkeypatch.delenv(var)


def host_copy(root: Path) -> Path:
    folder = root / "host_ref"
    shutil.copytree(HOST_REF, folder)
    return folder


def chip(root: Path, name: str, text: str) -> Path:
    folder = root / name
    folder.mkdir(parents=True)
    (folder / "platform.yaml").write_text(f"schema_version: 1\nname: {name}\n{text}")
    return folder


def fifo(path: Path) -> Path:
    path.unlink(missing_ok=True)
    os.mkfifo(path)
    return path


def sparse(path: Path, size: int) -> Path:
    with open(path, "wb") as f:
        f.truncate(size)
    return path


def dev_zero(path: Path) -> Path:
    path.unlink(missing_ok=True)
    path.symlink_to("/dev/zero")
    return path


# ---- the reader


def test_read_bounded_refuses_special_files_and_oversize_naming_the_file(tmp_path):
    regular = tmp_path / "ok.yaml"
    regular.write_bytes(b"12345")
    assert read_bounded(regular, 5) == b"12345"
    for path, why in (
        (fifo(tmp_path / "fifo.yaml"), "not a regular file"),
        (dev_zero(tmp_path / "zero.yaml"), "not a regular file"),
        (tmp_path, "not a regular file"),
        (sparse(tmp_path / "big.yaml", 1 << 40), "larger than"),
        (tmp_path / "missing.yaml", "cannot read"),
    ):
        with pytest.raises(RefusedFile) as info:
            read_bounded(path, 1 << 20)
        assert str(info.value).startswith(f"{path}: {why}"), str(info.value)
        assert "\n" not in str(info.value)


# ---- descriptors


@pytest.mark.parametrize(
    "make, why",
    [
        (lambda p: p.write_text("schema_version: 1\n" + DEEP_YAML), "nested more than"),
        (
            lambda p: p.write_text("schema_version: 1\nx:\n" + "".join("  " * i + f"k{i}:\n" for i in range(400))),
            "nested more than",
        ),
        (lambda p: p.write_text("schema_version: 1\nx:\n" + "- " * 400 + "1\n"), "nested more than"),
        (lambda p: sparse(p, 1 << 30), "larger than"),
        (fifo, "not a regular file"),
        (dev_zero, "not a regular file"),
    ],
    ids=["flow", "block", "compact", "huge", "fifo", "dev-zero"],
)
def test_a_bad_descriptor_is_one_line_and_others_still_load(tmp_path, make, why):
    bad = tmp_path / "bad_chip"
    bad.mkdir()
    make(bad / "platform.yaml")
    good = host_copy(tmp_path)
    sources = {
        "bad_chip": PlatformSource("bad_chip", bad, "path"),
        "host_ref": PlatformSource("host_ref", good, "path"),
    }
    loaded, broken = load_all(sources)
    assert set(loaded) == {"host_ref"} and set(broken) == {"bad_chip"}
    message = str(broken["bad_chip"])
    assert "\n" not in message and "platform.yaml" in message and why in message, message
    assert "recursion" not in message


def test_platforms_list_with_a_deep_descriptor_prints_no_traceback(tmp_path, monkeypatch):
    chip(tmp_path, "deep_chip", DEEP_YAML)
    monkeypatch.setenv("FLAGOS_PLATFORM_PATH", str(tmp_path))
    monkeypatch.delitem(sys.modules, "torch", raising=False)
    result = CliRunner().invoke(app, ["platforms", "list"])
    assert result.exit_code == 0, result.output[-3000:]
    assert "Traceback" not in result.output and "recursion" not in result.output
    assert len(result.output.splitlines()) < 60, result.output[-3000:]
    assert "deep_chip" in result.output and "nested more than" in result.output


# ---- route tables


@pytest.mark.parametrize(
    "make, why",
    [
        (lambda p: p.write_text("format: 1\nops: " + "{a: " * 300 + "1" + "}" * 300 + "\n"), "nested more than"),
        (lambda p: sparse(p, 1 << 30), "larger than"),
        (fifo, "not a regular file"),
        (dev_zero, "not a regular file"),
    ],
    ids=["deep", "huge", "fifo", "dev-zero"],
)
def test_a_bad_route_table_is_one_line(tmp_path, make, why):
    path = tmp_path / "routes.yaml"
    make(path)
    with pytest.raises(RouteTableError) as info:
        load_table(path)
    assert str(info.value).startswith(f"{path}: {why}") and "\n" not in str(info.value), str(info.value)


def test_many_bad_route_entries_are_summarized(tmp_path):
    from torch_fl.routing.checks import check_routing

    folder = host_copy(tmp_path)
    entries = "".join(f"  aten::nosuch{i}:\n    candidates: [native]\n" for i in range(2000))
    (folder / "routes.yaml").write_text("format: 1\nops:\n" + entries)
    problems = check_routing(load_descriptor(folder)).problems
    assert len(problems) <= 6, problems[:10]
    assert "nosuch0" in problems[0] and "1995 more" in problems[-1], problems[-1]


# ---- records


@pytest.mark.parametrize(
    "make, why",
    [
        (lambda p: p.write_text(DEEP_JSON), "nested more than"),
        (lambda p: sparse(p, 1 << 40), "larger than"),
        (fifo, "not a regular file"),
        (dev_zero, "not a regular file"),
    ],
    ids=["deep", "huge", "fifo", "dev-zero"],
)
def test_a_bad_record_is_stale_with_one_reason_naming_it(tmp_path, make, why):
    folder = host_copy(tmp_path)
    path = record_path(folder, "2.13")
    make(path)
    status = record_status(load_descriptor(folder), folder, "2.13.0", {})
    assert status.state == "stale" and len(status.reasons) == 1, status.reasons
    assert str(path) in status.reasons[0] and why in status.reasons[0], status.reasons


def test_a_special_file_beside_the_vendor_sources_does_not_block_hashing(tmp_path):
    folder = host_copy(tmp_path)
    fifo(folder / "kernels.py")
    dev_zero(folder / "helpers.py")
    status = record_status(load_descriptor(folder), folder, "2.13.0", {})
    assert status.state == "stale"
    assert "platform source kernels.py is new since the record was made" in status.reasons


# ---- journals


@pytest.mark.parametrize("make", [fifo, dev_zero, lambda p: sparse(p, 1 << 40)], ids=["fifo", "dev-zero", "huge"])
def test_a_bad_journal_is_refused_naming_it(tmp_path, make):
    path = make(tmp_path / "torch-2.13.journal.jsonl")
    with pytest.raises(RefusedFile, match=str(path)):
        journal.header(path)


def test_a_non_utf8_journal_line_is_skipped_not_a_bare_codec_error(tmp_path):
    path = tmp_path / "torch-2.13.journal.jsonl"
    path.write_bytes(b'{"kind": "run", "platform": "host_ref"}\n\xff\xfe garbage\n{"kind": "case"}\n')
    assert [e["kind"] for e in journal.read_all(path)] == ["run", "case"]


# ---- activation


ACTIVATES = """
    import warnings
    warnings.simplefilter("always")
    import torch, torch_fl
    x = torch.ones(2, device="flagos") + 1
    print("active", torch_fl.active_platform().name, x.device.type, x.sum().item())
"""


@pytest.mark.timeout(90)
def test_host_ref_activates_beside_bad_files_of_every_kind(tmp_path, run_python):
    chip(tmp_path, "deep_chip", DEEP_YAML)
    fifo(chip(tmp_path, "fifo_chip", "") / "platform.yaml")
    folder = host_copy(tmp_path)
    fifo(folder / "routes.yaml")
    (folder / "records" / "torch-2.13.json").write_text(DEEP_JSON)
    result = run_python(ACTIVATES, {"FLAGOS_PLATFORM_PATH": str(tmp_path)}, check=False, timeout=60)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "active host_ref flagos 4.0" in result.stdout
    assert "recursion" not in result.stderr and "Traceback" not in result.stderr, result.stderr[-3000:]
    assert len(result.stderr.splitlines()) <= 8, result.stderr[-3000:]
    assert result.stderr.count("platform deep_chip skipped") == 1 and "nested more than" in result.stderr
    assert result.stderr.count("platform fifo_chip skipped") == 1 and "not a regular file (a FIFO)" in result.stderr


def test_a_descriptor_error_still_names_its_line(tmp_path):
    folder = chip(tmp_path, "line_chip", "display_name: [1, 2]\n")
    with pytest.raises(DescriptorError, match=r"platform.yaml:3: display_name: "):
        load_descriptor(folder)
