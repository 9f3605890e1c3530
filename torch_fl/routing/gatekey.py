"""The gate key of a call: what a conformance verdict is about, and what the router looks up.

One function computes it for both sides. The conformance suites record each case under the keys
of the calls it made on the path under test (the router reports them while a route is forced),
and at run time the router asks the gate about the key of the call at hand; a call whose key no
case checked runs the next candidate. So the two can never disagree about what was proven.

A key reads `<inputs>[-><outputs>]@<size class>`:

- inputs, in schema order: each tensor argument's dtype (`float32`; `float32[]` for a 0-dim
  tensor, which promotes like a Python number; `-` for an absent optional tensor; a tensor list
  as the distinct dtypes of its items, `[float32|int64]`), each Scalar argument's Python kind
  (`int`, `float`, `complex`, `bool`), and each dtype argument that is set (`dtype=float32`);
- outputs: the dtypes of the `out=` tensors, so an `out=` of another dtype is a case of its own;
- the size class of the largest tensor argument, from SIZE_CLASSES.

Layouts (strides, offsets, broadcast) are not part of the key: a path must handle every layout
of a key to pass it, and the suites sweep them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NamedTuple

if TYPE_CHECKING:
    import torch

# torch is imported on first use, not here: importing this module first (the conformance tests
# do) would otherwise run torch's backend autoload, whose activation imports this very module.

SIZE_CLASSES: tuple[tuple[str, int | None], ...] = (
    ("tiny", 2**8),
    ("small", 2**12),
    ("medium", 2**16),
    ("large", 2**20),
    ("huge", None),
)
"""(name, largest numel in the class). Kernels switch code paths (tails, tiles, grid limits) as
sizes grow, so a verdict at one class says nothing about the next; the conformance sweeps reach
every class. `huge` is open-ended: it is proven by the sweeps' largest sizes, not beyond."""


def size_class(numel: int) -> str:
    """The size class of a call whose largest tensor has `numel` elements."""
    for name, bound in SIZE_CLASSES:
        if bound is None or numel <= bound:
            return name
    raise AssertionError("the last size class is open-ended")


def size_class_bounds(name: str) -> tuple[int, int | None]:
    """(smallest, largest) numel of a size class; largest None for the open-ended one."""
    low = 0
    for cls, bound in SIZE_CLASSES:
        if cls == name:
            return low, bound
        low = (bound or 0) + 1
    raise KeyError(f"unknown size class {name!r}; classes: {[c for c, _ in SIZE_CLASSES]}")


class CallKey(NamedTuple):
    """A call's gate key, with the two parts a tuned bucket is chosen by."""

    text: str
    numel: int
    dtype: str | None  # the first tensor argument's dtype


_TENSOR, _TENSORS, _SCALAR, _DTYPE = "tensor", "tensors", "scalar", "dtype"


@dataclass(frozen=True)
class _Slot:
    position: int | None  # None: keyword-only
    name: str
    kind: str
    out: bool


def _slot_kind(real_type: str) -> str | None:
    if real_type in ("Tensor", "Optional[Tensor]"):
        return _TENSOR
    if real_type in ("List[Tensor]", "List[Optional[Tensor]]", "Optional[List[Tensor]]"):
        return _TENSORS
    if real_type in ("number", "Optional[number]"):
        return _SCALAR
    if "ScalarType" in real_type:
        return _DTYPE
    return None


def _slots(overload: torch._ops.OpOverload) -> tuple[_Slot, ...]:
    slots = []
    for position, arg in enumerate(overload._schema.arguments):
        kind = _slot_kind(str(getattr(arg, "real_type", arg.type)))
        if kind is None:
            continue
        out = bool(arg.kwarg_only and arg.alias_info is not None and arg.alias_info.is_write)
        slots.append(_Slot(None if arg.kwarg_only else position, arg.name, kind, out))
    return tuple(slots)


_ABSENT = object()
_DTYPE_NAMES: dict[Any, str] = {}


def dtype_name(dtype: torch.dtype) -> str:
    """`torch.float32` -> `float32`."""
    name = _DTYPE_NAMES.get(dtype)
    if name is None:
        name = _DTYPE_NAMES[dtype] = str(dtype).removeprefix("torch.")
    return name


def _tensor_word(t: Any) -> tuple[str, int]:
    import torch

    if t is None:
        return "-", 0
    if not isinstance(t, torch.Tensor):
        return type(t).__name__, 0
    name = dtype_name(t.dtype)
    return (name + "[]" if t.dim() == 0 else name), t.numel()


def _scalar_word(value: Any) -> str:
    import torch

    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int):
        return "int"
    if isinstance(value, float):
        return "float"
    if isinstance(value, complex):
        return "complex"
    if isinstance(value, torch.Tensor):  # a Scalar passed as a 0-dim tensor
        return _tensor_word(value)[0]
    return type(value).__name__


KeyFunction = Callable[[tuple[Any, ...], dict[str, Any]], CallKey]


def key_function(overload: torch._ops.OpOverload) -> KeyFunction:
    """The key function of one overload (its schema is read once, here, not per call)."""
    import torch

    slots = _slots(overload)

    def key(args: tuple[Any, ...], kwargs: dict[str, Any]) -> CallKey:
        inputs: list[str] = []
        outputs: list[str] = []
        largest = 0
        first: str | None = None
        for slot in slots:
            if slot.position is not None and slot.position < len(args):
                value = args[slot.position]
            else:
                value = kwargs.get(slot.name, _ABSENT)
            if value is _ABSENT:
                continue
            words = outputs if slot.out else inputs
            if slot.kind == _TENSOR:
                word, numel = _tensor_word(value)
                largest = max(largest, numel)
                if first is None and isinstance(value, torch.Tensor):
                    first = dtype_name(value.dtype)
                words.append(word)
            elif slot.kind == _TENSORS:
                seen: list[str] = []
                for item in value or ():
                    word, numel = _tensor_word(item)
                    largest = max(largest, numel)
                    if first is None and isinstance(item, torch.Tensor):
                        first = dtype_name(item.dtype)
                    if word not in seen:
                        seen.append(word)
                words.append("[" + "|".join(seen) + "]")
            elif slot.kind == _SCALAR:
                if value is not None:
                    inputs.append(_scalar_word(value))
            elif value is not None:
                inputs.append(f"{slot.name}={dtype_name(value)}")
        text = ",".join(inputs)
        if outputs:
            text += "->" + ",".join(outputs)
        return CallKey(f"{text}@{size_class(largest)}", largest, first)

    return key


_KEY_FUNCTIONS: dict[torch._ops.OpOverload, KeyFunction] = {}


def call_key(overload: torch._ops.OpOverload, args: tuple[Any, ...], kwargs: dict[str, Any]) -> CallKey:
    """The gate key of calling `overload` with `args` and `kwargs`."""
    fn = _KEY_FUNCTIONS.get(overload)
    if fn is None:
        fn = _KEY_FUNCTIONS[overload] = key_function(overload)
    return fn(args, kwargs)
