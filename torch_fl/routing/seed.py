"""The initial route table of a platform, from the kernel sets its descriptor declares.

One default order for every op: native first (a path that has not won a measurement, which the
tuner writes as shape buckets, should not cost a Python call per op), then the declared kernel
libraries, then the CPU fallback where the descriptor has one. A path in the default applies only
to the ops its kernel set offers, so the table needs no entry per op. Vendor ops get entries of
their own (vendor first: a vendor kernel exists to be used), written by onboarding.
"""

from __future__ import annotations

from torch_fl.platform import PlatformDescriptor
from torch_fl.routing.table import RouteTable

# Kernel libraries in the order they are tried after native; vendor kernels get per-op entries.
_LIBRARIES = ("flaggems", "emulated")


def declared_libraries(descriptor: PlatformDescriptor) -> list[str]:
    kernels = descriptor.kernels
    enabled = {
        "flaggems": kernels.flaggems is not None and kernels.flaggems.enabled,
        "emulated": kernels.emulated is not None and kernels.emulated.fp8,
    }
    return [name for name in _LIBRARIES if enabled[name]]


def default_order(descriptor: PlatformDescriptor) -> list[str]:
    """The descriptor's route defaults with the declared kernel libraries before its CPU fallback."""
    head = [p for p in descriptor.routes.defaults if p != "cpu"]
    tail = [p for p in descriptor.routes.defaults if p == "cpu"]
    return head + [p for p in declared_libraries(descriptor) if p not in head] + tail


def seed_table(descriptor: PlatformDescriptor) -> RouteTable:
    return RouteTable(default=default_order(descriptor))
