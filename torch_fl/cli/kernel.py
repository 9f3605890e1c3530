"""`torch-fl kernel add`: give a platform a vendor kernel for one aten op (stub, route, descriptor entry)."""

from __future__ import annotations

import typer
from rich.table import Table

from torch_fl.cli import app
from torch_fl.cli.output import JsonOption, console, emit, fail

kernel_app = typer.Typer(help="Vendor kernels of a platform.", no_args_is_help=True)
app.add_typer(kernel_app, name="kernel")


@kernel_app.command("add")
def add_cmd(
    name: str = typer.Argument(..., help="Platform name."),
    op: str = typer.Option(..., "--op", help="The aten overload, e.g. aten::silu or aten::add.Tensor."),
    function: str | None = typer.Option(
        None, "--function", help="Function name in the vendor module (default: from the op)."
    ),
    dry_run: bool = typer.Option(False, "--dry-run", help="Show what would change; write nothing."),
    as_json: bool = JsonOption,
) -> None:
    """Map OP to a vendor function: a stub in the vendor module, `vendor` first in routes.yaml, kernels.vendor.ops.

    The stub delegates to the op's own aten kernel on the backing tensors; replace its body with the chip's kernel. Re-running changes nothing.
    """
    from torch_fl.filelock import LockHeld
    from torch_fl.onboarding.errors import OnboardError
    from torch_fl.onboarding.vendor import KernelAddRequest, add_vendor_kernel

    try:
        report = add_vendor_kernel(KernelAddRequest(name, op, function, dry_run))
    except (OnboardError, LockHeld) as exc:
        raise fail(str(exc), as_json, 1, platform=name) from None
    data = report.as_dict()

    def human() -> None:
        table = Table(title=f"{report.op} -> {report.function}() on {name}" + (" (dry run)" if dry_run else ""))
        table.add_column("file")
        table.add_column("action")
        for entry in data["files"]:
            table.add_row(entry["path"], entry["action"])
        console.print(table)
        for step in report.next_steps:
            console.print(f"  {step}", highlight=False, soft_wrap=True)

    emit(data, as_json, human)
