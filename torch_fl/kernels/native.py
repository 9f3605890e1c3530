"""The native path in Python form: what the C++ native route runs, called from a Python route.

Ops routed natively normally get no Python kernel at all (the C++ fallback serves them at C++
speed); this form exists for ops whose route picks native for some shapes and another path for
others, and for forcing native while another route is installed.

Without a Python route, an op the core does not claim but PyTorch gives a CompositeExplicitAutograd
kernel runs that composite on flagos tensors (`_to_copy`, `zeros_like`, ...), not the backing's
kernel: `_to_copy` to the CPU, for one, pins its result only for an accelerator source. Its
Python form therefore redispatches to the same composite; every other op runs the backing's own
kernel on aliases, as the C++ route does.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch

from torch_fl.kernels.aliasing import call_on_backing
from torch_fl.kernels.base import op_name

_COMPOSITE = torch._C.DispatchKeySet(torch._C.DispatchKey.CompositeExplicitAutograd)


class NativeKernels:
    name = "native"

    def __init__(self) -> None:
        self._composite: dict[torch._ops.OpOverload, bool] = {}

    def ops(self) -> Iterable[str]:
        return ()

    def implements(self, op: str) -> bool:
        return True

    def before_python_route(self, op: torch._ops.OpOverload) -> None:
        """Note what serves `op` on flagos now, before a Python route kernel takes its place."""
        if op not in self._composite:
            has, name = torch._C._dispatch_has_kernel_for_dispatch_key, op_name(op)
            self._composite[op] = not has(name, "PrivateUse1") and has(name, "CompositeExplicitAutograd")

    def serves_composite(self, op: torch._ops.OpOverload) -> bool:
        """Whether PyTorch's composite, not the backing's kernel, serves `op` without a route kernel."""
        return self._composite.get(op, False)

    def call(self, op: torch._ops.OpOverload, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        if self._composite.get(op, False):
            return op.redispatch(_COMPOSITE, *args, **kwargs)
        return call_on_backing(op, args, kwargs)
