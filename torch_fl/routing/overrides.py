"""Route overrides from the environment: one op (FLAGOS_ROUTE_<op>), the default candidate
order (FLAGOS_ROUTE_DEFAULTS), or a whole table (FLAGOS_ROUTES=path)."""

from __future__ import annotations

import functools
import os
from pathlib import Path
from typing import Optional

from torch_fl import env

PREFIX = "FLAGOS_ROUTE_"

env.register(
    "FLAGOS_ROUTE_<op>",
    None,
    "Candidate paths for one op, comma-separated, e.g. FLAGOS_ROUTE_mm=flaggems or FLAGOS_ROUTE_add__Tensor=native "
    "(op name without 'aten::', '.' written as '__').",
)
env.register("FLAGOS_ROUTE_DEFAULTS", None, "Candidate paths for every op without an entry, e.g. flaggems,native.")
env.register("FLAGOS_ROUTES", None, "Path of a routes.yaml that replaces the active platform's route table.")


def env_name(op: str) -> str:
    """FLAGOS_ROUTE_<op> spelling of an op: aten::add.Tensor -> FLAGOS_ROUTE_add__Tensor."""
    namespace, _, rest = op.partition("::")
    name = rest.replace(".", "__")
    return PREFIX + (name if namespace == "aten" else f"{namespace}__{name}")


def op_from_env_name(key: str) -> str:
    """FLAGOS_ROUTE_add___Tensor -> aten::add_.Tensor. `__` both separates the overload and occurs in
    names (aten::add_.Tensor, aten::linalg__powsum), so of the readings (split at the last `__`
    first, then earlier ones, then none) the first that torch registers wins; without one, the last
    split is kept and checks report the name unknown."""
    body = key[len(PREFIX) :]
    starts = [i for i in range(len(body) - 1, 0, -1) if body.startswith("__", i) and i + 2 < len(body)]
    readings = [f"aten::{body[:i]}.{body[i + 2 :]}" for i in starts] + [f"aten::{body}"]
    return next((r for r in readings if r in _registered_ops()), readings[0])


@functools.cache
def _registered_ops() -> frozenset[str]:
    import torch  # only reading a variable back needs the operator registry

    return frozenset(torch._C._dispatch_get_all_op_names())


def _split(value: str) -> list[str]:
    return [p.strip() for p in value.split(",") if p.strip()]


def env_route(op: str) -> list[str]:
    # Per-op variables are a family, read by prefix; the family is declared above.
    return _split(os.environ.get(env_name(op), ""))


def env_ops() -> list[str]:
    reserved = {"FLAGOS_ROUTE_DEFAULTS"}
    return [op_from_env_name(k) for k, v in os.environ.items() if k.startswith(PREFIX) and k not in reserved and v]


def env_defaults() -> list[str]:
    return _split(env.get("FLAGOS_ROUTE_DEFAULTS") or "")


def routes_file() -> Optional[Path]:
    value = env.get("FLAGOS_ROUTES")
    return Path(value) if value else None
