"""Routes the router refuses whatever a table says: some ops only the native path can serve."""

from __future__ import annotations

from functools import cache
from typing import Optional

import torch

from torch_fl.kernels.base import resolve

# Overloads the C++ core itself serves on PrivateUse1: allocation, views and copies across devices
# (runtime/csrc/structural.cpp). A Python route there would replace the device's own structure.
CORE_STRUCTURAL = frozenset(
    "aten::" + name
    for name in """empty.memory_format empty_strided _efficientzerotensor as_strided view _reshape_alias unfold
    view_as_real view_as_complex is_set_to resize_ _copy_from _copy_from_and_resize _local_scalar_dense set_
    set_.source_Tensor set_.source_Storage set_.source_Storage_storage_offset record_stream""".split()
)
# Overloads whose schema declares a fresh result but whose kernels return a view by design.
SCHEMA_ALIAS_EXEMPT = frozenset(
    {"aten::_unsafe_view", "aten::unsafe_split.Tensor", "aten::unsafe_split_with_sizes", "aten::unsafe_chunk"}
)
# The cpu path moves arguments with these very ops: routing them there would recurse.
CPU_PATH_TRANSFERS = frozenset({"aten::_to_copy", "aten::copy_", "aten::clone", "aten::empty_like"})


@cache
def refusal(op: str, path: str) -> Optional[str]:
    """Why `op` may not be routed to `path` (None: it may). Native is always allowed."""
    if path == "native":
        return None
    if op in CORE_STRUCTURAL:
        return "served by the C++ core's structural kernels"
    if op in SCHEMA_ALIAS_EXEMPT:
        return "a view in practice (its schema does not say so): only the native path keeps it one"
    try:
        overload = resolve(op)
    except AttributeError:
        return None  # not an op of this torch; the table loader reports those
    if any(r.alias_info is not None and not r.alias_info.is_write for r in overload._schema.returns):
        return "a view: it must share its input's storage, which only the native path does"
    if torch.Tag.inplace_view in overload.tags:
        return "changes its input's sizes and strides in place (transpose_, squeeze_...): only the native path can"
    if path == "cpu" and op in CPU_PATH_TRANSFERS:
        return "the cpu path transfers with this op itself"
    if path == "cpu" and "_overrideable" in op:
        # PyTorch's hooks for PrivateUse1 backends (fused SDPA, convolution): no host kernel exists.
        return "a PrivateUse1 hook with no CPU kernel: only the device itself serves it"
    return None
