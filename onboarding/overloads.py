"""Which aten overloads reach a flagos device on the installed torch: what `torch-fl kernel add` accepts.

torch runs a CompositeImplicitAutograd overload's decomposition above the device (at the autograd
key), so a device kernel for it is never called; the device sees the overloads it decomposes into.
The exception is such an overload the backing implements itself: the runtime claims the backing's
kernel for flagos, so it does reach the device (aten::silu_backward on cpu).
"""

from __future__ import annotations

import difflib
import functools
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from torch_fl.kernels.base import op_name

_BACKING_KEYS = {"cpu": "CPU", "cuda": "CUDA"}


def reaches_device(name: str, backing: str) -> bool:
    """Whether a call of the overload `name` (aten::add.Tensor) reaches a flagos device backed by `backing`."""
    has = torch._C._dispatch_has_kernel_for_dispatch_key
    if not has(name, "CompositeImplicitAutograd"):
        return True
    return has(name, _BACKING_KEYS.get(backing, "CPU"))


@functools.cache
def _dispatched(backing: str) -> tuple[str, ...]:
    names = (n for n in torch._C._dispatch_get_all_op_names() if n.startswith("aten::"))
    return tuple(sorted(n for n in names if reaches_device(n, backing)))


def nearest(name: str, backing: str, count: int = 5) -> list[str]:
    """The overloads reaching the device whose names are closest to `name` (a misspelling, a composite)."""
    return difflib.get_close_matches(name, _dispatched(backing), n=count, cutoff=0.6)


class _Recorder(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.seen: dict[str, None] = {}  # ordered set: first call first

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        self.seen.setdefault(op_name(func))
        return func(*args, **(kwargs or {}))


def _sample(argument: Any) -> Any:
    """A value for one schema argument (small square meta tensors fit most shapes), or LookupError."""
    kind = argument.type
    if isinstance(kind, torch._C.OptionalType):
        return None
    if isinstance(kind, torch._C.ListType):
        element = kind.getElementType()
        if isinstance(element, torch._C.TensorType):
            return [torch.ones(3, 3, device="meta")] * 2
        if isinstance(element, (torch._C.IntType, torch._C.SymIntType)):
            return [3]
    simple = {
        torch._C.TensorType: lambda: torch.ones(3, 3, device="meta"),
        torch._C.IntType: lambda: 1,
        torch._C.SymIntType: lambda: 1,
        torch._C.FloatType: lambda: 1.0,
        torch._C.NumberType: lambda: 1.0,
        torch._C.BoolType: lambda: False,
    }
    for cls, make in simple.items():
        if isinstance(kind, cls):
            return make()
    raise LookupError(str(kind))


def decomposes_into(overload: torch._ops.OpOverload) -> list[str]:
    """The overloads one call of `overload` on small meta tensors dispatches, in call order; empty
    when no call can be made from its schema alone (the caller then suggests names instead)."""
    args, kwargs = [], {}
    try:
        for argument in overload._schema.arguments:
            if argument.has_default_value():
                continue
            value = _sample(argument)
            if argument.kwarg_only:
                kwargs[argument.name] = value
            else:
                args.append(value)
        with _Recorder() as recorder:
            overload(*args, **kwargs)
    except Exception:  # any failure means only that this sample call does not fit the op
        return []
    return list(recorder.seen)
