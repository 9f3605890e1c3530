"""Comparing a result with its reference: FlagGems-style tolerances, metadata, storage aliasing.

Every check returns a list of problems (strings that say what was wrong, where); an empty list
means the check passed. Nothing here raises on a mismatch, so one case can report all it found.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch._prims_common import check_significant_strides

from torch_fl.numerics import tolerances


def _describe_mismatch(actual: torch.Tensor, expected: torch.Tensor, bad: torch.Tensor) -> str:
    count = int(bad.sum())
    index = tuple(int(i) for i in bad.nonzero()[0]) if bad.dim() else ()
    a = actual[index].item() if actual.dim() else actual.item()
    e = expected[index].item() if expected.dim() else expected.item()
    return f"{count}/{bad.numel()} elements differ, first at {list(index)}: got {a!r}, expected {e!r}"


def compare_tensor(
    actual: torch.Tensor, expected: torch.Tensor, dtype: torch.dtype, reduce: int = 1, signed_zeros: bool = False
) -> str | None:
    """Values of `actual` against `expected` (a reference, cast here to `dtype`); None when close.

    Both are moved to the CPU; sparse ones of the same layout are compared as dense. Floating
    results: |a - e| <= atol + rtol * |e| with the reference rounded to `dtype` first (as FlagGems
    does), NaN where and only where the reference has NaN, infinities equal. `signed_zeros`: where
    both are zero, the sign too (-0.0 is not 0.0), as PyTorch's extremal-value tests check it; only
    for a reference that gives its zeros' signs reproducibly. Integers and bool: exact.
    """
    if actual.layout != expected.layout:
        return f"layout {actual.layout}, expected {expected.layout}"
    a = actual.detach().cpu().resolve_conj().resolve_neg()
    e = expected.detach().cpu().resolve_conj().resolve_neg()
    if a.layout != torch.strided:
        # sparse results: the values they stand for (indices may legitimately differ in order)
        a, e = a.to_dense(), e.to_dense()
    if a.shape != e.shape:
        return f"shape {list(a.shape)}, expected {list(e.shape)}"
    if a.numel() == 0:
        return None
    e = e.to(dtype)
    tol = tolerances(dtype, reduce)
    if tol is None or not (a.is_floating_point() or a.is_complex()):
        bad = a.to(e.dtype) != e
        return _describe_mismatch(a, e, bad) if bool(bad.any()) else None
    rtol, atol = tol
    wide = _judging_dtype(a, e)
    a64, e64 = a.to(wide), e.to(wide)
    if not signed_zeros and _close_and_finite(a64, e64, rtol, atol):
        return None
    a_nan, e_nan = torch.isnan(a64), torch.isnan(e64)
    finite = torch.isfinite(e64) & torch.isfinite(a64)
    close = (a64 - e64).abs() <= atol + rtol * e64.abs()
    same_special = (a_nan & e_nan) | (~torch.isfinite(a64) & ~torch.isfinite(e64) & ~a_nan & ~e_nan & (a64 == e64))
    ok = torch.where(finite, close, same_special)
    if signed_zeros:
        ok &= ~_zero_sign_differs(a64, e64)
    if bool(ok.all()):
        return None
    return _describe_mismatch(a64, e64, ~ok) + f" (rtol {rtol:g}, atol {atol:g})"


def _close_and_finite(a: torch.Tensor, e: torch.Tensor, rtol: float, atol: float) -> bool:
    """The usual verdict in a few passes over board-size outputs: every bound finite and every
    |a - e| within it. A NaN or infinity on either side fails this, and the full check decides."""
    bound = e.abs().mul_(rtol).add_(atol)
    if not bool(torch.isfinite(bound).all()):
        return False
    return bool(((a - e).abs() <= bound).all())


def _judging_dtype(a: torch.Tensor, e: torch.Tensor) -> torch.dtype:
    """Where |a - e| <= atol + rtol * |e| is computed: float32 holds 16-bit floats exactly and its
    rounding is far below their tolerances (and it halves the cost on board-size outputs);
    anything wider, complex or mixed goes to float64 / complex128."""
    if a.dtype == e.dtype and a.dtype in (torch.float16, torch.bfloat16):
        return torch.float32
    return torch.complex128 if e.is_complex() or a.is_complex() else torch.float64


def _zero_sign_differs(a: torch.Tensor, e: torch.Tensor) -> torch.Tensor:
    """Where both are zero with different signs (of either part, for complex ones)."""
    if a.is_complex():
        a_parts, e_parts = torch.view_as_real(a), torch.view_as_real(e)
        return ((a_parts == 0) & (e_parts == 0) & (a_parts.signbit() != e_parts.signbit())).any(-1)
    return (a == 0) & (e == 0) & (a.signbit() != e.signbit())


def compare_value(actual: Any, expected: Any, dtype: torch.dtype, reduce: int = 1) -> str | None:
    """Compare one output leaf: a tensor, a number, a bool, a size, or anything with ==."""
    if isinstance(expected, torch.Tensor):
        if not isinstance(actual, torch.Tensor):
            return f"got {type(actual).__name__}, expected a tensor"
        return compare_tensor(
            actual,
            expected,
            dtype if expected.dtype.is_floating_point or expected.dtype.is_complex else expected.dtype,
            reduce,
        )
    if isinstance(actual, torch.Tensor):
        return f"got a tensor, expected {type(expected).__name__}"
    if isinstance(expected, float) and isinstance(actual, (int, float)):
        if math.isnan(expected) and math.isnan(actual):
            return None
        rtol, atol = tolerances(dtype, reduce) or (0.0, 0.0)
        return (
            None if abs(actual - expected) <= atol + rtol * abs(expected) else f"got {actual!r}, expected {expected!r}"
        )
    if isinstance(expected, complex) and isinstance(actual, complex):
        return (
            None
            if abs(actual - expected) <= 1e-4 * max(1.0, abs(expected))
            else f"got {actual!r}, expected {expected!r}"
        )
    try:
        same = bool(actual == expected)
    except Exception:  # incomparable objects: report their types
        same = type(actual) is type(expected)
    return None if same else f"got {actual!r}, expected {expected!r}"


def is_dense(t: torch.Tensor) -> bool:
    """Non-overlapping and dense: its elements fill a storage range exactly, in some dim order."""
    expected = 1
    for stride, size in sorted((st, sz) for sz, st in zip(t.shape, t.stride()) if sz != 1):
        if stride != expected:
            return False
        expected *= size
    return True


def compare_metadata(actual: torch.Tensor, expected: torch.Tensor, check_strides: bool = True) -> list[str]:
    """dtype, shape, and (for dense, non-overlapping expected results) the significant strides."""
    problems = []
    if actual.dtype != expected.dtype:
        problems.append(f"dtype {actual.dtype}, expected {expected.dtype}")
    if actual.shape != expected.shape:
        problems.append(f"shape {list(actual.shape)}, expected {list(expected.shape)}")
    elif check_strides and actual.layout == torch.strided and expected.layout == torch.strided and actual.numel() > 1:
        if is_dense(expected):
            same, _ = check_significant_strides(actual, expected, only_cuda=False)
            if not same:
                problems.append(f"strides {actual.stride()}, expected {expected.stride()}")
    return problems


def storage_key(t: torch.Tensor) -> tuple[int, int] | None:
    """(start, end) of the bytes a tensor's storage spans; None for tensors without storage."""
    # A ZeroTensor (autograd's zero gradient) has a storage without bytes whose pointer PyTorch
    # refuses to show on any device.
    if t.layout != torch.strided or t._is_zerotensor():
        return None
    try:
        storage = t.untyped_storage()
    except (RuntimeError, NotImplementedError):
        return None
    start = storage.data_ptr()
    if start == 0 or storage.nbytes() == 0:
        return None
    return start, start + storage.nbytes()


def overlaps(a: tuple[int, int] | None, b: tuple[int, int] | None) -> bool:
    return a is not None and b is not None and a[0] < b[1] and b[0] < a[1]


def alias_pattern(outputs: list[Any], inputs: list[torch.Tensor]) -> set[tuple[int, int]]:
    """(output index, input index) pairs whose storages overlap."""
    keys = [storage_key(t) for t in inputs]
    pairs = set()
    for i, out in enumerate(outputs):
        if not isinstance(out, torch.Tensor):
            continue
        key = storage_key(out)
        for j, k in enumerate(keys):
            if overlaps(key, k):
                pairs.add((i, j))
    return pairs


def compare_alias_patterns(actual: set[tuple[int, int]], expected: set[tuple[int, int]]) -> list[str]:
    """Aliasing must be as PyTorch's own kernels do it: no extra aliases, no copies where views are."""
    problems = []
    for i, j in sorted(actual - expected):
        problems.append(f"output {i} shares storage with input {j}, which PyTorch's kernel does not")
    for i, j in sorted(expected - actual):
        problems.append(f"output {i} is a copy, but PyTorch returns a view of input {j}")
    return problems
