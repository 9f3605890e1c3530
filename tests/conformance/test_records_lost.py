"""A run never loses the record it would replace: subset runs, killed runs, concurrent runs, --resume.

The complete record is made by the smallest real run (the rng suite, one worker) in a temporary
record folder; each test then does to it what a person or a CI job would: a quick subset check,
a run killed midway, a second run started while one is going, `--resume` with nothing to resume.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from conformance_helpers import cases_by_id, cli_command, conformance, run_env

from torch_fl import filelock
from torch_fl.conformance import journal, recordfile
from torch_fl.conformance.runner import PATHS, SUITES, RunOptions, destination, suite_file
from torch_fl.filelock import LockHeld, hold
from torch_fl.platform.record import installed_version, load_record
from torch_fl.platform.versions import minor_line

pytestmark = pytest.mark.slow  # conformance runs that are killed and resumed

LINE = minor_line(installed_version("torch") or "0")
RECORD = f"torch-{LINE}.json"
RNG = ["host_ref", "--suite", "rng", "-n", "1"]
OPS = ["host_ref", "--suite", "ops", "-k", "float32 and (add or mul)", "-n", "1"]


@pytest.fixture(scope="module")
def complete_record(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A complete record of the rng suite (--add starts the record from a subset where there is none)."""
    records = tmp_path_factory.mktemp("complete") / "records"
    out = conformance([*RNG, "--add", "--record-dir", str(records)], run_env())
    assert out["ok"] and out["complete"] and not out["partial"], out
    assert Path(out["record"]) == records / RECORD
    return records / RECORD


@pytest.fixture
def records(complete_record: Path, tmp_path: Path) -> Path:
    """A private copy of the folder holding the complete record."""
    folder = tmp_path / "records"
    shutil.copytree(complete_record.parent, folder)
    return folder


def _journaled_cases(path: Path) -> int:
    try:
        return sum(1 for line in path.read_text().splitlines() if '"kind":"case"' in line)
    except FileNotFoundError:
        return 0


def _start(args: list[str]) -> subprocess.Popen:
    """`torch-fl conformance run ARGS --json` in a session of its own, so the test can end all of it."""
    return subprocess.Popen(
        [*cli_command(), "conformance", "run", *args, "--json"],
        env=run_env(),
        start_new_session=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )


def _wait_for_cases(folder: Path, proc: subprocess.Popen, count: int, timeout: float = 300) -> None:
    path = journal.journal_path(folder / RECORD)
    deadline = time.monotonic() + timeout
    while _journaled_cases(path) < count:
        assert proc.poll() is None, "the run ended before it could be interrupted"
        assert time.monotonic() < deadline, f"no {count} cases journaled within {timeout:g} s"
        time.sleep(0.05)


