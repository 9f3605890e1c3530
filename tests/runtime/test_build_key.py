"""The core's build cache is keyed by what makes the library: another compiler is another library."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from torch_fl.runtime import build


def test_another_compiler_gets_another_build(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CXX", raising=False)
    default = build.build_key()
    fake = tmp_path / "c++"
    fake.write_text("#!/bin/sh\nexit 0\n")
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("CXX", str(fake))
    other = build.build_key()
    assert other != default
    os.utime(fake, ns=(1, 1))  # the same path, replaced by another binary
    assert build.build_key() not in (default, other)
    monkeypatch.delenv("CXX")
    assert build.build_key() == default
