"""Docs stay in step with the code: generated tables, and every command, file, variable and suite they name."""

from __future__ import annotations

import ast
import functools
import json
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from torch_fl.platform.compatibility import MANIFEST_NAME

ROOT = Path(__file__).resolve().parents[1]
# The reference docs; CHANGELOG.md is history and may name what no longer exists.
DOCS = sorted(
    {ROOT / "README.md", ROOT / "bench" / "README.md", *ROOT.glob("docs/*.md"), *ROOT.glob("skills/*/SKILL.md")}
)
DOC_IDS = [str(doc.relative_to(ROOT)) for doc in DOCS]

# Run where `torch-fl` runs (the CLI process never activates flagos), so the answer is the command's own view.
_CLI_FACTS = """
import json, sys
sys.argv[0] = "torch-fl"
import click, typer.main
from torch_fl import env
from torch_fl.cli import app, commands
from torch_fl.cli.info import declare_all
from torch_fl.conformance.runner import SUITES

def walk(command, path):
    options = (o for p in command.params for o in (*p.opts, *p.secondary_opts) if o.startswith("-"))
    found = {" ".join(path): sorted(options)}
    for name, sub in getattr(command, "commands", {}).items():
        found.update(walk(sub, [*path, name]))
    return found

declare_all()
print(json.dumps({"commands": walk(typer.main.get_command(app), []),
                  "variables": [v.name for v in env.declared()], "suites": list(SUITES)}))
"""


@dataclass(frozen=True)
class CliFacts:
    commands: dict[str, list[str]]  # "routes show" -> its options
    variables: list[str]
    suites: list[str]


@functools.cache
def cli_facts() -> CliFacts:
    out = subprocess.run([sys.executable, "-c", _CLI_FACTS], capture_output=True, text=True, check=True).stdout
    return CliFacts(**json.loads(out))


def code_snippets(text: str) -> list[str]:
    """Inline code spans, and the commands of fenced blocks (a command's indented lines continue it)."""
    blocks = re.findall(r"^```[^\n]*\n(.*?)^```", text, re.S | re.M)
    prose = re.sub(r"^```[^\n]*\n.*?^```", "", text, flags=re.S | re.M)
    snippets = re.findall(r"`([^`\n]+)`", prose)
    for block in blocks:
        for line in block.splitlines():
            if line[:1].isspace() and snippets and line.strip():
                snippets[-1] += " " + line.strip()
            else:
                snippets.append(line)
    return [re.split(r"\s#\s|\s#$", s)[0] for s in snippets]


def command_words(snippet: str, program: str) -> list[list[str]]:
    """The words after each `program` in a snippet, up to the end of that shell command."""
    found = []
    for match in re.finditer(rf"(?<![\w/.-]){re.escape(program)}(?=\s|$)", snippet):
        rest = re.split(r"&&|\|\||[|;)]", snippet[match.end() :])[0]
        found.append(rest.split())
    return found


def torch_fl_problems(words: list[str], facts: CliFacts) -> list[str]:
    """What is wrong with `torch-fl WORDS`: an unknown command, or an option that command does not take."""
    path: list[str] = []
    problems = []
    for i, word in enumerate(words):
        here = " ".join(path)
        subcommands = {c.rsplit(" ", 1)[-1] for c in facts.commands if c and c.rpartition(" ")[0] == here}
        if word.startswith("-"):
            option = word.split("=")[0].strip("[]")
            if option not in facts.commands[here]:
                problems.append(f"`torch-fl {here}` has no option {option}")
            if option == "--suite" and i + 1 < len(words):
                problems += [f"no suite {s!r}" for s in words[i + 1].split(",") if s not in facts.suites]
        elif subcommands and i == len(path):
            if word not in subcommands:
                problems.append(f"`torch-fl {here}` has no command {word!r}")
                break
            path.append(word)
    return problems


def doc_text(doc: Path) -> str:
    return doc.read_text(encoding="utf-8")


@pytest.mark.parametrize("doc", DOCS, ids=DOC_IDS)
def test_torch_fl_commands_and_options_exist(doc: Path):
    facts = cli_facts()
    problems = [
        f"`torch-fl {' '.join(words)}`: {problem}"
        for snippet in code_snippets(doc_text(doc))
        for words in command_words(snippet, "torch-fl")
        for problem in torch_fl_problems(words, facts)
    ]
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("doc", DOCS, ids=DOC_IDS)
def test_script_options_exist(doc: Path):
    # `python bench/x.py --opt`: the script declares --opt (or the bench helpers it imports do).
    problems = []
    helpers = (ROOT / "bench" / "side_processes.py").read_text()
    for snippet in code_snippets(doc_text(doc)):
        for script, args in re.findall(r"python3? ((?:bench|examples)/\w+\.py)((?: [^&|;]*)?)", snippet):
            source = (ROOT / script).read_text() if (ROOT / script).is_file() else ""
            source += helpers if "from side_processes import" in source else ""
            problems += [f"{script}: no option {o}" for o in re.findall(r"--[\w-]+", args) if f'"{o}"' not in source]
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("doc", DOCS, ids=DOC_IDS)
def test_lone_options_belong_to_a_command_or_script(doc: Path):
    # An option named on its own (`--add`) is one of torch-fl's or a bench/example script's.
    known = {o for options in cli_facts().commands.values() for o in options}
    scripts = "".join(p.read_text() for p in [*ROOT.glob("bench/*.py"), *ROOT.glob("examples/*.py")])
    lone = {s.split()[0].split("=")[0] for s in code_snippets(doc_text(doc)) if s.startswith("--")}
    unknown = sorted(o for o in lone if o not in known and f'"{o}"' not in scripts)
    assert not unknown, f"options no command or script takes: {unknown}"


