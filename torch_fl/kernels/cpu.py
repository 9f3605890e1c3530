"""The explicit CPU fallback: copy to the host, run PyTorch's CPU kernel, copy back.

Normally served by the C++ core (counted there, logged with FLAGOS_LOG_FALLBACK=1); this Python
form runs when a route with several candidates falls back to it.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch
from torch.utils._pytree import tree_map


class CpuKernels:
    name = "cpu"

    def ops(self) -> Iterable[str]:
        return ()

    def implements(self, op: str) -> bool:
        return True

    def call(self, op: torch._ops.OpOverload, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        pairs: dict[int, torch.Tensor] = {}
        device = None

        def down(x: Any) -> Any:
            nonlocal device
            if isinstance(x, torch.Tensor) and x.device.type == "flagos":
                host = x.cpu()
                pairs[id(host)] = x
                device = device or x.device
                return host
            if isinstance(x, torch.device) and x.type == "flagos":
                return torch.device("cpu")
            if isinstance(x, torch.Generator) and x.device.type == "flagos":
                return None
            return x

        args, kwargs = tree_map(down, (args, kwargs))
        result = op(*args, **kwargs)
        # Arguments the op wrote to (in-place, out=, out= lists) get the host values back.
        for argument, value in zip(op._schema.arguments, _bound(op, args, kwargs)):
            if argument.alias_info is None or not argument.alias_info.is_write:
                continue
            for host in value if isinstance(value, (list, tuple)) else (value,):
                if id(host) in pairs:
                    _copy_back(host, pairs[id(host)])

        def up(x: Any) -> Any:
            if isinstance(x, torch.Tensor) and x.device.type == "cpu":
                original = pairs.get(id(x))
                return original if original is not None else x.to(device or "flagos")
            return x

        return tree_map(up, result)


def _copy_back(host: torch.Tensor, original: torch.Tensor) -> None:
    """An out= the kernel resized takes the kernel's geometry, as it would on the backing; an
    argument written in place keeps its own (the host copy of a strided view is dense)."""
    if original.shape != host.shape:
        original.resize_(host.shape)
        if original.stride() != host.stride():
            original.as_strided_(host.shape, host.stride())
    original.copy_(host)


def _bound(op: torch._ops.OpOverload, args: tuple[Any, ...], kwargs: dict[str, Any]) -> list[Any]:
    """The argument values in schema order."""
    values = list(args)
    for argument in op._schema.arguments[len(args) :]:
        values.append(kwargs.get(argument.name))
    return values
