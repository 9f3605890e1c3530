"""Onboard keeps its manifest and files consistent: concurrent runs, kernel add, interrupted runs."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest
from onboard_helpers import cli, make

from torch_fl.filelock import LockHeld
from torch_fl.onboarding import writer
from torch_fl.onboarding.writer import Manifest, digest

CHIP = "demo_chip"


def _consistent(folder: Path) -> None:
    """Every file the manifest lists has the bytes the manifest says, and nothing is pending."""
    manifest = Manifest.read(folder)
    assert manifest is not None and not manifest.pending
    for key, expected in manifest.files.items():
        assert digest((folder / key).read_text(encoding="utf-8")) == expected, f"{key} does not match the manifest"


def _leftovers(repo: Path) -> list[str]:
    return sorted(str(p.relative_to(repo)) for p in repo.rglob(".*") if p.is_file() and p.suffix in (".tmp", ".lock"))


def test_a_second_onboard_of_the_name_refuses_while_the_first_writes(repo, monkeypatch):
    first_wrote, go_on = threading.Event(), threading.Event()
    real = writer.write_atomically
    first: dict[str, object] = {}

    def pausing(path, text):
        real(path, text)
        if threading.current_thread().name == "first" and not first_wrote.is_set():
            first_wrote.set()
            go_on.wait(30)

    def run_first() -> None:
        try:
            first["report"] = make(repo, like="host_ref")
        except BaseException as exc:  # noqa: BLE001 - handed to the test thread
            first["error"] = exc

    monkeypatch.setattr(writer, "write_atomically", pausing)
    thread = threading.Thread(target=run_first, name="first")
    thread.start()
    try:
        assert first_wrote.wait(60), "the first onboard wrote nothing"
        with pytest.raises(LockHeld) as refused:
            make(repo, like="nvidia_h200")
    finally:
        go_on.set()
        thread.join(60)
    assert "error" not in first, first.get("error")
    assert f"pid {os.getpid()}" in str(refused.value) and "started" in str(refused.value)
    folder = repo / "plats" / CHIP
    _consistent(folder)
    assert Manifest.read(folder).options["like"] == "host_ref"
    assert not _leftovers(repo)
    # once the first is done, the other --like goes through, and the manifest still matches
    assert make(repo, like="nvidia_h200").ok
    _consistent(folder)


def test_onboard_and_kernel_add_refuse_while_the_lock_is_held(repo):
    make(repo)
    with writer.locked(repo / "plats" / CHIP):
        refusals = [
            cli("onboard", "--chip", CHIP, "--platforms-dir", "plats", code=1),
            cli("kernel", "add", CHIP, "--op", "aten::silu", code=1),
        ]
        dry = cli("onboard", "--chip", CHIP, "--platforms-dir", "plats", "--dry-run")  # reads only: no lock
    for out in refusals:
        assert not out["ok"] and f"pid {os.getpid()}" in out["error"] and ".demo_chip.lock" in out["error"], out
    assert dry["ok"] and not _leftovers(repo)


def test_kernel_add_keeps_a_second_onboard_unchanged(repo):
    make(repo)
    cli("kernel", "add", CHIP, "--op", "aten::silu")
    again = cli("onboard", "--chip", CHIP, "--platforms-dir", "plats", code=0)
    assert again["ok"] and {f["action"] for f in again["files"]} == {"unchanged"}, again["files"]
    folder = repo / "plats" / CHIP
    _consistent(folder)
    # another --like keeps the added kernel too
    other = cli("onboard", "--chip", CHIP, "--like", "nvidia_h200", "--platforms-dir", "plats", code=0)
    assert other["ok"], other["files"]
    assert "      aten::silu: silu\n" in (folder / "platform.yaml").read_text()
    assert "def silu(" in (folder / "vendor_kernels.py").read_text()
    _consistent(folder)
    assert {f["action"] for f in cli("onboard", "--chip", CHIP, "--platforms-dir", "plats")["files"]} == {"unchanged"}


def test_kernel_add_keeps_a_persons_edit_theirs(repo):
    make(repo)
    folder = repo / "plats" / CHIP
    descriptor = folder / "platform.yaml"
    descriptor.write_text(descriptor.read_text().replace("capabilities:\n", "capabilities:  # rev B\n"))
    cli("kernel", "add", CHIP, "--op", "aten::silu")
    again = cli("onboard", "--chip", CHIP, "--platforms-dir", "plats", code=3)
    actions = {Path(f["path"]).name: f["action"] for f in again["files"]}
    assert actions.pop("platform.yaml") == "skipped-edited" and set(actions.values()) == {"unchanged"}
    assert "capabilities:  # rev B\n" in descriptor.read_text()


def test_orphans_of_an_interrupted_run_are_removed(repo):
    make(repo)
    folder = repo / "plats" / CHIP
    orphans = [
        folder / ".platform.yaml.k3j4h5g6.tmp",
        folder / ".routes.yaml.4194999.abcdefgh.tmp",
        repo / ".github" / "workflows" / ".flagos-demo_chip.yml.4194999.abcdefgh.tmp",
    ]
    live = folder / f".README.md.{os.getpid()}.abcdefgh.tmp"  # a writer still at work
    for path in [*orphans, live]:
        path.write_text("half")
    assert make(repo).ok
    assert [p for p in orphans if p.exists()] == [] and live.exists()


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP], ids=["SIGTERM", "SIGHUP"])
def test_a_signal_mid_write_leaves_no_temporary_file(repo, sig):
    """Stopped while a file is half written, onboard removes its temporary file and its lock."""
    script = textwrap.dedent(f"""
        import os, sys
        import torch_fl.fileio as fileio
        real = fileio.os.replace
        calls = []
        def replace(src, dst):
            calls.append(dst)
            if len(calls) == 3:
                os.kill(os.getpid(), {int(sig)})
            return real(src, dst)
        fileio.os.replace = replace
        sys.argv = ["torch-fl", "onboard", "--chip", "{CHIP}", "--platforms-dir", "plats", "--json"]
        from torch_fl.cli import main
        main()
    """)
    proc = subprocess.run(
        [sys.executable, "-c", script],
        cwd=repo,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "FLAGOS_PLATFORM_PATH": str(repo / "plats")},
    )
    assert proc.returncode == 128 + int(sig), proc.stdout[-2000:] + proc.stderr[-2000:]
    assert not _leftovers(repo)
    report = make(repo)  # the next run completes the work
    assert report.ok
    _consistent(repo / "plats" / CHIP)
    assert json.loads((repo / "plats" / CHIP / ".onboard.json").read_text())["platform"] == CHIP
