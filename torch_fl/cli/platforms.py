"""`torch-fl schema`, `torch-fl platforms list|show`, `torch-fl preflight`: the platform layer's commands.

None of them imports torch or the runtime: they read descriptors, records and package metadata.
"""

from __future__ import annotations

import sys
from dataclasses import asdict
from pathlib import Path
from typing import Any

import typer
from rich.markup import escape
from rich.table import Table

from torch_fl.cli import app
from torch_fl.cli.output import JsonOption, console, emit, err_console, fail
from torch_fl.platform.compatibility import Inspection, inspect
from torch_fl.platform.descriptor import RUNTIME_BACKINGS, PlatformDescriptor
from torch_fl.platform.detection import Detection, detect
from torch_fl.platform.discovery import PlatformSource, discover, load_all, load_platform
from torch_fl.platform.errors import PlatformError
from torch_fl.platform.matrix import matrix_markdown, matrix_row
from torch_fl.platform.preflight import PreflightReport, preflight
from torch_fl.platform.record import STATUS_WORDS, RecordStatus, current_status, descriptor_hash, installed_version
from torch_fl.platform.schema import schema_text
from torch_fl.platform.selection import Selection, select_platform

platforms_app = typer.Typer(help="List and inspect platform descriptors.", no_args_is_help=True)
app.add_typer(platforms_app, name="platforms")


@app.command("schema")
def schema_cmd(as_json: bool = JsonOption) -> None:
    """Print the JSON Schema of platform.yaml (it is JSON either way)."""
    sys.stdout.write(schema_text())


def _status(descriptor: PlatformDescriptor) -> dict[str, Any]:
    try:
        status: RecordStatus = current_status(descriptor)
    except PlatformError as exc:
        return {"status": "error", "reasons": [str(exc)], "torch_line": None}
    return {"status": STATUS_WORDS[status.state], "reasons": status.reasons, "torch_line": status.torch_line}


def _detection(detection: Detection | None) -> dict[str, Any] | None:
    if detection is None:
        return None
    return {
        "priority": detection.priority,
        "matched": detection.matched,
        "rules": [asdict(r) for r in detection.results],
    }


def _origin(source: PlatformSource) -> str:
    if not source.overrides:
        return source.origin
    return f"{source.origin} (overrides {', '.join(str(p) for p in source.overrides)})"


def _select(
    loaded: dict[str, PlatformDescriptor], detections: list[Detection], broken: dict
) -> tuple[Selection | None, str | None]:
    try:
        return select_platform(loaded, detections, broken), None
    except PlatformError as exc:
        return None, str(exc)


@platforms_app.command("list")
def list_cmd(as_json: bool = JsonOption) -> None:
    """List every platform: status from its conformance record, backing, origin, and which is active here."""
    sources = discover()
    loaded, broken = load_all(sources)
    detections = {d.name: d for d in detect(loaded)}
    selection, selection_error = _select(loaded, list(detections.values()), broken)
    rows = []
    for name, source in sources.items():
        descriptor = loaded.get(name)
        row: dict[str, Any] = {
            "name": name,
            "origin": source.origin,
            "directory": str(source.directory),
            "overrides": [str(p) for p in source.overrides],
            "active": selection is not None and selection.name == name,
        }
        if descriptor is None:
            row.update(status="invalid", reasons=[broken[name].brief], error=str(broken[name]))
        else:
            status = _status(descriptor)
            row.update(
                display_name=descriptor.display_name,
                status=status["status"],
                reasons=status["reasons"],
                claimed_status=descriptor.status,
                backing=descriptor.backing.device,
                runtime_supported=descriptor.backing.device in RUNTIME_BACKINGS,
                detection=_detection(detections.get(name)),
                error=None,
            )
        rows.append(row)
    active = asdict(selection) if selection is not None else None
    data = {
        "torch": installed_version("torch"),
        "active": active,
        "selection_error": selection_error,
        "platforms": rows,
    }

    def human() -> None:
        table = Table(title="torch-fl platforms")
        for column in ("name", "status", "backing", "origin", "active"):
            table.add_column(column)
        for row in rows:
            table.add_row(
                row["name"],
                row["status"],
                row.get("backing", "-"),
                _origin(sources[row["name"]]),
                "yes" if row["active"] else "",
            )
        console.print(table)
        for row in rows:
            # every status but these two has a reason to give ("unvalidated" says it all: no record)
            if row["status"] not in ("validated", "unvalidated", "invalid") and row["reasons"]:
                reasons = "; ".join(row["reasons"])
                console.print(
                    f"{escape(row['name'])} is {row['status']}: {escape(reasons)}", highlight=False, soft_wrap=True
                )
        if selection is not None:
            console.print(f"active: [bold]{selection.name}[/] ({escape(selection.reason)})")
        else:
            err_console.print(f"[bold red]no active platform:[/] {escape(str(selection_error))}")
        for row in rows:
            if row["error"]:  # the first problem: `torch-fl platforms show NAME` lists them all
                err_console.print(f"[bold red]invalid descriptor:[/] {escape(row['reasons'][0])}")

    emit(data, as_json, human)