# A path the docs name, from the repository root: a top-level folder followed by more of the path.
_TOP = "|".join(
    re.escape(p.name) for p in sorted(ROOT.iterdir()) if p.is_dir() and not p.name.startswith((".venv", ".git"))
)
_PATH = re.compile(rf"(?<![\w./~-])((?:{_TOP})/[\w./<>*-]*[\w>*/])")


def repository_paths(text: str) -> set[str]:
    return {p.rstrip("./") for p in _PATH.findall(text)}


def as_pattern(path: str) -> str:
    """`platforms/<name>/platform.yaml` and `platforms/NAME/routes.yaml` read as patterns."""
    return "/".join(
        "*" if re.fullmatch(r"[A-Z][A-Z_]*", part) else re.sub(r"<[^>]*>", "*", part) for part in path.split("/")
    )


@pytest.mark.parametrize("doc", DOCS, ids=DOC_IDS)
def test_named_files_exist(doc: Path):
    # A pattern matches a file here, or names a file `torch-fl onboard` writes into a new platform folder.
    # torch_fl/compatibility.json exists only in built packages: build_hooks.py writes it there.
    onboarding = "".join(p.read_text() for p in ROOT.glob("onboarding/*.py"))
    built = {f"torch_fl/{MANIFEST_NAME}"}
    missing = [
        path
        for path in sorted(repository_paths(doc_text(doc)))
        if not any(ROOT.glob(as_pattern(path)))
        and path not in built
        and not (as_pattern(path) != path and f'"{Path(path).name}"' in onboarding)
    ]
    assert not missing, f"paths that are not in the repository: {missing}"


def module_names(path: Path) -> set[str]:
    """What a module defines or exports at its top level (its `__all__` included)."""
    names = set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names |= {(a.asname or a.name).split(".")[0] for a in node.names}
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names |= {t.id for t in targets if isinstance(t, ast.Name)}
            if any(isinstance(t, ast.Name) and t.id == "__all__" for t in targets) and node.value is not None:
                names |= {c.value for c in ast.walk(node.value) if isinstance(c, ast.Constant)}
    return names


@pytest.mark.parametrize("doc", DOCS, ids=DOC_IDS)
def test_named_python_names_exist(doc: Path):
    # `torch_fl.routing.set_route`: a module of the package, then a name that module defines or exports.
    modules = package_modules()
    unknown = []
    for dotted in sorted(set(re.findall(r"torch_fl(?:\.\w+)+", doc_text(doc)))):
        module = max((m for m in modules if dotted == m or dotted.startswith(m + ".")), key=len)
        rest = dotted[len(module) + 1 :].split(".")
        if rest != [""] and rest[0] not in module_names(modules[module]):
            unknown.append(dotted)
    assert not unknown, f"names the package does not have: {unknown}"


@pytest.mark.parametrize("doc", DOCS, ids=DOC_IDS)
def test_named_variables_are_declared(doc: Path):
    declared = set(cli_facts().variables)
    patterns = [re.escape(v).replace(re.escape("<op>"), r"\w+") for v in declared if "<" in v]
    named = set(re.findall(r"FLAGOS_[A-Za-z0-9_]*(?:<\w+>)?", doc_text(doc))) - {"FLAGOS_"}
    unknown = sorted(v for v in named if v not in declared and not any(re.fullmatch(p, v) for p in patterns))
    assert not unknown, f"variables torch_fl.env does not declare: {unknown}"


@pytest.mark.parametrize("doc", DOCS, ids=DOC_IDS)
def test_named_suites_exist(doc: Path):
    text = doc_text(doc)
    named = set(re.findall(r"`(\w+)` suite", text)) | set(re.findall(r"suite `(\w+)`", text))
    unknown = sorted(named - set(cli_facts().suites))
    assert not unknown, f"conformance suites that do not exist: {unknown}"


