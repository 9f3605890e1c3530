"""A run reports only what happened: ok only for the record on disk that the run wrote, write errors a
clean `ok: false` naming the path, an interrupted run's journal kept until resumed or discarded, and
a relative --record-dir where it says. No suite runs here: pytest is replaced where a run would start it.
"""

from __future__ import annotations

import errno
import json
import resource
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from typer.testing import CliRunner

import torch_fl.cli.conformance  # noqa: F401  (registers the commands)
from torch_fl.cli import app
from torch_fl.conformance import journal, recordfile, runner
from torch_fl.conformance.recordfile import identity
from torch_fl.conformance.runner import RunOptions, record_file_for
from torch_fl.platform import load_descriptor
from torch_fl.platform.discovery import shipped_root
from torch_fl.platform.record import installed_version
from torch_fl.platform.versions import minor_line

LINE = minor_line(installed_version("torch") or "0")


@pytest.fixture
def no_pytest(monkeypatch):
    """Runs that start no pytest: `exit` is the status the pytest that was not started returns."""
    calls = []

    def fake(argv, platform, log, cwd, exit=0):
        calls.append(argv)
        return exit

    monkeypatch.setattr(runner, "_run_pytest", fake)
    return calls


def complete_record(folder: Path) -> Path:
    header = identity(load_descriptor(shipped_root() / "host_ref"))
    header["started"] = "2026-10-01T10:00:00Z"
    path = folder / f"torch-{LINE}.json"
    recordfile.write_cases(path, header, [])
    return path


def test_a_relative_record_dir_is_where_it_says(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    path = record_file_for("host_ref", Path("out"))
    assert path.is_absolute() and path == tmp_path / "out" / f"torch-{LINE}.json"


def test_a_record_this_run_did_not_write_is_not_ok(tmp_path, no_pytest):
    before = complete_record(tmp_path).read_bytes()
    outcome = runner.run(RunOptions(platform="host_ref", record_dir=tmp_path, full=True))
    assert no_pytest, "pytest was not (pretend-)started"
    assert not outcome.complete and outcome.error is not None
    assert str(tmp_path / f"torch-{LINE}.json") in outcome.error
    assert (tmp_path / f"torch-{LINE}.json").read_bytes() == before


def test_a_later_run_keeps_an_interrupted_runs_journal(tmp_path, no_pytest):
    path = journal.journal_path(tmp_path / f"torch-{LINE}.json")
    journal.start(path, {"platform": "host_ref", "binding": {}})
    with pytest.raises(ValueError, match="--resume.*--discard") as info:
        runner.run(RunOptions(platform="host_ref", record_dir=tmp_path, k="add"))
    assert str(path) in str(info.value)
    assert journal.header(path) is not None and not no_pytest
    runner.run(RunOptions(platform="host_ref", record_dir=tmp_path, k="add", discard=True))
    assert not path.exists() and no_pytest


def test_a_write_error_is_a_clean_json_naming_the_path(monkeypatch):
    def full_disk(options):
        raise OSError(errno.ENOSPC, "No space left on device", "/records/torch-2.13.json")

    monkeypatch.setattr(runner, "run", full_disk)
    result = CliRunner().invoke(app, ["conformance", "run", "host_ref", "--json"])
    assert result.exit_code == 1
    out = json.loads(result.stdout)
    assert out["ok"] is False and "/records/torch-2.13.json" in out["error"] and "No space left" in out["error"]


def _small_files() -> None:
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails with EFBIG instead
    resource.setrlimit(resource.RLIMIT_FSIZE, (4096, 4096))


def test_a_journal_entry_cut_short_by_a_full_disk_is_an_error(tmp_path):
    code = f"""
        from pathlib import Path
        from torch_fl import jsonl
        path = Path({str(tmp_path / "j.jsonl")!r})
        path.write_bytes(b"x" * 4000)
        try:
            jsonl.append(path, {{"kind": "case", "message": "y" * 500}})
        except OSError as exc:
            print("refused:", exc)
    """
    result = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, preexec_fn=_small_files
    )
    assert "refused:" in result.stdout and "j.jsonl" in result.stdout, result.stdout + result.stderr


def test_a_vendor_source_edited_during_the_run_fails_it():
    collector = recordfile.Collector()
    collector.feed([{"kind": "run", "binding": {"sources": {"kernels.py": "sha256:aa"}}}])
    collector.feed([{"kind": "imported", "sources": {"kernels.py": "sha256:aa"}}])
    assert collector.changed_sources() == []
    collector.feed([{"kind": "imported", "sources": {"kernels.py": "sha256:bb"}}])  # another worker, later
    (problem,) = collector.changed_sources()
    assert problem.startswith("kernels.py changed during the run") and "sha256:bb" in problem


def test_the_vendor_module_a_process_imports_is_known_by_its_hash(tmp_path):
    import hashlib
    import shutil

    from torch_fl.kernels.vendor import imported_sources, load_vendor_module

    folder = tmp_path / "hashed_chip"
    shutil.copytree(
        Path(__file__).parent / "fixtures" / "broken_chip", folder, ignore=shutil.ignore_patterns("records")
    )
    descriptor = folder / "platform.yaml"
    descriptor.write_text(descriptor.read_text().replace("name: broken_chip", "name: hashed_chip"))
    load_vendor_module(load_descriptor(folder))
    digest = "sha256:" + hashlib.sha256((folder / "kernels.py").read_bytes()).hexdigest()
    assert imported_sources()["kernels.py"] == digest
