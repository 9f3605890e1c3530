"""`torch-fl triage`: classify and deduplicate the failures of a conformance record; compare with an older one."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.markup import escape
from rich.table import Table

from torch_fl.cli import app
from torch_fl.cli.output import JsonOption, console, emit, fail


@app.command("triage")
def triage_cmd(
    name: str = typer.Argument(..., help="Platform name."),
    record: Path | None = typer.Option(
        None, "--record", help="Record to read (default: the platform's record for this torch line)."
    ),
    against: Path | None = typer.Option(
        None, "--against", help="An older record, or a saved `torch-fl triage --json` report, to compare with."
    ),
    as_json: bool = JsonOption,
) -> None:
    """Group failing cases by fingerprint and kind (unsupported-op, precision, crash, missing-feature, other).

    Exits 0 whenever the record could be read: `.ok` says whether anything fails, and with --against, `.comparison.new_failures` lists what broke since.
    """
    from torch_fl.platform.discovery import load_platform
    from torch_fl.platform.errors import PlatformError
    from torch_fl.platform.triage import default_record, read_baseline, read_record, triage

    try:
        if record is None:
            directory = load_platform(name).directory
            assert directory is not None, "a loaded platform knows its folder"
            record = default_record(directory)
        loaded, cases = read_record(record)
        baseline = read_baseline(against) if against is not None else None
    except PlatformError as exc:
        raise fail(str(exc), as_json, 1, platform=name) from None
    if loaded.platform != name:
        raise fail(f"{record} is a record of platform {loaded.platform!r}, not {name!r}", as_json, 1, platform=name)
    report = triage(loaded, cases, str(record), baseline)

    def human() -> None:
        s = report["summary"]
        # record paths, messages and op names are data: escaped, so rich reads no markup in them
        console.print(
            f"{name}: {s['cases']} cases, {s['passed']} passed, {s['failing']} failing in {s['groups']} "
            f"group(s)  [dim]{escape(str(Path(record).resolve()))}[/]",
            soft_wrap=True,
        )
        if report["groups"]:
            table = Table()
            for column in ("kind", "count", "ops", "paths", "message"):
                table.add_column(column)
            for g in report["groups"]:
                ops = ", ".join(g["ops"][:4]) + (" ..." if len(g["ops"]) > 4 else "")
                table.add_row(
                    *(
                        escape(v)
                        for v in (g["category"], str(g["count"]), ops, ", ".join(g["paths"]), g["message"][:120])
                    )
                )
            console.print(table)
            console.print("re-run the first case of a group (its record goes to a scratch folder):")
            for g in report["groups"]:
                console.print(f"  {escape(g['category'])}: {escape(g['rerun'])}", highlight=False, soft_wrap=True)
            proposed = [p for g in report["groups"] for p in g["constraints"]]
            if proposed:
                console.print("or declare where the kernel works (platform.yaml; the next run proves it inside):")
            for p in proposed:
                alike = ", ".join(f"{a['dim']} {a['side']} {a['bound']}" for a in p["alike"])
                console.print(
                    f"  {escape(p['op'])} on {p['path']}: {p['dim']} {p['side']} {p['bound']} excludes "
                    f"{p['excludes']} failing, keeps {p['keeps']} of {p['passing']} passing"
                    + (f" (as well supported: {alike}; a one-dimension sweep tells them apart)" if alike else ""),
                    highlight=False,
                    soft_wrap=True,
                )
        comparison = report.get("comparison")
        if comparison:
            console.print(
                f"against {escape(str(comparison['against']))}: {len(comparison['new_failures'])} new, "
                f"{len(comparison['fixed'])} fixed, {len(comparison['still_failing'])} still failing",
                soft_wrap=True,
            )

    emit(report, as_json, human)
