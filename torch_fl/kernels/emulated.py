"""The emulated path: FP8 for chips without FP8 hardware, by scaled upcast.

FP8 tensors only store bits; every conversion is software (fp8.py) and the matmul runs in float32
on the backing's ordinary kernels. Offered ops: `_scaled_mm` and `_to_copy` (conversions from or
to an FP8 dtype; other conversions go to the native path).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Optional

import torch

from torch_fl.kernels import fp8
from torch_fl.kernels.aliasing import call_on_backing

OPS = ("aten::_scaled_mm", "aten::_to_copy")


def scaled_mm(
    a: torch.Tensor,
    b: torch.Tensor,
    scale_a: torch.Tensor,
    scale_b: torch.Tensor,
    bias: Optional[torch.Tensor] = None,
    scale_result: Optional[torch.Tensor] = None,
    out_dtype: Optional[torch.dtype] = None,
    use_fast_accum: bool = False,
) -> torch.Tensor:
    """aten::_scaled_mm: (a * scale_a) @ (b * scale_b) (+ bias), computed in float32.

    Scales are per tensor (one element) or per row of `a` (M, 1) and per column of `b` (1, N),
    which broadcasting applies directly. `use_fast_accum` has no meaning here.
    """
    out = (fp8.from_fp8(a) * scale_a.float()) @ (fp8.from_fp8(b) * scale_b.float())
    if bias is not None:
        out = out + bias.float()
    dtype = out_dtype or a.dtype
    if fp8.is_fp8(dtype):
        if scale_result is not None:
            out = out / scale_result.float()
        return fp8.to_fp8(out, dtype)
    return out.to(dtype)


class EmulatedKernels:
    name = "emulated"

    def __init__(self, config: Any) -> None:
        self.enabled = bool(getattr(config, "fp8", False))

    def ops(self) -> Iterable[str]:
        return OPS if self.enabled else ()

    def implements(self, op: str) -> bool:
        return self.enabled and op in OPS

    def call(self, op: torch._ops.OpOverload, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        if op is torch.ops.aten._scaled_mm.default:
            return call_on_backing(scaled_mm, args, kwargs)
        return call_on_backing(_to_copy, args, kwargs)


def _to_copy(x: torch.Tensor, **kwargs: Any) -> torch.Tensor:
    """aten::_to_copy with FP8 conversions done in software; any other conversion is native."""
    target = kwargs.get("dtype") or x.dtype
    if not (fp8.is_fp8(target) or fp8.is_fp8(x.dtype)):
        return torch.ops.aten._to_copy.default(x, **kwargs)
    rest = {k: v for k, v in kwargs.items() if k != "dtype"}
    values = fp8.from_fp8(x) if fp8.is_fp8(x.dtype) else x.float()
    converted = fp8.to_fp8(values, target) if fp8.is_fp8(target) else values.to(target)
    return torch.ops.aten._to_copy.default(converted, **rest) if rest else converted
