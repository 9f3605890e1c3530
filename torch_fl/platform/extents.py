"""The named extents of a call: how far a proof reaches, and what a declared constraint limits.

A gate key says what a call is (its dtypes) and roughly how big (its size class); extents say how
long each dimension that decides a kernel's code path is. Every call has the generic extents:

- `numel`: the elements of the call's box, the right-aligned per-dimension maxima of all its
  tensor arguments (so a broadcasting outer product counts its result, not its inputs);
- `rank`: the most dimensions any tensor argument has;
- `last`: the longest last dimension (a norm's or softmax's row, a reduction over the last dim).

Some ops name more (EXTENT_DIMS): a matmul's M, K, N, an attention's sequence and head lengths.
The record keeps, per op x path x dtypes, the largest extents its passing cases reached, and the
runtime serves a gated path only for calls within them and within the platform's declared
constraints; the C++ route filter measures calls the same way (`dim_refs`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, NamedTuple

if TYPE_CHECKING:
    import torch

GENERIC_DIMS: tuple[str, ...] = ("numel", "rank", "last")

_ATTENTION = {"seq": (0, 2), "kv_seq": (1, 2), "head_dim": (0, 3)}
EXTENT_DIMS: dict[str, dict[str, tuple[int, int]]] = {
    "mm": {"M": (0, 0), "K": (0, 1), "N": (1, 1)},
    "addmm": {"M": (1, 0), "K": (1, 1), "N": (2, 1)},
    "bmm": {"B": (0, 0), "M": (0, 1), "K": (0, 2), "N": (1, 2)},
    "baddbmm": {"B": (1, 0), "M": (1, 1), "K": (1, 2), "N": (2, 2)},
    "mv": {"M": (0, 0), "K": (0, 1)},
    "_scaled_mm": {"M": (0, 0), "K": (0, 1), "N": (1, 1)},
    "_scaled_dot_product_flash_attention": _ATTENTION,
    "_scaled_dot_product_efficient_attention": _ATTENTION,
    "_scaled_dot_product_flash_attention_for_cpu": _ATTENTION,
    "_scaled_dot_product_fused_attention_overrideable": _ATTENTION,
}
"""aten packet -> named dim -> (argument position, dimension of that tensor). A packet's overloads
(`mm`, `mm.out`) share their leading arguments."""


class DimRef(NamedTuple):
    """How to measure one named extent: generic (`arg` -1) or a dimension of a tensor argument."""

    name: str
    arg: int
    dim: int


def dims_of(op: str) -> tuple[str, ...]:
    """The extent names calls of `op` (`aten::mm`, `aten::mm.out`) are measured by."""
    return GENERIC_DIMS + tuple(EXTENT_DIMS.get(_packet(op), {}))


def dim_refs(op: str) -> tuple[DimRef, ...]:
    """What the C++ route filter measures for `op`, in `dims_of` order."""
    named = EXTENT_DIMS.get(_packet(op), {})
    return tuple(DimRef(n, -1, 0) for n in GENERIC_DIMS) + tuple(DimRef(n, a, d) for n, (a, d) in named.items())


def _packet(op: str) -> str:
    return op.split("::", 1)[-1].split(".", 1)[0]


Extents = dict[str, int]
ExtentFunction = Callable[[tuple[Any, ...], Mapping[str, Any]], Extents]


def extent_function(op: str) -> ExtentFunction:
    """The extents of a call of `op`, from its positional and keyword arguments."""
    import torch

    named = EXTENT_DIMS.get(_packet(op), {})

    def measure(args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> Extents:
        box: list[int] = []

        def see(t: Any) -> None:
            if not isinstance(t, torch.Tensor):
                return
            shape = t.shape
            grow = len(shape) - len(box)
            if grow > 0:
                box[:0] = [0] * grow
            offset = len(box) - len(shape)
            for i, size in enumerate(shape):
                if size > box[offset + i]:
                    box[offset + i] = size

        for value in (*args, *kwargs.values()):
            if isinstance(value, (list, tuple)):
                for item in value:
                    see(item)
            else:
                see(value)
        numel = 1
        for size in box:
            numel *= size
        out = {"numel": numel, "rank": len(box), "last": box[-1] if box else 0}
        for name, (arg, dim) in named.items():
            t = args[arg] if arg < len(args) else None
            out[name] = _size(t, dim) if isinstance(t, torch.Tensor) else 0
        return out

    return measure


def _size(t: torch.Tensor, dim: int) -> int:
    return int(t.shape[dim]) if -t.dim() <= dim < t.dim() else 0


def merge(into: dict[str, list[int]], extents: Mapping[str, int]) -> None:
    """Widen `into` (name -> [smallest, largest]) to take in one more call's extents."""
    for name, value in extents.items():
        span = into.get(name)
        if span is None:
            into[name] = [value, value]
        else:
            span[0], span[1] = min(span[0], value), max(span[1], value)
