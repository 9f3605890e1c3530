"""The native path in Python form: the backing device's own aten kernel on aliases.

Ops routed natively normally get no Python kernel at all (the C++ fallback serves them at C++
speed); this form exists for ops whose route picks native for some shapes and another path for
others, and for forcing native while another route is installed.
"""
from __future__ import annotations

from typing import Any, Iterable

import torch

from torch_fl.kernels.aliasing import call_on_backing


class NativeKernels:
    name = "native"

    def ops(self) -> Iterable[str]:
        return ()

    def implements(self, op: str) -> bool:
        return True

    def call(self, op: torch._ops.OpOverload, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        return call_on_backing(op, args, kwargs)
