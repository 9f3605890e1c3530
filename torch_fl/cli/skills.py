"""`torch-fl skills list|show|install`: the agent skills shipped with torch-fl."""

from __future__ import annotations

import sys
from pathlib import Path

import typer
from rich.table import Table

from torch_fl.cli import app
from torch_fl.cli.output import JsonOption, console, emit, fail

skills_app = typer.Typer(help="Agent skills (skills/<name>/SKILL.md): list, show, install.", no_args_is_help=True)
app.add_typer(skills_app, name="skills")


@skills_app.command("list")
def list_cmd(as_json: bool = JsonOption) -> None:
    """List the shipped skills with their descriptions."""
    from torch_fl.skills.catalog import SkillError, all_skills

    try:
        skills = all_skills()
    except SkillError as exc:
        raise fail(str(exc), as_json) from None
    data = {
        "ok": True,
        "skills": [
            {"name": s.name, "description": s.description, "path": str(s.directory / "SKILL.md")} for s in skills
        ],
    }

    def human() -> None:
        table = Table(title="torch-fl skills")
        table.add_column("name")
        table.add_column("description")
        for s in skills:
            table.add_row(s.name, s.description)
        console.print(table)

    emit(data, as_json, human)


@skills_app.command("show")
def show_cmd(name: str = typer.Argument(..., help="Skill name."), as_json: bool = JsonOption) -> None:
    """Print a skill's SKILL.md (with --json: its name, description, path and text)."""
    from torch_fl.skills.catalog import SkillError, get_skill

    try:
        skill = get_skill(name)
    except SkillError as exc:
        raise fail(str(exc), as_json) from None
    data = {
        "ok": True,
        "name": skill.name,
        "description": skill.description,
        "path": str(skill.directory / "SKILL.md"),
        "text": skill.text,
    }
    emit(data, as_json, lambda: sys.stdout.write(skill.text))


@skills_app.command("install")
def install_cmd(
    directory: Path | None = typer.Argument(None, help="An agent's skills directory (default: ~/.claude/skills)."),
    skill: list[str] | None = typer.Option(None, "--skill", help="Install only this skill (repeatable)."),
    dry_run: bool = typer.Option(False, "--dry-run", help="Show what would be written; write nothing."),
    as_json: bool = JsonOption,
) -> None:
    """Copy the skill folders into DIRECTORY/<skill>/; re-installing rewrites only files that differ."""
    from torch_fl.skills.catalog import DEFAULT_INSTALL_DIR, SkillError, install

    destination = (directory or DEFAULT_INSTALL_DIR).expanduser()
    try:
        outcomes = install(destination, skill or None, dry_run)
    except (SkillError, OSError) as exc:
        raise fail(str(exc), as_json) from None
    data = {
        "ok": True,
        "directory": str(destination),
        "dry_run": dry_run,
        "files": [o.as_dict(destination) for o in outcomes],
    }

    def human() -> None:
        for o in outcomes:
            console.print(f"{o.action:>10}  {o.path}", highlight=False)

    emit(data, as_json, human)
