"""The initial route table of a platform, from the kernel sets its descriptor declares.

Native stays first for every op: a path that has not won a measurement (the tuner writes shape
buckets) should not cost a Python call per op; vendor kernels, which exist to be used, go first.
"""
from __future__ import annotations

from torch_fl.platform import PlatformDescriptor
from torch_fl.routing.table import OpRoute, Provenance, RouteTable


def offered_by(descriptor: PlatformDescriptor) -> dict[str, list[str]]:
    """Kernel set -> the ops it offers, for the sets the descriptor declares (no imports of them)."""
    kernels = descriptor.kernels
    offered: dict[str, list[str]] = {}
    if kernels.flaggems is not None and kernels.flaggems.enabled:
        from torch_fl.kernels.flaggems import offered_ops

        offered["flaggems"] = offered_ops()
    if kernels.emulated is not None and kernels.emulated.fp8:
        from torch_fl.kernels.emulated import OPS

        offered["emulated"] = list(OPS)
    if kernels.vendor is not None:
        offered["vendor"] = sorted(kernels.vendor.ops)
    return offered


def seed_table(descriptor: PlatformDescriptor) -> RouteTable:
    candidates: dict[str, list[str]] = {}
    for path, ops in offered_by(descriptor).items():
        for op in ops:
            candidates.setdefault(op, ["native"]).append(path)
    ops = {}
    for op, paths in sorted(candidates.items()):
        if "vendor" in paths:
            paths = ["vendor"] + [p for p in paths if p != "vendor"]
        ops[op] = OpRoute(candidates=paths, provenance=Provenance(source="seed", note="declared kernel sets"))
    return RouteTable(ops=ops)
