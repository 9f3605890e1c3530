"""Files are replaced atomically: a failure leaves the old file whole and no temporary file behind."""

from __future__ import annotations

import os
import stat

import pytest
from onboard_helpers import make, snapshot

from torch_fl.onboarding import onboard as onboard_module
from torch_fl.onboarding import writer
from torch_fl.onboarding.errors import OnboardError


def test_write_replaces_whole_files(tmp_path):
    target = tmp_path / "a" / "file.txt"
    writer.write_atomically(target, "one\n")
    writer.write_atomically(target, "two\n")
    assert target.read_text() == "two\n" and os.listdir(target.parent) == ["file.txt"]


def test_failed_replace_keeps_the_old_file(tmp_path, monkeypatch):
    target = tmp_path / "file.txt"
    target.write_text("old\n")

    def broken(src, dst):
        raise OSError("disk full")

    monkeypatch.setattr(writer.os, "replace", broken)
    with pytest.raises(OSError, match="disk full"):
        writer.write_atomically(target, "new\n")
    assert target.read_text() == "old\n" and os.listdir(tmp_path) == ["file.txt"]


def test_modes_are_those_of_a_plain_write(tmp_path):
    target = tmp_path / "file.txt"
    writer.write_atomically(target, "x\n")
    mask = os.umask(0)
    os.umask(mask)
    assert stat.S_IMODE(target.stat().st_mode) == 0o666 & ~mask
    target.chmod(0o640)
    writer.write_atomically(target, "y\n")
    assert stat.S_IMODE(target.stat().st_mode) == 0o640


def test_interrupted_run_is_recognised_by_the_next(repo, monkeypatch):
    """A run that dies after some files leaves no half files, and a re-run completes it."""
    calls = {"n": 0}
    real = writer.write_atomically

    def dies_on_third(path, text):
        calls["n"] += 1
        if calls["n"] == 3:
            raise KeyboardInterrupt
        real(path, text)

    monkeypatch.setattr(writer, "write_atomically", dies_on_third)
    with pytest.raises(KeyboardInterrupt):
        make(repo)
    monkeypatch.setattr(writer, "write_atomically", real)
    leftovers = [p for p in (repo / "plats/demo_chip").iterdir() if p.name.endswith(".tmp")]
    assert not leftovers
    report = make(repo)
    assert report.ok
    assert {f.path.name: f.action for f in report.files}["platform.yaml"] == "unchanged"


def test_template_that_renders_an_invalid_descriptor_writes_nothing(repo, monkeypatch):
    monkeypatch.setattr(onboard_module.render, "render_descriptor", lambda d, like: "name: [unclosed\n")
    before = snapshot(repo)
    with pytest.raises(OnboardError, match="does not validate"):
        make(repo)
    assert snapshot(repo) == before
