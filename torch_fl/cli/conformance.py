"""`torch-fl conformance run NAME`: check a platform on this machine and write its record.

The run itself is a pytest subprocess (torch_fl.conformance.runner); this command only parses the
selection, shows the outcome, and exits 0 when the run completed (failing cases are results, and
are in the record; the gate enables exactly what passed, and the record on disk reads back as the
one the run wrote), 1 when it did not; with
--fail-on-failure, 2 when it completed but a non-native path failed a case (for CI). `record` is
the file the run wrote: the record, the partial record beside a complete one (`partial`: a subset
run), or, for a run that did not complete, its interim record in the run folder. A plain run
whose record is stale only because platform sources changed re-runs what they decide
(`incremental`: the changed sources, the ops whose vendor cases were re-run, their suites).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer
from rich.markup import escape
from rich.table import Table

from torch_fl.cli import app
from torch_fl.cli.output import JsonOption, console, emit, err_console, fail
from torch_fl.conformance.runner import SUITES, RunOutcome
from torch_fl.platform.record import FAILING, PYTORCH_PATHS

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
    suite: str | None = typer.Option(None, "--suite", help="Comma-separated suites: " + ",".join(SUITES) + "."),
    paths: str | None = typer.Option(
        None, "--paths", help="Comma-separated route paths to exercise: native,flaggems,vendor,emulated,cpu."
    ),
    resume: bool = typer.Option(
        False, "--resume", help="Continue an interrupted run from its journal (skips recorded cases)."
    ),
    discard: bool = typer.Option(
        False,
        "--discard",
        help="Drop the journal of an interrupted run and start this one (without it, a run that does not "
        "--resume refuses to replace that journal).",
    ),
    add: bool = typer.Option(
        False,
        "--add",
        help="Add the selected cases to the complete record made here, replacing cases of the same id, or start "
        "the record with them where there is none; the record changes only when the run completes.",
    ),
    full: bool = typer.Option(
        False,
        "--full",
        help="Run everything, even where the record is stale only because platform sources changed "
        "(by default, only the cases the changed sources decide are re-run).",
    ),
    timeout: float = typer.Option(60.0, "--timeout", help="Seconds one case may take before it is stopped as hung."),
    warmup_timeout: float = typer.Option(
        900.0, "--warmup-timeout", help="Seconds for the first call per op of a compiling path (FlagGems autotuning)."
    ),
    samples: int = typer.Option(2, "--samples", min=1, help="OpInfo samples per op and dtype."),
    sweep: str = typer.Option(
        "all",
        "--sweep",
        help="Ops the sweep suite sweeps: 'all' a gated path implements, or 'routed': those the "
        "route table can send off native (the others are proven at OpInfo sizes only).",
    ),
    record_dir: Path | None = typer.Option(
        None, "--record-dir", help="Write the record here instead of the platform's records/ folder."
    ),
    shard: str | None = typer.Option(
        None,
        "--shard",
        help="i/N: run shard i of N into its own record (torch-<line>.shard-i-of-N.json); "
        "`torch-fl conformance merge NAME` makes the record of all N.",
    ),
    fail_on_failure: bool = typer.Option(
        False,
        "--fail-on-failure",
        help="Exit 2 when the run completed but a case of a non-native path failed, "
        "errored, crashed or timed out (CI: the gate still disables just those keys).",
    ),
    as_json: bool = JsonOption,
) -> None:
    """Run the conformance suites for platform NAME and write platforms/NAME/records/torch-<line>.json."""
    from torch_fl.conformance.runner import RunOptions, run
    from torch_fl.filelock import LockHeld
    from torch_fl.platform.errors import PlatformError

    options = RunOptions(
        platform=name,
        k=k,
        workers=workers,
        suites=_split(suite),
        paths=_split(paths),
        resume=resume,
        discard=discard,
        add=add,
        full=full,
        timeout=timeout,
        record_dir=record_dir,
        quiet=as_json,
        samples=samples,
        warmup_timeout=warmup_timeout,
        sweep=sweep,
        shard=shard,
    )
    try:
        outcome = run(options)
    except (ValueError, PlatformError, LockHeld) as exc:
        raise fail(str(exc), as_json) from None
    except OSError as exc:  # a full disk, a folder that cannot be written: the path and why, no traceback
        raise fail(f"{exc.filename}: {exc.strerror}" if exc.filename else str(exc), as_json) from None
    data = _run_data(name, outcome)
    emit(data, as_json, lambda: _print_run(name, outcome))
    if not outcome.complete:
        raise typer.Exit(1)
    if fail_on_failure and any(n for path, n in data.get("failures_by_path", {}).items() if path != "native"):
        raise typer.Exit(2)


@conformance_app.command("merge")
def merge_cmd(
    name: str = typer.Argument(..., help="Platform whose shards to merge."),
    record_dir: Path | None = typer.Option(
        None, "--record-dir", help="Where the shards' records are (the --record-dir they ran with)."
    ),
    as_json: bool = JsonOption,
) -> None:
    """Merge the records of `conformance run NAME --shard i/N` (all N, complete, one binding) into the record."""
    from torch_fl.conformance.runner import merge_shards
    from torch_fl.filelock import LockHeld
    from torch_fl.platform.errors import PlatformError

    try:
        merged = merge_shards(name, record_dir)
    except (ValueError, OSError, PlatformError, LockHeld) as exc:
        raise fail(str(exc), as_json, platform=name) from None
    s = merged.record["summary"]
    data = {
        "ok": True,
        "platform": name,
        "record": str(merged.record_file),
        "shards": merged.shards,
        "cases": merged.cases,
        "by_status": s["by_status"],
        "failures_by_path": failures_by_path(s["by_path"]),
    }
    emit(
        data,
        as_json,
        lambda: console.print(
            f"{merged.shards} shards, {merged.cases} cases merged into {escape(str(merged.record_file))}"
        ),
    )


@conformance_app.command("capture")
def capture_cmd(
    models: str = typer.Option("all", "--models", help="Comma-separated zoo architectures, or 'all'."),
    out: Path | None = typer.Option(None, "--out", help="Where to write the list (default: the shipped one)."),
    device: str = typer.Option(
        "cuda", "--device", help="Plain torch device to run the models on (cuda, or cpu: slow)."
    ),
    size: str = typer.Option("board", "--size", help="Model dimensions: board (real widths) or host (tiny)."),
    as_json: bool = JsonOption,
) -> None:
    """Capture the aten calls the zoo models make (board dimensions, batch 1, one block per stack)
    into the list the `captured` suite judges."""
    from torch_fl.conformance import capture
    from torch_fl.workloads import zoo

    names = list(zoo.ARCHS) if models == "all" else _split(models) or []
    unknown = [n for n in names if n not in zoo.ARCHS]
    if unknown:
        raise fail(f"--models: unknown architecture(s) {unknown}; expected some of {list(zoo.ARCHS)} or 'all'", as_json)
    from torch_fl.workloads.zoo import SIZES

    if size not in SIZES:
        raise fail(f"--size: expected one of {list(SIZES)}, got {size!r}", as_json)
    data = capture.capture(names, device, size, progress=lambda label: err_console.print(f"capturing {label}"))
    target = out if out is not None else capture.CAPTURED
    capture.write(data, target)
    summary = {"ok": True, "file": str(target), "calls": len(data["calls"]), "calls_by_model": data["calls_by_model"]}
    emit(
        summary, as_json, lambda: console.print(f"{len(data['calls'])} distinct calls written to {escape(str(target))}")
    )


def _run_data(name: str, outcome: RunOutcome) -> dict[str, Any]:
    """What `--json` prints for a run: where its files are and, if it wrote a record, its summary."""
    data: dict[str, Any] = {
        "ok": outcome.complete,
        "platform": name,
        "complete": outcome.complete,
        "partial": outcome.partial,
        "returncode": outcome.returncode,
        "record": str(outcome.record_file),
        "summary": str(outcome.summary_file) if outcome.summary_file.is_file() else None,
        "log": str(outcome.log_file) if outcome.log_file.is_file() else None,
        "wall_s": round(outcome.wall_s, 1),
        "incremental": outcome.plan.as_dict() if outcome.plan is not None else None,
        "error": outcome.error,
    }
    if outcome.record is not None:
        s = outcome.record["summary"]
        data.update(
            cases=s["total"],
            by_status=s["by_status"],
            by_suite=s["by_suite"],
            by_path=s["by_path"],
            ops_criterion=s["ops_criterion"],
            distinct_failures=s["distinct_failures"],
            failures_by_path=failures_by_path(s["by_path"]),
            owned_failures=owned_failures(s["by_status"], s["by_path"]),
            cases_per_s=s.get("cases_per_s"),
            not_swept=s.get("not_swept", []),
            cost=s.get("cost"),
        )
    return data


def _print_run(name: str, outcome: RunOutcome) -> None:
    """The run for a person: a table by suite and path, the ops criterion, where the files are."""
    record = outcome.record
    if outcome.error:
        err_console.print(f"[bold red]error:[/] {escape(outcome.error)}")
    if record is None:
        err_console.print(f"[bold red]no record was written[/]; see {outcome.log_file}")
        return
    s = record["summary"]
    table = Table(title=f"conformance {name} (torch {record['binding']['torch_version']})")
    for column in ("", "passed", "failed", "other", "skipped", "pass rate"):
        table.add_column(column)
    for group, rows in (("suite", s["by_suite"]), ("path", s["by_path"])):
        for key, row in rows.items():
            other = sum(row.get(x, 0) for x in ("error", "crashed", "timeout"))
            table.add_row(
                f"{group} {key}",
                str(row.get("passed", 0)),
                str(row.get("failed", 0)),
                str(other),
                str(row.get("skipped", 0)),
                _pct(row["pass_rate"]),
            )
    console.print(table)
    crit = s["ops_criterion"]
    if crit["judged"]:
        console.print(
            f"ops criterion: {_pct(crit['rate'])} of {crit['judged']} baseline-passing cases pass (target {_pct(crit['target'])})"
        )
    if outcome.plan is not None:
        plan = outcome.plan
        console.print(
            f"incremental: {', '.join(plan.changed)} changed; re-ran the vendor cases of {', '.join(plan.ops)} "
            f"({', '.join(plan.suites)}); --full re-runs everything"
        )
    note = ""
    if not outcome.complete:
        note = " [yellow](incomplete: --resume continues it)[/]"
    elif outcome.partial:
        note = " [yellow](partial: the gate reads only the record beside it; --add adds a subset to the record)[/]"
    console.print(f"record: {escape(str(outcome.record_file))}{note}")
    if outcome.summary_file.is_file():
        console.print(f"summary: {escape(str(outcome.summary_file))}")
    console.print(f"wall time: {outcome.wall_s:.0f} s ({s.get('cases_per_s') or '-'} cases/s)")
    if not outcome.complete:
        err_console.print(
            f"[bold red]the run did not complete[/] (pytest exit {outcome.returncode}); log: {outcome.log_file}"
        )


def failures_by_path(by_path: dict[str, dict[str, Any]]) -> dict[str, int]:
    """path -> cases that failed, errored, crashed or timed out on it."""
    return {path: sum(row.get(s, 0) for s in FAILING) for path, row in by_path.items()}


def owned_failures(by_status: dict[str, int], by_path: dict[str, dict[str, Any]]) -> int:
    """Failing cases the platform owns: all but those of PyTorch's own kernels (paths native, cpu),
    so device-feature cases (no path) count too."""
    failing = sum(by_status.get(s, 0) for s in FAILING)
    return failing - sum(n for path, n in failures_by_path(by_path).items() if path in PYTORCH_PATHS)
