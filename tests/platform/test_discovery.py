"""Discovery: shipped platforms through importlib.resources, plus FLAGOS_PLATFORM_PATH like PATH."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from torch_fl.platform import SelectionError, load_all, load_platform
from torch_fl.platform.discovery import discover, shipped_root


def copy_platform(dest_parent: Path, name: str = "host_ref", as_name: str | None = None) -> Path:
    """A copy of a shipped platform folder, renamed (and its `name:` rewritten) when asked."""
    target = dest_parent / (as_name or name)
    shutil.copytree(shipped_root() / name, target)
    if as_name:
        path = target / "platform.yaml"
        path.write_text(path.read_text().replace(f"name: {name}\n", f"name: {as_name}\n"))
    return target


def test_shipped_platforms_come_from_the_package(monkeypatch):
    monkeypatch.delenv("FLAGOS_PLATFORM_PATH", raising=False)
    found = discover()
    assert "host_ref" in found
    src = found["host_ref"]
    assert (src.origin, src.overrides) == ("shipped", ())
    assert src.directory == shipped_root() / "host_ref"
    assert src.descriptor_path.is_file()
    assert list(found) == sorted(found)


def test_path_entry_may_be_a_platform_folder_or_hold_them(tmp_path, monkeypatch):
    single = copy_platform(tmp_path / "one", as_name="chip_a")
    copy_platform(tmp_path / "many", as_name="chip_b")
    copy_platform(tmp_path / "many", as_name="chip_c")
    (tmp_path / "many" / "not_a_platform").mkdir()
    monkeypatch.setenv("FLAGOS_PLATFORM_PATH", os.pathsep.join([str(single), str(tmp_path / "many")]))
    found = discover()
    assert {"chip_a", "chip_b", "chip_c"} <= set(found)
    assert "not_a_platform" not in found
    assert found["chip_a"].directory == single and found["chip_a"].origin == "path"
    loaded, broken = load_all(found)
    assert not broken and {"chip_a", "chip_b", "chip_c"} <= set(loaded)


def test_path_platform_overrides_a_shipped_one_and_says_so(tmp_path):
    mine = copy_platform(tmp_path)
    found = discover(path_env=str(tmp_path))
    assert found["host_ref"].directory == mine
    assert found["host_ref"].origin == "path"
    assert found["host_ref"].overrides == (shipped_root() / "host_ref",)


def test_earlier_path_entry_wins_and_records_what_it_hides(tmp_path):
    first = copy_platform(tmp_path / "first", as_name="chip")
    second = copy_platform(tmp_path / "second", as_name="chip")
    found = discover(path_env=os.pathsep.join([str(tmp_path / "first"), str(tmp_path / "second")]))
    assert found["chip"].directory == first
    assert found["chip"].overrides == (second,)


def test_shipped_override_and_later_duplicate_are_both_recorded(tmp_path):
    first = copy_platform(tmp_path / "first")
    second = copy_platform(tmp_path / "second")
    found = discover(path_env=os.pathsep.join([str(tmp_path / "first"), str(tmp_path / "second")]))
    assert found["host_ref"].directory == first
    assert found["host_ref"].overrides == (shipped_root() / "host_ref", second)


def test_missing_path_entry_warns_and_is_skipped(tmp_path):
    with pytest.warns(UserWarning, match="not a folder"):
        found = discover(path_env=os.pathsep.join([str(tmp_path / "nope"), ""]))
    assert "host_ref" in found


def test_broken_path_platform_does_not_hide_the_others(tmp_path):
    bad = copy_platform(tmp_path, as_name="broken_chip")
    (bad / "platform.yaml").write_text("schema_version: 1\nname: broken_chip\n")
    loaded, broken = load_all(discover(path_env=str(tmp_path)))
    assert "host_ref" in loaded and set(broken) == {"broken_chip"}
    assert "missing required field" in str(broken["broken_chip"])


def test_load_platform_by_name(monkeypatch):
    monkeypatch.delenv("FLAGOS_PLATFORM_PATH", raising=False)
    assert load_platform("nvidia_h200").name == "nvidia_h200"
    with pytest.raises(SelectionError, match="known platforms: .*host_ref"):
        load_platform("no_such_chip")