def test_suite_lists_name_every_suite():
    suites = set(cli_facts().suites)
    package_doc = (ROOT / "conformance" / "__init__.py").read_text()
    listed = re.search(r"- suites/\s+(.*)", package_doc)
    assert listed and set(re.findall(r"\w+", listed.group(1))) == suites, "conformance/__init__.py lists other suites"
    conformance_section = doc_text(ROOT / "README.md").split("## Conformance", 1)[1].split("\n## ", 1)[0]
    unnamed = sorted(s for s in suites if not re.search(rf"\b{s}\b", conformance_section))
    assert not unnamed, f"README's Conformance section does not name {unnamed}"


# Notes, probes and trackers that live beside the repository, not in it.
_OUTSIDE = re.compile(r"\.\./shared|shared/probes|DESIGN\.md|\bprobes/|PREAMBLE|issues show|\bissue #?\d+")


def test_nothing_refers_outside_the_repository():
    tracked = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    texts = [ROOT / f for f in tracked.split() if f.endswith((".md", ".py", ".yaml", ".sh", ".toml", ".txt", ".j2"))]
    this = Path(__file__).resolve()
    offending = [
        str(f.relative_to(ROOT)) for f in texts if f != this and f.is_file() and _OUTSIDE.search(f.read_text())
    ]
    assert not offending, f"files that cite what is not in this repository: {offending}"


def test_build_time_is_the_one_the_build_prints():
    build = (ROOT / "torch_fl" / "runtime" / "build.py").read_text()
    stated = re.search(r'BUILD_TIME = "([^"]+)"', build).group(1)
    readme = doc_text(ROOT / "README.md")
    assert stated.split(",")[0] in readme, f"README does not give the build time the build prints: {stated!r}"


# The layer diagram in the README ("How the device works"): its rows, top first, name modules in the
# first column; a row whose names end with a comma goes on in the next line.
_PACKAGES = {"torch_fl": "torch_fl", "conformance": "torch_fl.conformance", "onboarding": "torch_fl.onboarding"}


def diagram_layers() -> list[set[str]]:
    section = doc_text(ROOT / "README.md").split("## How the device works", 1)[1]
    block = re.search(r"```\n(.*?)```", section, re.S).group(1)
    layers: list[set[str]] = []
    continued = False
    for line in block.splitlines():
        names = line[:30].split()
        if not names or line[0].isspace() or "/" in names[0]:
            continue
        modules = {_PACKAGES.get(n.strip(","), n.strip(",") if "." in n else f"torch_fl.{n.strip(',')}") for n in names}
        if continued:
            layers[-1] |= modules
        else:
            layers.append(modules)
        continued = names[-1].endswith(",")
    return layers


def package_modules() -> dict[str, Path]:
    """Module name -> file, for the package as installed (conformance/ is torch_fl.conformance)."""
    files = {}
    for folder, package in _PACKAGES.items():
        for path in (ROOT / folder).rglob("*.py"):
            parts = path.relative_to(ROOT / folder).with_suffix("").parts
            files[".".join((package, *parts)).removesuffix(".__init__")] = path
    return files


def module_imports() -> list[tuple[str, str, str]]:
    """(module, imported module, where) for every absolute import of the package's Python files."""
    files = package_modules()
    found = []
    for module, path in files.items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                targets = [
                    f"{node.module}.{a.name}" if f"{node.module}.{a.name}" in files else node.module for a in node.names
                ]
            else:
                continue
            where = f"{path.relative_to(ROOT)}:{node.lineno}"
            found += [(module, t, where) for t in targets if t.split(".")[0] == "torch_fl"]
    return found


def layer_index(module: str, layers: list[set[str]]) -> int:
    # The row of the longest name the module falls under (torch_fl.routing.tuner: torch_fl.routing).
    rows = [
        (len(name), i)
        for i, row in enumerate(layers)
        for name in row
        if module == name or module.startswith(name + ".")
    ]
    return max(rows)[1]


def test_layer_diagram_names_modules_that_exist():
    modules = package_modules()
    unknown = sorted(name for row in diagram_layers() for name in row if name not in modules)
    assert not unknown, f"the README's layer diagram names modules that do not exist: {unknown}"


def test_imports_point_down_the_readme_layers():
    layers = diagram_layers()
    upward = [
        f"{where}: {module} imports {target}"
        for module, target, where in module_imports()
        if layer_index(target, layers) < layer_index(module, layers)
    ]
    assert not upward, "imports that run up the README's layers:\n" + "\n".join(upward)


def test_environment_table_matches_the_declarations():
    # The table lists every variable the code declares through torch_fl.env (`torch-fl env --markdown`).
    generated = subprocess.run(
        [sys.executable, "-c", "from torch_fl.cli import main; main()", "env", "--markdown"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    documented = (ROOT / "docs" / "environment.md").read_text()
    assert generated in documented, "docs/environment.md is stale: regenerate it with `torch-fl env --markdown`"
