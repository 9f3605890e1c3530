"""`torch-fl conformance run NAME`: check a platform on this machine and write its record.

The run itself is a pytest subprocess (torch_fl.conformance.runner); this command only parses the
selection, shows the outcome, and exits 0 when the run completed (failing cases are results, and
are in the record; the gate enables exactly what passed), 1 when it did not.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import typer
from rich.table import Table

from torch_fl.cli import app
from torch_fl.cli.output import JsonOption, console, emit, err_console, fail

conformance_app = typer.Typer(help="Run the conformance suite that gates a platform's routes.", no_args_is_help=True)
app.add_typer(conformance_app, name="conformance")


def _split(value: str | None) -> list[str] | None:
    if not value:
        return None
    return [v.strip() for v in value.split(",") if v.strip()]


def _pct(rate: float | None) -> str:
    return "-" if rate is None else f"{100 * rate:.1f}%"


@conformance_app.command("run")
def run_cmd(
    name: str = typer.Argument(..., help="Platform to check (a folder under platforms/ or FLAGOS_PLATFORM_PATH)."),
    k: str | None = typer.Option(None, "-k", help="pytest -k expression selecting items, e.g. 'add and float32'."),
    workers: str = typer.Option("auto", "-n", help="Worker processes: 'auto' or a number (at least 1)."),
    suite: str | None = typer.Option(None, "--suite", help="Comma-separated suites: ops,amp,rng,ddp,fsdp2,compile,profiler,sparse,model,workload."),
    paths: str | None = typer.Option(None, "--paths", help="Comma-separated route paths to exercise: native,flaggems,vendor,emulated,cpu."),
    resume: bool = typer.Option(False, "--resume", help="Continue an interrupted run from its journal (skips recorded cases)."),
    add: bool = typer.Option(
        False, "--add", help="Add the selected cases to the complete record made here, replacing cases of the same id; "
        "the record changes only when the run completes."
    ),
    timeout: float = typer.Option(60.0, "--timeout", help="Seconds one case may take before it is stopped as hung."),
    warmup_timeout: float = typer.Option(900.0, "--warmup-timeout", help="Seconds for the first call per op of a compiling path (FlagGems autotuning)."),
    samples: int = typer.Option(2, "--samples", min=1, help="OpInfo samples per op and dtype."),
    record_dir: Path | None = typer.Option(None, "--record-dir", help="Write the record here instead of the platform's records/ folder."),
    as_json: bool = JsonOption,
) -> None:
    """Run the conformance suites for platform NAME and write platforms/NAME/records/torch-<line>.json."""
    from torch_fl.conformance.runner import RunOptions, run
    from torch_fl.platform.errors import PlatformError

    options = RunOptions(
        platform=name, k=k, workers=workers, suites=_split(suite), paths=_split(paths), resume=resume, add=add,
        timeout=timeout, record_dir=record_dir, quiet=as_json, samples=samples, warmup_timeout=warmup_timeout,
    )
    try:
        outcome = run(options)
    except (ValueError, PlatformError) as exc:
        raise fail(str(exc), as_json) from None
    record = outcome.record
    data: dict[str, Any] = {
        "ok": outcome.complete,
        "platform": name,
        "complete": outcome.complete,
        "returncode": outcome.returncode,
        "record": str(outcome.record_file),
        "summary": str(outcome.summary_file) if outcome.summary_file.is_file() else None,
        "log": str(outcome.log_file) if outcome.log_file.is_file() else None,
        "wall_s": round(outcome.wall_s, 1),
    }
    if record is not None:
        s = record["summary"]
        data.update(
            cases=s["total"], by_status=s["by_status"], by_suite=s["by_suite"], by_path=s["by_path"],
            ops_criterion=s["ops_criterion"], distinct_failures=s["distinct_failures"],
        )

    def human() -> None:
        if record is None:
            err_console.print(f"[bold red]no record was written[/]; see {outcome.log_file}")
            return
        s = record["summary"]
        table = Table(title=f"conformance {name} (torch {record['torch_version']})")
        for column in ("", "passed", "failed", "other", "skipped", "pass rate"):
            table.add_column(column)
        for group, rows in (("suite", s["by_suite"]), ("path", s["by_path"])):
            for key, row in rows.items():
                other = sum(row.get(x, 0) for x in ("error", "crashed", "timeout"))
                table.add_row(f"{group} {key}", str(row.get("passed", 0)), str(row.get("failed", 0)), str(other),
                              str(row.get("skipped", 0)), _pct(row["pass_rate"]))
        console.print(table)
        crit = s["ops_criterion"]
        if crit["judged"]:
            console.print(f"ops criterion: {_pct(crit['rate'])} of {crit['judged']} baseline-passing cases pass (target {_pct(crit['target'])})")
        console.print(f"record: {outcome.record_file}{'' if outcome.complete else ' [yellow](incomplete: --resume continues it)[/]'}")
        if outcome.summary_file.is_file():
            console.print(f"summary: {outcome.summary_file}")
        console.print(f"wall time: {outcome.wall_s:.0f} s")
        if not outcome.complete:
            err_console.print(f"[bold red]the run did not complete[/] (pytest exit {outcome.returncode}); log: {outcome.log_file}")

    emit(data, as_json, human)
    if not outcome.complete:
        raise typer.Exit(1)
