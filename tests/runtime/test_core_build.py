"""The core build as a user sees it: a line per build step while it runs, its output when it fails,
and no compiler left running when the process that started it is killed.

A fake compiler (CXX) stands in for the real one: it records its pid, may sleep, and writes the
file it is asked for, so ninja runs the real build steps in seconds.
"""

from __future__ import annotations

import os
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from torch_fl.runtime import build

FAKE_CXX = """#!/bin/sh
case "$*" in *-dumpversion*|*--version*) echo 12.2.0; exit 0;; esac
echo $$ >> "$FAKE_CXX_PIDS"
[ -n "$FAKE_CXX_SLEEP" ] && sleep "$FAKE_CXX_SLEEP"
out=
while [ $# -gt 0 ]; do [ "$1" = "-o" ] && out=$2; shift; done
[ -n "$out" ] && : > "$out"
exit 0
"""


@pytest.fixture
def fake_cxx(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    cxx = tmp_path / "c++"
    cxx.write_text(FAKE_CXX)
    cxx.chmod(cxx.stat().st_mode | stat.S_IEXEC)
    pids = tmp_path / "pids"
    monkeypatch.setenv("CXX", str(cxx))
    monkeypatch.setenv("FAKE_CXX_PIDS", str(pids))
    return pids


def _sources(tmp_path: Path) -> list[Path]:
    files = [tmp_path / "src" / f"part{i}.cpp" for i in range(2)]
    files[0].parent.mkdir()
    for f in files:
        f.write_text("int x;\n")
    return files


def test_each_step_is_shown_and_a_failure_ends_with_the_build_output(tmp_path, fake_cxx, capsys):
    directory = tmp_path / "build"
    directory.mkdir()
    # the fake objects and library are empty files: the steps all run, then loading the library fails
    with pytest.raises(build.BuildFailed) as failed:
        build.build_library(directory, _sources(tmp_path))
    shown = capsys.readouterr().err
    assert "core build: 1 of 3 steps done" in shown and "core build: 3 of 3 steps done" in shown, shown
    assert str(directory) in str(failed.value) and "last output" in str(failed.value)
    assert len(fake_cxx.read_text().split()) >= 3  # two objects and the link, at least


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie is gone for our purpose
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except OSError:
        return False


def test_killing_the_building_process_stops_the_compilers(tmp_path, fake_cxx, monkeypatch):
    monkeypatch.setenv("FAKE_CXX_SLEEP", "120")
    directory = tmp_path / "build"
    directory.mkdir()
    code = (
        "import sys; from pathlib import Path; from torch_fl.runtime import build; "
        "build.build_library(Path(sys.argv[1]), [Path(p) for p in sys.argv[2:]])"
    )
    files = [str(p) for p in _sources(tmp_path)]
    env = {**os.environ, "TORCH_DEVICE_BACKEND_AUTOLOAD": "0"}
    builder = subprocess.Popen([sys.executable, "-c", code, str(directory), *files], env=env)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and not (fake_cxx.exists() and fake_cxx.read_text().strip()):
        time.sleep(0.1)
    compilers = [int(p) for p in fake_cxx.read_text().split()]
    assert compilers and all(_alive(p) for p in compilers), "no compiler was running"
    builder.send_signal(signal.SIGKILL)
    builder.wait()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and any(_alive(p) for p in compilers):
        time.sleep(0.1)
    assert not any(_alive(p) for p in compilers), "a compiler outlived the killed build"
