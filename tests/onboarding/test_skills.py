"""The shipped skills: Agent Skills format, and every `torch-fl` command they name exists with its options."""

from __future__ import annotations

import re
import shlex
from pathlib import Path
from typing import Any

import pytest
import typer
from onboard_helpers import cli, runner

from torch_fl.cli import app
from torch_fl.skills.catalog import all_skills, front_matter, skills_root

REQUIRED = {"onboard-new-chip", "add-vendor-kernel", "change-a-kernel", "tune-routes", "triage-conformance-failures"}
SKILLS = sorted(p.name for p in skills_root().iterdir() if (p / "SKILL.md").is_file())
FENCE = re.compile(r"```(?:sh|bash|shell)?\n(.*?)```", re.DOTALL)
INLINE = re.compile(r"`(torch-fl [^`]+)`")


def commands_in(text: str) -> list[str]:
    """Every `torch-fl ...` command of a SKILL.md: lines of code blocks, and inline code."""
    found = []
    for block in FENCE.findall(text):
        found += [line.strip() for line in block.splitlines() if line.strip().startswith("torch-fl ")]
    found += INLINE.findall(text)
    return found


def is_group(command: Any) -> bool:
    return hasattr(command, "commands")  # typer's groups are click-like, not click.Group subclasses


def resolve(argv: list[str]) -> tuple[list[str], Any, list[str]]:
    """Walk the command tree: the subcommand path, the command it ends on, and the remaining words."""
    command = typer.main.get_command(app)
    path: list[str] = []
    rest = list(argv)
    while is_group(command) and rest and rest[0] in command.commands:
        path.append(rest.pop(0))
        command = command.commands[path[-1]]
    return path, command, rest


def options_of(command: Any) -> set[str]:
    return {
        opt for param in command.params for opt in getattr(param, "opts", []) + getattr(param, "secondary_opts", [])
    }


def test_the_required_skills_ship():
    assert REQUIRED <= set(SKILLS)


@pytest.mark.parametrize("name", SKILLS)
def test_front_matter(name):
    text = (skills_root() / name / "SKILL.md").read_text()
    meta = front_matter(text, name)
    assert meta["name"] == name
    assert 40 <= len(meta["description"]) <= 1024 and "Use when" in meta["description"]
    assert re.fullmatch(r"[a-z0-9]+(-[a-z0-9]+)*", name)
    body = text.split("\n---\n", 1)[1]
    assert re.search(r"^## 1\. ", body, re.MULTILINE), "steps are numbered sections"


@pytest.mark.parametrize("name", SKILLS)
def test_every_step_has_a_json_command_and_an_exit_criterion(name):
    text = (skills_root() / name / "SKILL.md").read_text()
    steps = re.split(r"^## \d+\. ", text, flags=re.MULTILINE)[1:]
    assert steps
    for step in steps:
        commands = commands_in(step)
        title = step.splitlines()[0]
        if not commands:
            continue  # a step of prose (e.g. writing the kernel) between commands
        assert "Exit criterion" in step, f"{name}: step {title!r} has no exit criterion"
        for command in commands:
            if not command.startswith("torch-fl "):
                continue
            words = shlex.split(command.split(" > ")[0])
            assert "--json" in words or "--help" in words, f"{name}: {command!r} lacks --json"


# Criteria that count every failing case, PyTorch's own kernels' too: unreachable on a platform
# where a native kernel fails (host_ref's record has a low-precision linear_cross_entropy backward).
UNREACHABLE = re.compile(r"\.distinct_failures == 0|\.summary\.failing == 0|\.failures_by_path\.native == 0")


@pytest.mark.parametrize("name", SKILLS)
def test_exit_criteria_count_only_what_the_platform_owns(name):
    text = (skills_root() / name / "SKILL.md").read_text()
    assert not UNREACHABLE.findall(text), f"{name}: an exit criterion counts PyTorch's own failures"


def test_the_owned_counts_the_criteria_use_exist():
    """The fields the criteria name are in the commands' JSON."""
    import inspect

    from torch_fl.cli import conformance
    from torch_fl.platform import triage

    text = " ".join((skills_root() / name / "SKILL.md").read_text() for name in SKILLS)
    assert ".owned_failures == 0" in text and ".summary.failing_owned == 0" in text
    assert "owned_failures=" in inspect.getsource(conformance._run_data)
    assert '"failing_owned"' in inspect.getsource(triage.triage)


def _all_commands() -> list[tuple[str, str]]:
    return [
        (name, command) for name in SKILLS for command in commands_in((skills_root() / name / "SKILL.md").read_text())
    ]


@pytest.mark.parametrize(("skill", "command"), _all_commands())
def test_command_exists_with_its_options(skill, command):
    words = shlex.split(command.split(" > ")[0])[1:]
    path, resolved, rest = resolve(words)
    if (
        not path
        and words
        and words[0] == "conformance"
        and not Path(__file__).parents[2].joinpath("torch_fl/cli/conformance.py").exists()
    ):
        pytest.skip("torch-fl conformance is not in this checkout yet")
    assert path, f"{skill}: {command!r} names no torch-fl command"
    assert not is_group(resolved), f"{skill}: {command!r} stops at the group {' '.join(path)}"
    known = options_of(resolved)
    for word in rest:
        if word.startswith("-"):
            assert word.split("=")[0] in known, f"{skill}: {command!r}: {' '.join(path)} has no option {word}"
    result = runner.invoke(app, [*path, "--help"])
    assert result.exit_code == 0, result.output


def test_commands_were_found():
    commands = {c for _, c in _all_commands()}
    for expected in (
        "torch-fl onboard",
        "torch-fl kernel add",
        "torch-fl triage",
        "torch-fl routes tune",
        "torch-fl conformance run",
    ):
        assert any(c.startswith(expected) for c in commands), expected


def test_list_and_show():
    data = cli("skills", "list")
    assert {s["name"] for s in data["skills"]} == set(SKILLS)
    shown = cli("skills", "show", "add-vendor-kernel")
    assert shown["text"].startswith("---\nname: add-vendor-kernel\n")
    assert cli("skills", "show", "no-such-skill", code=1)["ok"] is False


def test_install_is_idempotent(tmp_path):
    target = tmp_path / "agent" / "skills"
    first = cli("skills", "install", str(target))
    assert {f["action"] for f in first["files"]} == {"created"}
    assert sorted(p.name for p in target.iterdir()) == SKILLS
    for name in SKILLS:
        assert (target / name / "SKILL.md").read_text() == (skills_root() / name / "SKILL.md").read_text()
    second = cli("skills", "install", str(target))
    assert {f["action"] for f in second["files"]} == {"unchanged"}
    (target / "tune-routes" / "SKILL.md").write_text("stale\n")
    third = cli("skills", "install", str(target), "--skill", "tune-routes")
    assert [f["action"] for f in third["files"]] == ["updated"]


def test_install_default_directory(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    data = cli("skills", "install", "--dry-run")
    assert data["directory"] == str(tmp_path / ".claude" / "skills")
    assert not (tmp_path / ".claude").exists()


def test_catalog_matches_folders():
    assert [s.name for s in all_skills()] == SKILLS
