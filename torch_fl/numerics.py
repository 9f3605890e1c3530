"""How close a result must be to its reference: FlagGems' tolerances, scaled by reduction length.

Shared by the conformance suites, which judge kernels against references, and the route tuner,
which checks a candidate against native at a workload's shapes before it may be chosen.
"""

from __future__ import annotations

import math

import torch

# The relative tolerances FlagGems' own tests use (tests/accuracy_utils.py RESOLUTION); complex
# types take their component's.
RTOL: dict[torch.dtype, float] = {
    torch.float16: 1e-3,
    torch.bfloat16: 1.6e-2,
    torch.float32: 1.3e-6,
    torch.float64: 1e-7,
    torch.complex32: 1e-3,
    torch.complex64: 1.3e-6,
    torch.complex128: 1e-7,
}
ATOL_PER_REDUCED_ELEMENT = 1e-4
"""FlagGems' gems_assert_close: atol = 1e-4 * reduce_dim (the reduction length)."""


def reference_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype a reference is computed in: float64 for floats, complex128 for complex, else itself."""
    if dtype.is_complex:
        return torch.complex128
    if dtype.is_floating_point:
        return torch.float64
    return dtype


def tolerances(dtype: torch.dtype, reduce: int = 1) -> tuple[float, float] | None:
    """(rtol, atol) for `dtype`, None where results must be exact (integers, bool)."""
    rtol = RTOL.get(dtype)
    if rtol is None:
        return None
    return rtol, ATOL_PER_REDUCED_ELEMENT * max(1, reduce)


def reduction_length(inputs: list[torch.Tensor], output: torch.Tensor) -> int:
    """How many input elements feed one output element, roughly; scales atol like FlagGems' reduce_dim.

    numel(inputs) / numel(output) covers reductions; the largest inner dimension of a matrix
    input covers contractions (mm, bmm, conv) whose output is as large as their inputs.
    """
    out_numel = max(1, output.numel())
    total = sum(t.numel() for t in inputs)
    inner = max((t.shape[-1] for t in inputs if t.dim() >= 2), default=1)
    return max(1, math.ceil(total / out_numel), inner)