@platforms_app.command("show")
def show_cmd(name: str = typer.Argument(..., help="Platform name."), as_json: bool = JsonOption) -> None:
    """Show one platform's descriptor, record status and detection."""
    sources = discover()
    try:
        descriptor = load_platform(name, sources)
    except PlatformError as exc:
        raise fail(str(exc), as_json) from None
    status = _status(descriptor)
    detection = _detection(detect({name: descriptor})[0])
    data = {
        "name": name,
        "origin": sources[name].origin,
        "directory": str(sources[name].directory),
        "overrides": [str(p) for p in sources[name].overrides],
        "descriptor_hash": descriptor_hash(descriptor),
        "status": status,
        "detection": detection,
        "descriptor": descriptor.model_dump(mode="json"),
    }

    def human() -> None:
        table = Table(title=f"{descriptor.display_name} ({name})", show_header=False)
        row = matrix_row(descriptor)
        facts = [
            ("status", _status_text(status, descriptor)),
            ("origin", _origin(sources[name])),
            ("folder", str(sources[name].directory)),
            ("boards", row.boards),
            ("vendor", row.vendor),
            (
                "backing",
                row.backing
                + ("" if row.backing in RUNTIME_BACKINGS else " (descriptor only: the runtime drives cpu and cuda)"),
            ),
            ("kernel sets", ", ".join(descriptor.kernels.declared())),
            ("route defaults", ", ".join(descriptor.routes.defaults)),
            ("SDK", row.sdk),
            ("distributed", row.distributed),
            ("compile", row.compile),
            ("profiler", row.profiler),
            ("AMP dtypes", row.amp_dtypes),
            ("detection", "; ".join(f"{r['rule']}: {r['reason']}" for r in detection["rules"]) if detection else "-"),
        ]
        for key, value in facts:
            table.add_row(key, value)
        console.print(table)

    emit(data, as_json, human)


def _status_text(status: dict[str, Any], descriptor: PlatformDescriptor) -> str:
    """The record's status with its reasons; platform.yaml's own `status` only where it agrees, else as a
    note that the record decides (the field is a claim, the record is the evidence)."""
    text = status["status"] + "".join(f"\n  {r}" for r in status["reasons"])
    if status["status"] != descriptor.status:
        text += f"\n  (platform.yaml claims {descriptor.status}; the conformance record decides)"
    return escape(text)


def _print_report(report: PreflightReport, selection: Selection | None) -> None:
    if selection is not None:
        console.print(f"platform: [bold]{report.platform}[/] ({selection.reason})")
    table = Table(title=f"preflight: {report.platform}")
    for column in ("check", "ok", "expected", "found"):
        table.add_column(column)
    for check in report.checks:
        table.add_row(check.name, "[green]ok[/]" if check.ok else "[red]FAIL[/]", check.expected, check.found)
    console.print(table)
    for check in report.checks:
        if not check.ok:
            console.print(f"[red]x[/] {check.name}: {check.hint}")
    console.print("[green]ready[/]" if report.ok else "[red]not ready[/]")


