"""`torch-fl schema`, `platforms list|show`, `preflight` with --json: one JSON document each."""

from __future__ import annotations

import json
import shutil
import sys

import pytest
from typer.testing import CliRunner

import torch_fl.cli.platforms  # noqa: F401  (registers the commands)
from torch_fl.cli import app
from torch_fl.platform import current_status, load_platform
from torch_fl.platform.discovery import shipped_root
from torch_fl.platform.schema import descriptor_json_schema

runner = CliRunner()


@pytest.fixture(autouse=True)
def plain_machine(monkeypatch):
    for var in ("FLAGOS_PLATFORM", "FLAGOS_PLATFORM_PATH", "FLAGOS_ALLOW_UNVALIDATED"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.delitem(sys.modules, "torch", raising=False)


def run_json(*args: str, code: int = 0):
    result = runner.invoke(app, [*args, "--json"])
    assert result.exit_code == code, result.output
    return json.loads(result.stdout)


def test_schema():
    assert run_json("schema") == descriptor_json_schema()
    assert json.loads(runner.invoke(app, ["schema"]).stdout) == descriptor_json_schema()


def test_platforms_list():
    data = run_json("platforms", "list")
    names = [p["name"] for p in data["platforms"]]
    assert {"host_ref", "nvidia_h200", "nvidia_a100", "drobotics_bpu_s600"} <= set(names)
    assert data["active"]["name"] == "host_ref" and data["active"]["forced"] is False
    assert "skipped: torch is not imported" in data["active"]["reason"]
    host = next(p for p in data["platforms"] if p["name"] == "host_ref")
    assert host["active"] is True and host["origin"] == "shipped" and host["backing"] == "cpu"
    # host_ref ships a record: the status is what that record says for the torch installed here
    expected = {"valid": "validated", "stale": "stale", "missing": "unvalidated"}
    assert host["status"] == expected[current_status(load_platform("host_ref")).state]
    h200 = next(p for p in data["platforms"] if p["name"] == "nvidia_h200")
    assert h200["detection"]["rules"][0]["matched"] is None
    assert h200["detection"]["rules"][0]["reason"] == "skipped: torch is not imported"
    ascend = next(p for p in data["platforms"] if p["name"] == "ascend_910c")
    assert ascend["runtime_supported"] is False


def test_platforms_list_human_says_what_is_active():
    result = runner.invoke(app, ["platforms", "list"])
    assert result.exit_code == 0
    assert "active: host_ref" in result.stdout and "nvidia_h200" in result.stdout


def test_platforms_list_with_forced_and_overriding_and_broken(tmp_path, monkeypatch):
    shutil.copytree(shipped_root() / "host_ref", tmp_path / "host_ref")
    (tmp_path / "broken_chip").mkdir()
    (tmp_path / "broken_chip" / "platform.yaml").write_text("schema_version: 1\nname: broken_chip\n")
    monkeypatch.setenv("FLAGOS_PLATFORM_PATH", str(tmp_path))
    monkeypatch.setenv("FLAGOS_PLATFORM", "nvidia_h200")
    data = run_json("platforms", "list")
    assert data["active"] == {"name": "nvidia_h200", "reason": "forced by FLAGOS_PLATFORM=nvidia_h200", "forced": True}
    host = next(p for p in data["platforms"] if p["name"] == "host_ref")
    assert host["origin"] == "path" and host["overrides"] == [str(shipped_root() / "host_ref")]
    broken = next(p for p in data["platforms"] if p["name"] == "broken_chip")
    assert broken["status"] == "invalid" and "missing required field" in broken["error"]


def test_platforms_list_with_unknown_forced_platform(monkeypatch):
    monkeypatch.setenv("FLAGOS_PLATFORM", "nope")
    data = run_json("platforms", "list")
    assert data["active"] is None and "known platforms" in data["selection_error"]


def test_platforms_show():
    data = run_json("platforms", "show", "nvidia_a100")
    assert data["descriptor"]["boards"] == ["A100", "H800"]
    assert data["status"]["status"] == "unvalidated"
    assert data["descriptor_hash"].startswith("sha256:")
    human = runner.invoke(app, ["platforms", "show", "nvidia_a100"])
    assert human.exit_code == 0 and "A100, H800" in human.stdout


def test_platforms_show_unknown():
    data = run_json("platforms", "show", "nope", code=1)
    assert data["ok"] is False and "known platforms" in data["error"]


def test_preflight_selected_platform():
    data = run_json("preflight")
    assert data["ok"] is True and data["platform"] == "host_ref"
    assert data["selection"]["name"] == "host_ref"
    assert {c["name"] for c in data["checks"]} >= {"backing", "python", "torch"}


def test_preflight_failure_exits_nonzero_and_lists_reasons():
    data = run_json("preflight", "ascend_910c", code=1)
    assert data["ok"] is False
    failed = {c["name"] for c in data["checks"] if not c["ok"]}
    assert "backing" in failed
    human = runner.invoke(app, ["preflight", "ascend_910c"])
    assert human.exit_code == 1 and "not ready" in human.stdout


def test_preflight_unknown_platform():
    assert "known platforms" in run_json("preflight", "nope", code=1)["error"]


def test_preflight_matrix():
    data = run_json("preflight", "--matrix")
    assert data["ok"] is True and data["errors"] == {}
    assert data["markdown"].startswith("| platform | boards |")
    assert {r["platform"] for r in data["rows"]} >= {"host_ref", "nvidia_h200"}
    human = runner.invoke(app, ["preflight", "--matrix"])
    assert human.exit_code == 0 and human.stdout == data["markdown"]


def test_preflight_matrix_fails_on_a_broken_descriptor(tmp_path, monkeypatch):
    (tmp_path / "broken_chip").mkdir()
    (tmp_path / "broken_chip" / "platform.yaml").write_text("name: [\n")
    monkeypatch.setenv("FLAGOS_PLATFORM_PATH", str(tmp_path))
    data = run_json("preflight", "--matrix", code=1)
    assert "invalid YAML" in data["errors"]["broken_chip"]


def test_platforms_list_says_why_a_platform_is_tampered(tmp_path, monkeypatch):
    folder = tmp_path / "host_ref"
    shutil.copytree(shipped_root() / "host_ref", folder)
    record = folder / "records" / "torch-2.13.json"
    record.write_text(record.read_text().replace('"complete": true', '"complete": false', 1))
    monkeypatch.setenv("FLAGOS_PLATFORM_PATH", str(tmp_path))
    result = runner.invoke(app, ["platforms", "list"])
    assert result.exit_code == 0, result.output
    rows = {row["name"]: row for row in run_json("platforms", "list")["platforms"]}
    assert rows["host_ref"]["status"] == "tampered"
    line = next((row for row in result.stdout.splitlines() if row.startswith("host_ref is tampered: ")), None)
    assert line is not None and "torch-2.13.json" in line, result.stdout


def test_a_slip_of_a_platform_name_suggests_the_known_one(monkeypatch):
    result = runner.invoke(app, ["platforms", "show", "Host_Ref", "--json"])
    assert result.exit_code == 1 and "did you mean 'host_ref'?" in json.loads(result.stdout)["error"]
    from torch_fl.platform.errors import SelectionError
    from torch_fl.platform.selection import select_platform

    monkeypatch.setenv("FLAGOS_PLATFORM", "nvidia_h20")
    with pytest.raises(SelectionError, match="did you mean 'nvidia_h200'"):
        select_platform()
