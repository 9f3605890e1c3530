"""`torch-fl routes show|explain|stats|tune`: inspect and tune a platform's route table."""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from pathlib import Path
from typing import Any, Optional

import typer
from rich.table import Table

from torch_fl.cli import app
from torch_fl.cli.output import JsonOption, console, emit, fail

routes_app = typer.Typer(help="Inspect and tune route tables (which path serves each aten op).", no_args_is_help=True)
app.add_typer(routes_app, name="routes")

BUILTIN_WORKLOADS = ("tiny", "small", "large")


def _descriptor(name: str, as_json: bool) -> Any:
    from torch_fl.platform import PlatformError, load_platform

    try:
        return load_platform(name)
    except (PlatformError, KeyError) as exc:
        raise fail(str(exc), as_json, 2) from None


def _activate(name: str, as_json: bool) -> Any:
    import torch_fl

    try:
        return torch_fl.activate(name)
    except Exception as exc:
        raise fail(f"cannot activate platform {name!r}: {exc}", as_json, 2) from None


def workload_step(workload: str, backing: str) -> Callable[[], Any]:
    """A training step to tune on: a built-in decoder config, or a script defining make_step(device)."""
    import torch

    if workload in BUILTIN_WORKLOADS:
        from torch_fl.workloads.decoder import CONFIGS, build

        dtype = torch.bfloat16 if backing == "cuda" else torch.float32
        return build(CONFIGS[workload], "flagos", dtype)[2]
    path = Path(workload)
    if not path.is_file():
        raise FileNotFoundError(f"workload {workload!r}: expected one of {BUILTIN_WORKLOADS} or a Python file")
    spec = importlib.util.spec_from_file_location("torch_fl_workload", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    if not hasattr(module, "make_step"):
        raise AttributeError(f"{path}: a workload script must define make_step(device: str) -> Callable[[], Any]")
    return module.make_step("flagos")


@routes_app.command("show")
def show(name: str = typer.Argument(..., help="Platform name."), as_json: bool = JsonOption) -> None:
    """The platform's route table with each candidate's validation state (nothing is loaded)."""
    from torch_fl.platform import Gate, current_status
    from torch_fl.routing import table as route_table

    descriptor = _descriptor(name, as_json)
    try:
        table = route_table.load(Path(descriptor.directory) / descriptor.routes.file)
    except route_table.RouteTableError as exc:
        raise fail(str(exc), as_json, 2) from None
    gate = Gate(descriptor, current_status(descriptor))
    rows: list[dict[str, Any]] = []
    for op, route in sorted(table.ops.items()):
        validated = {
            path: sorted(gate.proven_keys(op, path)) for path in route.candidates if path not in ("native", "cpu")
        }
        rows.append(
            {
                "op": op,
                "candidates": route.candidates,
                "validated_keys": validated,
                "buckets": [b.model_dump(exclude_none=True) for b in route.buckets],
                "provenance": route.provenance.model_dump(exclude_none=True) if route.provenance else None,
            }
        )
    defaults = list(table.default or descriptor.routes.defaults)
    data = {"ok": True, "platform": name, "record": gate.state, "defaults": defaults, "ops": rows}

    def human() -> None:
        t = Table(title=f"{name}: routes (record {gate.state}; other ops: {', '.join(defaults)})")
        for column in ("op", "candidates", "validated", "buckets", "reason"):
            t.add_column(column)
        for row in rows:
            ok = ", ".join(f"{p}:{len(v)} keys" for p, v in row["validated_keys"].items())
            buckets = "; ".join(
                f"<={b['max_numel']}{' ' + b['dtype'] if b.get('dtype') else ''}:{b['choice']}" for b in row["buckets"]
            )
            reason = (row["provenance"] or {}).get("note", "")
            t.add_row(row["op"], ", ".join(row["candidates"]), ok, buckets, reason)
        console.print(t)

    emit(data, as_json, human)


@routes_app.command("explain")
def explain(
    name: str = typer.Argument(..., help="Platform name."),
    op: str = typer.Argument(..., help="An aten overload, e.g. aten::mm or add.Tensor."),
    as_json: bool = JsonOption,
) -> None:
    """Which route serves OP on platform NAME, and why (activates the platform)."""
    _activate(name, as_json)
    from torch_fl.routing import explain as explain_op  # the function (the module is routing.explanation)

    try:
        result = explain_op(op)
    except ValueError as exc:
        raise fail(str(exc), as_json, 2) from None
    emit({"ok": True, **result.as_dict()}, as_json, lambda: console.print(str(result)))


@routes_app.command("stats")
def stats(
    name: str = typer.Argument(..., help="Platform name."),
    workload: str = typer.Option("tiny", help=f"{'|'.join(BUILTIN_WORKLOADS)} or a script defining make_step(device)."),
    steps: int = typer.Option(3, help="Training steps to run."),
    as_json: bool = JsonOption,
) -> None:
    """Run a workload on NAME and report how many calls each op x path served."""
    active = _activate(name, as_json)
    from torch_fl.routing import reset_stats
    from torch_fl.routing import stats as route_stats
    from torch_fl.routing.counters import as_dicts

    step = workload_step(workload, active.descriptor.backing.device)
    reset_stats()
    for _ in range(steps):
        step()
    rows = route_stats()
    data = {"ok": True, "platform": name, "workload": workload, "steps": steps, "counts": as_dicts(rows)}

    def human() -> None:
        table = Table(title=f"route calls on {name}: {workload}, {steps} step(s)")
        table.add_column("calls", justify="right")
        table.add_column("path")
        table.add_column("op")
        for row in rows:
            table.add_row(str(row.calls), row.path, row.op)
        console.print(table)

    emit(data, as_json, human)


def zoo_step_makers(names: str, backing: str) -> dict[str, Callable[[], Callable[[], Any]]]:
    """For each zoo architecture in `names` (comma-separated, or 'all'), a function that builds its
    training step on flagos: board size with bf16 autocast on a GPU backing, host size in float32 on
    the CPU. Names and the transformers dependency are checked now; models are built only when made."""
    from torch_fl.workloads import zoo

    wanted = list(zoo.ARCHS) if names == "all" else [n.strip() for n in names.split(",") if n.strip()]
    unknown = [n for n in wanted if n not in zoo.ARCHS]
    if unknown:
        raise ValueError(f"--check-zoo: unknown architecture(s) {unknown}; expected some of {list(zoo.ARCHS)} or 'all'")
    if importlib.util.find_spec("transformers") is None:
        raise ValueError("--check-zoo needs transformers (pip install 'torch-fl[bench]')")
    size = "host" if backing == "cpu" else "board"

    def maker(name: str) -> Callable[[], Callable[[], Any]]:
        def make() -> Callable[[], Any]:
            model = zoo.build(name, size)
            inputs = {k: v.to("flagos") for k, v in zoo.batch(name, model, zoo.ARCHS[name].shapes[size]).items()}
            return zoo.train_step(name, model.to("flagos").train(), inputs, "flagos", bf16=backing != "cpu")

        return make

    return {f"zoo {name}": maker(name) for name in wanted}


@routes_app.command("tune")
def tune(
    name: str = typer.Argument(..., help="Platform name."),
    workload: str = typer.Option(
        "",
        help=f"{'|'.join(BUILTIN_WORKLOADS)} or a script defining make_step(device) (default: large on GPUs, tiny on the host).",
    ),
    steps: int = typer.Option(5, help="Steps per timing of the whole workload."),
    paths: Optional[str] = typer.Option(None, help="Only consider these paths besides native (comma-separated)."),
    include_gemm: bool = typer.Option(
        True,
        "--include-gemm/--skip-gemm",
        help="Tune GEMMs too (FlagGems autotunes each shape on first use; --budget bounds the time).",
    ),
    budget: Optional[float] = typer.Option(
        None, "--budget", help="Seconds of measuring; samples left after it keep their routes (default: no limit)."
    ),
    min_gain: float = typer.Option(0.05, help="A path must beat native by this fraction in a bucket."),
    dry_run: bool = typer.Option(False, "--dry-run", help="Measure and report, but do not write routes.yaml."),
    check_zoo: str = typer.Option(
        "",
        "--check-zoo",
        help="Zoo architectures (comma-separated, or 'all'; needs transformers) whose training step the "
        "tuned table must not slow down either, e.g. llama,gpt2,bert.",
    ),
    as_json: bool = JsonOption,
) -> None:
    """Measure every validated candidate per op and shape bucket on WORKLOAD; write the winners."""
    active = _activate(name, as_json)
    from torch_fl.routing import table as route_table
    from torch_fl.routing.runtime import router
    from torch_fl.routing.tuner import tune as run_tune

    backing = active.descriptor.backing.device
    workload = workload or ("large" if backing == "cuda" else "tiny")
    try:
        step = workload_step(workload, backing)
        also_check = zoo_step_makers(check_zoo, backing) if check_zoo else {}
    except (FileNotFoundError, AttributeError, ValueError) as exc:
        raise fail(str(exc), as_json, 2) from None
    say: Callable[[str], None] = (lambda m: None) if as_json else (lambda m: console.print(f"[dim]{m}[/]"))
    report = run_tune(
        router(),
        step,
        workload,
        steps=steps,
        paths=paths.split(",") if paths else None,
        include_gemm=include_gemm,
        min_gain=min_gain,
        progress=say,
        also_check=also_check,
        budget_s=budget,
    )
    target = Path(active.descriptor.directory) / active.descriptor.routes.file
    written = False
    if report.changes_table and not dry_run:
        route_table.save(router().table, target)
        written = True
    data = {"ok": True, "written": written, "routes_file": str(target), **report.as_dict()}

    def human() -> None:
        for m in report.measurements:
            console.print(f"{m.op:40s} <= {m.bound:>10d} {m.dtype:9s} x{m.calls:<4d} {m.us} {m.errors or ''}")
        console.print(
            f"native-only {report.step_ms_native} ms/step, tuned {report.step_ms_tuned} ms/step"
            + "".join(f"; {n}: {native} / {tuned} ms" for n, (native, tuned) in report.checked_ms.items())
            + "; "
            f"{'written to ' + str(target) if written else 'not written'}. {report.note}"
        )

    emit(data, as_json, human)
