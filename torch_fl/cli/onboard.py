"""`torch-fl onboard`: scaffold a new platform from the descriptor model and the onboarding templates."""

from __future__ import annotations

from enum import Enum
from pathlib import Path

import typer
from rich.table import Table

from torch_fl.cli import app
from torch_fl.cli.output import JsonOption, console, emit, err_console, fail

EXIT_SKIPPED = 3
"""Exit status when files a person edited were kept (the report says which); 1 is a refused request."""


class Backing(str, Enum):
    cpu = "cpu"
    cuda = "cuda"


_STYLE = {"created": "green", "updated": "yellow", "unchanged": "dim", "skipped-edited": "bold red"}


@app.command("onboard")
def onboard_cmd(
    chip: str = typer.Option(..., "--chip", help="Name of the new platform: lower case, e.g. acme_x1."),
    like: str | None = typer.Option(None, "--like", help="Start from this platform's descriptor and routes."),
    backing: Backing | None = typer.Option(None, "--backing", help="Backing device (default: --like's, else cpu)."),
    root: Path | None = typer.Option(
        None,
        "--root",
        help="Repository root: the workflow goes to ROOT/.github/workflows (default: current directory).",
    ),
    platforms_dir: Path | None = typer.Option(
        None,
        "--platforms-dir",
        help="Folder the platform folder goes in (default: ROOT/platforms); any other is a FLAGOS_PLATFORM_PATH folder.",
    ),
    dry_run: bool = typer.Option(False, "--dry-run", help="Show what would be written; write nothing."),
    force: bool = typer.Option(False, "--force", help="Overwrite edited files, and allow a name that already exists."),
    as_json: bool = JsonOption,
) -> None:
    """Write platforms/CHIP: platform.yaml, vendor_kernels.py, routes.yaml, README.md, and its CI workflow.

    Idempotent: a second run reports every file unchanged. A file edited since onboard wrote it is kept and reported as skipped-edited (exit 3) unless --force.
    """
    from torch_fl.filelock import LockHeld
    from torch_fl.onboarding.errors import OnboardError
    from torch_fl.onboarding.onboard import OnboardRequest, onboard

    request = OnboardRequest(chip, like, backing.value if backing else None, root, platforms_dir, force, dry_run)
    try:
        report = onboard(request)
    except (OnboardError, LockHeld) as exc:
        raise fail(str(exc), as_json, 1, platform=chip) from None
    data = report.as_dict()

    def human() -> None:
        verb = "would write" if dry_run else "wrote"
        table = Table(title=f"onboard {chip}: {verb} {report.layout.platform_dir}")
        table.add_column("file")
        table.add_column("action")
        for entry in data["files"]:
            style = _STYLE[entry["action"]]
            table.add_row(
                entry["path"], f"[{style}]{entry['action']}[/]" + (f"  {entry['reason']}" if "reason" in entry else "")
            )
        console.print(table)
        for warning in report.warnings:
            err_console.print(f"[yellow]warning:[/] {warning}")
        console.print("next steps:")
        for step in report.next_steps:
            console.print(f"  {step}", highlight=False, soft_wrap=True)

    emit(data, as_json, human)
    if not report.ok:
        raise typer.Exit(EXIT_SKIPPED)
