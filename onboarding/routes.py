"""The initial routes.yaml of a new platform.

A default candidate order seeded from the kernel sets the descriptor declares, or `--like`'s when
its table has one, and the exceptions: `--like`'s entries that still differ from the default (its
tuned shape buckets were measured on another chip and are dropped; a person's entry keeps its
reason), and every vendor op as `[vendor, native]`: a vendor kernel exists to be used, and native
is the proven fallback behind it.
"""

from __future__ import annotations

from pathlib import Path

from torch_fl.platform.descriptor import PlatformDescriptor
from torch_fl.routing import table as route_table
from torch_fl.routing.seed import seed_table
from torch_fl.routing.table import OpRoute, Provenance, RouteTable


def vendor_first(candidates: list[str]) -> list[str]:
    """`vendor` moved to the front; native added behind it when the list has no other path."""
    rest = [c for c in candidates if c != "vendor"]
    return ["vendor"] + (rest or ["native"])


def initial_table(descriptor: PlatformDescriptor, like: PlatformDescriptor | None) -> RouteTable:
    declared = set(descriptor.kernels.declared())
    vendor_ops = descriptor.kernels.vendor.ops if descriptor.kernels.vendor is not None else {}
    like_file = Path(like.directory) / like.routes.file if like is not None and like.directory is not None else None
    default = seed_table(descriptor).default
    ops: dict[str, OpRoute] = {}
    if like_file is not None and like_file.is_file():
        source = route_table.load(like_file)
        note = f"from {like.name}'s routes.yaml"
        if source.default:
            default = [c for c in source.default if c in declared] or default
        for op, route in source.ops.items():
            # --like's vendor kernels are not inherited, so neither are its vendor routes.
            kept = [c for c in route.candidates if c in declared and (c != "vendor" or op in vendor_ops)]
            # A person's entry keeps its reason (a kernel library's known defect holds on any chip);
            # otherwise an entry is kept only where its order disagrees with the default's.
            if route.provenance is not None and route.provenance.source == "person":
                ops[op] = OpRoute(candidates=kept, provenance=route.provenance)
            elif kept != [c for c in default if c in kept] and [c for c in kept if c not in ("native", "cpu")]:
                ops[op] = OpRoute(candidates=kept, provenance=Provenance(source="onboard", note=note))
    for op in vendor_ops:
        previous = ops[op].candidates if op in ops else ["native"]
        ops[op] = OpRoute(
            candidates=vendor_first(previous), provenance=Provenance(source="onboard", note="vendor kernel")
        )
    return RouteTable(default=default, ops=dict(sorted(ops.items())))


HEADER = (
    "# Route table of {name}: the default candidate order, then the ops that differ from it; the first\n"
    "# path the conformance record allows runs, the next ones are fallbacks (a path only for the ops its\n"
    "# kernel set offers). Written by `torch-fl onboard`; shape buckets are\n"
    "# written by `torch-fl routes tune {name}`, vendor entries by `torch-fl kernel add {name}`.\n"
)


def render_table(descriptor: PlatformDescriptor, table: RouteTable) -> str:
    return route_table.dumps(table, HEADER.format(name=descriptor.name))