def _stat(pid: int) -> list[str] | None:
    """The fields of /proc/PID/stat after the command name (state first), None when there is no such process."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat[stat.rindex(")") + 2 :].split()


def _descendants(pid: int) -> dict[int, str]:
    """Every process below `pid`, whatever session or group it moved to, with its start time (so
    that a PID reused after it ended is never taken for it)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        fields = _stat(int(entry.name)) if entry.name.isdigit() else None
        if fields is not None:
            children.setdefault(int(fields[1]), []).append(int(entry.name))
    found: dict[int, str] = {}
    todo = [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            fields = _stat(child)
            if fields is not None:
                found[child] = fields[19]
                todo.append(child)
    return found


def _alive(pid: int, started: str) -> bool:
    fields = _stat(pid)
    return fields is not None and fields[19] == started and fields[0] != "Z"  # a zombie has ended


def _end(proc: subprocess.Popen, others: dict[int, str]) -> None:
    for pid, started in sorted(others.items()):
        if _alive(pid, started):
            os.kill(pid, signal.SIGKILL)
    proc.kill()
    proc.wait()


@pytest.fixture
def running(tmp_path: Path) -> Iterator[tuple[subprocess.Popen, Path, dict[int, str]]]:
    """A run of a few ops cases, journaling; whatever it started is killed when the test ends."""
    folder = tmp_path / "running"
    proc = _start([*OPS, "--record-dir", str(folder)])
    started: dict[int, str] = {}
    try:
        _wait_for_cases(folder, proc, 2)
        started.update(_descendants(proc.pid))
        yield proc, folder, started
    finally:
        started.update(_descendants(proc.pid))
        _end(proc, started)


# ---- a subset run next to a complete record
@pytest.mark.slow
def test_a_subset_run_writes_a_partial_record_and_keeps_the_complete_one(records: Path) -> None:
    before = (records / RECORD).read_bytes()
    out = conformance([*RNG, "-k", "test_multinomial", "--record-dir", str(records)], run_env())
    assert out["ok"] and out["complete"] and out["partial"], out
    partial = Path(out["record"])
    assert partial == recordfile.partial_path(records / RECORD) == records / f"torch-{LINE}.partial.json"
    assert list(cases_by_id(partial)) == ["rng/test_multinomial"]
    assert Path(out["summary"]) == partial.with_suffix(".md")
    assert (records / RECORD).read_bytes() == before, "a subset run replaced the complete record"
    # the gate reads the complete record, never the partial one next to it
    gated = load_record(records.parent, LINE)
    complete = json.loads(before)
    assert gated is not None and gated.complete and gated.checksum == complete["checksum"]
    assert gated.evidence is not None and gated.evidence.cases == complete["evidence"]["cases"] > 1


def test_add_starts_a_record_where_there_is_none(tmp_path: Path) -> None:
    """--add on a chip without a record makes this subset its record, as asked: nothing to extend."""
    from torch_fl.conformance.runner import check_addable, pytest_command

    check_addable("host_ref", tmp_path / RECORD)  # no error: there is nothing it must match
    options = RunOptions("host_ref", suites=["rng"], add=True)
    assert "--fl-add" not in pytest_command(options, tmp_path / RECORD, tmp_path / "pytest.ini", tmp_path / RECORD)


def test_only_a_full_run_or_add_replaces_a_complete_record(complete_record: Path, tmp_path: Path) -> None:
    partial = recordfile.partial_path(complete_record)
    for subset in ({"k": "add"}, {"suites": ["rng"]}, {"paths": ["native", "vendor"]}):
        assert destination(RunOptions("host_ref", **subset), complete_record) == partial, subset
        # a new chip's quick check is no record of it either: the gate would serve what it checked
        fresh = tmp_path / RECORD
        assert destination(RunOptions("host_ref", **subset), fresh) == recordfile.partial_path(fresh)
        assert destination(RunOptions("host_ref", add=True, **subset), fresh) == fresh
    assert destination(RunOptions("host_ref", suites=["rng"], add=True), complete_record) == complete_record
    every = RunOptions("host_ref", suites=list(SUITES), paths=list(PATHS))
    assert destination(every, complete_record) == complete_record
    assert destination(RunOptions("host_ref"), complete_record) == complete_record


# ---- a run killed midway
@pytest.mark.slow
def test_a_killed_run_leaves_the_complete_record_untouched(records: Path) -> None:
    before = (records / RECORD).read_bytes()
    proc = _start(["host_ref", "-n", "1", "--record-dir", str(records)])  # a full run: it would replace the record
    started: dict[int, str] = {}
    try:
        _wait_for_cases(records, proc, 3)
        time.sleep(1.0)  # past the first periodic merge
    finally:
        started.update(_descendants(proc.pid))
        _end(proc, started)
    assert (records / RECORD).read_bytes() == before, "the killed run replaced the complete record"
    interim = journal.interim_record(records / RECORD)
    assert interim.is_file() and json.loads(interim.read_text())["complete"] is False


def test_resume_without_a_journal_refuses(tmp_path: Path) -> None:
    command = [*cli_command(), "conformance", "run", *RNG, "--resume", "--record-dir", str(tmp_path), "--json"]
    proc = subprocess.run(command, env=run_env(), capture_output=True, text=True, timeout=300)
    out = json.loads(proc.stdout)
    assert proc.returncode != 0 and not out["ok"], out
    assert "--resume" in out["error"] and "no journal" in out["error"], out["error"]
    assert not (tmp_path / RECORD).exists()


# ---- two runs at once, and a run whose command is killed
@pytest.mark.slow
def test_a_second_run_refuses_naming_the_first(running) -> None:
    first, folder, _ = running
    header = journal.header(journal.journal_path(folder / RECORD))
    second = subprocess.run(
        [*cli_command(), "conformance", "run", *OPS, "--record-dir", str(folder), "--json"],
        env=run_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    out = json.loads(second.stdout)
    assert second.returncode != 0 and not out["ok"], out
    assert f"pid {first.pid}" in out["error"] and "started" in out["error"], out["error"]
    assert journal.header(journal.journal_path(folder / RECORD)) == header, "the second run restarted the journal"


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL], ids=["SIGTERM", "SIGKILL"])
def test_killing_the_command_ends_its_pytest_and_workers(running, sig) -> None:
    command, folder, started = running
    started.update(_descendants(command.pid))
    assert len(started) >= 2, "the run started no pytest process and worker"
    os.kill(command.pid, sig)  # the command only, as a CI timeout or a closed terminal would
    command.wait()
    deadline = time.monotonic() + 10
    while any(_alive(pid, at) for pid, at in started.items()) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not [pid for pid, at in started.items() if _alive(pid, at)], "the run's processes outlived the command"
    assert not (folder / RECORD).exists(), "a process of the killed run wrote the record"
    # the lock went with them: another run may start at once
    with hold(folder / f"torch-{LINE}.lock", "the next run"):
        pass


def test_the_plugin_refuses_resume_without_a_journal(tmp_path: Path) -> None:
    """Used directly (pytest -p torch_fl.conformance.plugin), the plugin refuses too."""
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            suite_file("rng"),
            "-p",
            "torch_fl.conformance.plugin",
            "-p",
            "no:cacheprovider",
            "--fl-platform",
            "host_ref",
            "--fl-record",
            str(tmp_path / RECORD),
            "--fl-resume",
            "-k",
            "test_multinomial",
            "-q",
        ],
        env=run_env(),
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
    )
    assert proc.returncode == 4 and "no journal" in proc.stderr, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert not (tmp_path / RECORD).exists()


# ---- the lock itself
def test_a_dead_holders_lock_is_taken_over_and_a_live_one_refuses(tmp_path: Path) -> None:
    lock = tmp_path / f"torch-{LINE}.lock"
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    lock.write_text(json.dumps({"pid": int(dead.stdout), "started": "earlier"}))  # left by a killed run
    with hold(lock, "a run"):
        assert json.loads(lock.read_text())["pid"] == os.getpid()
    assert not lock.exists()
    # the module alone (importing torch_fl would start torch): a holder that stays until killed
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import importlib.util, sys, time; from pathlib import Path\n"
            f"spec = importlib.util.spec_from_file_location('filelock', {filelock.__file__!r})\n"
            "module = importlib.util.module_from_spec(spec); spec.loader.exec_module(module)\n"
            f"with module.hold(Path({str(lock)!r}), 'x'):\n    print('held', flush=True); time.sleep(60)",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(LockHeld, match=f"a run is already in progress \\(pid {holder.pid}, started "):
            with hold(lock, "a run"):
                pass
    finally:
        holder.kill()
        holder.wait()
    with hold(lock, "a run"):  # its holder was killed: taken over
        pass
