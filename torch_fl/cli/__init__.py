"""The `torch-fl` command: one typer app; each command group lives in its own module."""

from __future__ import annotations

import typer

app = typer.Typer(
    name="torch-fl",
    help="Bring an accelerator into PyTorch as device='flagos': platforms, routes, conformance, onboarding.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


def _register() -> None:
    # Imported here so `torch-fl --help` stays fast and each module only adds its own commands.
    from torch_fl.cli import commands  # noqa: F401


def main() -> None:
    from torch_fl.activation import activate_only_when_asked

    # A command activates the platform it names, or none: never the one torch's autoload would pick.
    activate_only_when_asked()
    _register()
    app()