def _print_inspection(result: Inspection) -> None:
    console.print(f"package: [bold]{result.source}[/]")
    if result.error is not None:
        err_console.print(f"[bold red]error:[/] {result.error}")
        return
    assert result.manifest is not None
    built = result.manifest["built_with"]
    console.print(
        f"built with torch {built['torch']} (C++11 ABI: {built['cxx11_abi']}), Python {built['python']}; "
        f"requires torch {result.manifest['torch_requirement']}"
    )
    table = Table(title="release table")
    for column in ("platform", "backing", "kernel sets", "pinned", "SDK", "provenance"):
        table.add_column(column)
    for name, row in result.manifest["platforms"].items():
        sdk = row["sdk"] or {}
        missing = result.provenance.get(name)
        table.add_row(
            name,
            row["backing"],
            ", ".join(row["kernel_sets"]),
            ", ".join(f"{p}=={v}" for p, v in row["kernel_pins"].items()) or "-",
            " ".join(filter(None, (sdk.get("name"), sdk.get("version")))) or "-",
            "[red]missing " + ", ".join(missing) + "[/]" if missing else "[green]ok[/]",
        )
    console.print(table)
    for drift in result.drift:
        console.print(f"[yellow]warning:[/] {drift.what}: built with {drift.built}, here {drift.here}")
    console.print("[green]release table complete[/]" if result.ok else "[red]release table lacks provenance[/]")


def _inspect_package(wheel: Path | None, name: str | None, as_json: bool) -> None:
    platform = name
    if platform is None:
        try:
            platform = select_platform().name
        except PlatformError:
            platform = None
    result = inspect(wheel, platform)
    emit(result.to_dict(), as_json, lambda: _print_inspection(result))
    if not result.ok:
        raise typer.Exit(1)


@app.command("preflight")
def preflight_cmd(
    name: str | None = typer.Argument(None, help="Platform name (default: the platform selected here)."),
    matrix: bool = typer.Option(False, "--matrix", help="Print the Markdown compatibility matrix of all platforms."),
    wheel: Path | None = typer.Option(
        None, "--wheel", help="Inspect this wheel's torch_fl/compatibility.json: drift from here, release provenance."
    ),
    installed: bool = typer.Option(False, "--installed", help="Inspect the installed package's compatibility.json."),
    as_json: bool = JsonOption,
) -> None:
    """Check this environment against a platform's requirements, without importing torch; or print the matrix;
    or inspect a built package (warnings for drift from this environment, failure for missing provenance)."""
    if wheel is not None or installed:
        _inspect_package(wheel, name, as_json)
        return
    if matrix:
        loaded, broken = load_all()
        markdown = matrix_markdown(loaded)
        errors = {n: str(e) for n, e in broken.items()}
        data = {
            "ok": not errors,
            "markdown": markdown,
            "rows": [asdict(matrix_row(d)) for _, d in sorted(loaded.items())],
            "errors": errors,
        }

        def human() -> None:
            sys.stdout.write(markdown)
            for message in errors.values():
                err_console.print(f"[bold red]invalid descriptor:[/] {message}")

        emit(data, as_json, human)
        if errors:
            raise typer.Exit(1)
        return
    selection: Selection | None = None
    try:
        if name is None:
            selection = select_platform()
            name = selection.name
        descriptor = load_platform(name)
    except PlatformError as exc:
        raise fail(str(exc), as_json) from None
    report = preflight(descriptor)
    data = report.to_dict()
    if selection is not None:
        data["selection"] = asdict(selection)
    emit(data, as_json, lambda: _print_report(report, selection))
    if not report.ok:
        raise typer.Exit(1)
