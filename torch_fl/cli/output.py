"""Shared output for every command: human text through rich, or one JSON document with --json."""

from __future__ import annotations

import json
import sys
from typing import Any

import typer
from rich.console import Console

console = Console()
err_console = Console(stderr=True)

JsonOption = typer.Option(False, "--json", help="Print one JSON document on stdout (for agents and scripts).")


def emit(data: Any, as_json: bool, human: Any = None) -> None:
    """Print `data` as JSON, or call/print `human` (a callable or a renderable) for people."""
    if as_json:
        sys.stdout.write(json.dumps(data, indent=2, sort_keys=False, default=str) + "\n")
        return
    if callable(human):
        human()
    elif human is not None:
        console.print(human)
    else:
        console.print_json(json.dumps(data, default=str))


def fail(message: str, as_json: bool, code: int = 1, **extra: Any) -> typer.Exit:
    """Report an error the same way in both modes and return the Exit to raise."""
    if as_json:
        sys.stdout.write(json.dumps({"ok": False, "error": message, **extra}, indent=2, default=str) + "\n")
    else:
        err_console.print(f"[bold red]error:[/] {message}")
    return typer.Exit(code)
