"""The skills shipped with torch-fl: one folder per skill holding SKILL.md (Agent Skills format).

SKILL.md starts with YAML front matter (`name`, `description`) and continues with numbered steps,
each a `torch-fl ... --json` command and an exit criterion on its JSON. `install` copies the skill
folders into an agent's skills directory; re-installing changes only files that differ.
"""

from __future__ import annotations

import importlib.resources
from dataclasses import dataclass
from pathlib import Path

import yaml

from torch_fl.onboarding.writer import Outcome, write_atomically

SKILL_FILE = "SKILL.md"
DEFAULT_INSTALL_DIR = Path("~/.claude/skills")


class SkillError(ValueError):
    """A skill that cannot be found or whose SKILL.md is malformed."""


@dataclass(frozen=True)
class Skill:
    name: str
    description: str
    directory: Path
    text: str

    @property
    def body(self) -> str:
        """SKILL.md without its front matter."""
        return self.text.split("---", 2)[2].lstrip("\n")

    def files(self) -> list[Path]:
        """Every file of the skill folder (SKILL.md and any references), relative to the folder."""
        return sorted(
            p.relative_to(self.directory)
            for p in self.directory.rglob("*")
            if p.is_file() and "__pycache__" not in p.parts
        )


def skills_root() -> Path:
    return Path(str(importlib.resources.files("torch_fl.skills")))


def front_matter(text: str, where: str) -> dict:
    """The YAML front matter of a SKILL.md: between a first line `---` and the next `---` line."""
    if not text.startswith("---\n"):
        raise SkillError(f"{where}: SKILL.md must start with a '---' front matter line")
    try:
        head = text[4:].split("\n---\n", 1)[0]
        data = yaml.safe_load(head)
    except yaml.YAMLError as exc:
        raise SkillError(f"{where}: front matter is not valid YAML: {exc}") from None
    if (
        not isinstance(data, dict)
        or not isinstance(data.get("name"), str)
        or not isinstance(data.get("description"), str)
    ):
        raise SkillError(f"{where}: front matter needs string fields 'name' and 'description'")
    return data


def load_skill(directory: Path) -> Skill:
    path = directory / SKILL_FILE
    text = path.read_text(encoding="utf-8")
    meta = front_matter(text, str(path))
    if meta["name"] != directory.name:
        raise SkillError(f"{path}: front matter name {meta['name']!r} must equal the folder name {directory.name!r}")
    return Skill(meta["name"], meta["description"].strip(), directory, text)


def all_skills() -> list[Skill]:
    root = skills_root()
    return [load_skill(d) for d in sorted(root.iterdir()) if (d / SKILL_FILE).is_file()]


def get_skill(name: str) -> Skill:
    for skill in all_skills():
        if skill.name == name:
            return skill
    raise SkillError(f"unknown skill {name!r}; shipped skills: {', '.join(s.name for s in all_skills())}")


def install(destination: Path, names: list[str] | None = None, dry_run: bool = False) -> list[Outcome]:
    """Copy the skill folders (all, or `names`) into `destination`/<skill>/, writing only what differs."""
    chosen = [get_skill(n) for n in names] if names else all_skills()
    destination = destination.expanduser()
    outcomes = []
    for skill in chosen:
        for relative in skill.files():
            text = (skill.directory / relative).read_text(encoding="utf-8")
            target = destination / skill.name / relative
            current = target.read_text(encoding="utf-8") if target.is_file() else None
            action = "created" if current is None else "unchanged" if current == text else "updated"
            if action != "unchanged" and not dry_run:
                write_atomically(target, text)
            outcomes.append(Outcome(target, action))
    return outcomes
