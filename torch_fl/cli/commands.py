"""Imports every command module so each registers its commands on the app."""

from torch_fl.cli import (
    conformance,  # noqa: F401
    info,  # noqa: F401
    kernel,  # noqa: F401
    onboard,  # noqa: F401
    platforms,  # noqa: F401
    routes,  # noqa: F401
    skills,  # noqa: F401
    triage,  # noqa: F401
)
