"""The flaggems path: FlagGems' Triton kernels called directly on zero-copy backing aliases.

`flag_gems.enable()` is never called (it would take over every CUDA op in the process). The op
list comes from FlagGems' own registration table; the committed snapshot serves where FlagGems
cannot be imported (any CPU machine), so route tables can name the candidates everywhere.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from typing import Any, Optional

import torch

from torch_fl.kernels.aliasing import call_on_backing
from torch_fl.kernels.base import op_name
from torch_fl.kernels.flaggems_table import SPECIAL, registered_ops, snapshot_ops

# Overloads a backend route can never serve: torch decomposes them above the backend, or they do
# not exist in torch. Everything else is offered and left to conformance to accept or refuse.
_UNROUTABLE = ("composite-implicit", "absent")


def offered_ops() -> list[str]:
    return [op for op in snapshot_ops() if not any(SPECIAL.get(op, "").startswith(k) for k in _UNROUTABLE)]


class FlagGemsKernels:
    name = "flaggems"

    def __init__(self, config: Any) -> None:
        self.config = config
        self._offered = frozenset(offered_ops())
        self._table: Optional[dict[str, Callable[..., Any]]] = None
        self.unavailable: Optional[str] = None

    def _load(self) -> dict[str, Callable[..., Any]]:
        if self._table is None:
            # Naming the vendor skips FlagGems' probing of every vendor's tools at import.
            os.environ.setdefault("GEMS_VENDOR", self.config.vendor)
            try:
                self._table = registered_ops()
            except ImportError as exc:
                self.unavailable = f"{self.config.package} cannot be imported here: {exc}"
                self._table = {}
        return self._table

    def ops(self) -> Iterable[str]:
        return sorted(self._offered)

    def implements(self, op: str) -> bool:
        return op in self._offered and op in self._load()

    def call(self, op: torch._ops.OpOverload, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        return call_on_backing(self._load()[op_name(op)], args, kwargs)
