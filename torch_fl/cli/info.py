"""`torch-fl env`: every environment variable torch-fl reads, from the declarations in the code."""

from __future__ import annotations

import importlib
import pkgutil

import typer

import torch_fl
from torch_fl import env
from torch_fl.cli import app
from torch_fl.cli.output import JsonOption, console, emit

# Packages whose modules are data, templates or test suites: they declare no variables.
_SKIP = ("torch_fl.platforms", "torch_fl.skills", "torch_fl.conformance.suites", "torch_fl.onboarding.templates")


def declare_all() -> None:
    """Import every module, so each one's env.register() calls have run."""
    for module in pkgutil.walk_packages(torch_fl.__path__, "torch_fl."):
        if not module.name.startswith(_SKIP):
            importlib.import_module(module.name)


@app.command("env")
def env_command(
    markdown: bool = typer.Option(False, "--markdown", help="Print the Markdown table used in the docs."),
    as_json: bool = JsonOption,
) -> None:
    """List the environment variables torch-fl reads, with defaults and what each does."""
    declare_all()
    if markdown:
        typer.echo(env.table_markdown(), nl=False)
        return
    rows = [{"name": v.name, "default": v.default, "doc": v.doc} for v in env.declared()]

    def human() -> None:
        for row in rows:
            console.print(f"[bold]{row['name']}[/] (default: {row['default'] or 'unset'})\n    {row['doc']}")

    emit({"ok": True, "variables": rows}, as_json, human)
