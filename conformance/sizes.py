"""What the sweep suite runs each op at: sizes by op category, layouts, mixed dtypes, special values.
One table to read.

Kernels switch code paths where sizes cross powers of two (tails, tiles, block and grid limits) and
overflow where extents grow, so each category's sizes sit around those edges and reach every size
class of the gate key (torch_fl.routing.gatekey.SIZE_CLASSES: tiny <= 2^8, small <= 2^12, medium
<= 2^16, large <= 2^20, huge above). The sizes are the dims of a category's inputs:

- elementwise: numel of every tensor input, 2^k - 1, 2^k, 2^k + 1;
- reduction: (rows, reduced extent), reduced over the last dim (and over the rows: SELECTORS' dim);
- matmul: (M, N, K), extents off multiples of 8/16/64 among them; a batch of 2 for batched ops;
- norm (layer norm, softmax, RMS norm): (batch, seq, hidden) or (rows, hidden), normalised over hidden;
- attention: (batch, heads, seq, head_dim);
- conv: (N, C_in, H, W, C_out, kernel, stride, padding), ImageNet-like stages.

Each category also varies one dimension at a time (DIM_SWEEPS) across 2^k - 1, 2^k, 2^k + 1 for
the k in DIM_KS up to a realistic extent, the other dims small, so that a threshold in one
dimension (a split-K above some K, a long normalised row of a 3-D input, a grid limit in rows)
shows at moderate numel. Arguments that pick another code path (sweepgen.SELECTORS: keepdim,
rounding_mode, approximate, a reduction's dim, ...) run each of their values at every size, layout
and dtype-mix case.

Compute-heavy categories (matmul, attention, conv) run their size sweeps in floating dtypes only;
other dtypes get their layouts there. Every category gets every layout that applies to it, at
LAYOUT_DIMS; elementwise ops get SIZED_LAYOUTS at every size class too (LAYOUT_SIZES).

Where the platform exposes several devices, each op x dtype also runs on every other device index
at SPECIAL_SIZES and one layout, with the current device that index and with it left at 0.

Random inputs never hold NaN, infinities, signed zeros or subnormals and (for floats) never tie,
so every category also runs its special-value cases at SPECIAL_SIZES: one small, one above 2^12
elements. EXTREMAL_KIND says which extremal values a category's inputs get, and VALUE_KINDS what
each kind holds (conformance/sweepcall.py makes them).
"""

from __future__ import annotations

ELEMENTWISE_NUMELS: tuple[int, ...] = tuple(
    n for k in (0, 4, 8, 12, 16, 20) for n in (2**k - 1, 2**k, 2**k + 1) if n > 0
)

SIZES: dict[str, tuple[tuple[int, ...], ...]] = {
    "elementwise": tuple((n,) for n in ELEMENTWISE_NUMELS),
    "reduction": ((1, 1), (3, 255), (1, 4097), (64, 1023), (2, 65536), (1, 65537), (4096, 33), (1025, 1025)),
    "matmul": (
        (1, 1, 1),
        (17, 33, 65),
        (127, 129, 255),
        (127, 255, 511),
        (64, 64, 4096),
        (4096, 64, 64),
        (64, 4096, 64),
        (4095, 17, 129),
        (4097, 65, 257),
    ),
    "norm": ((1, 1, 8), (1, 16, 64), (3, 17, 1023), (2, 128, 768), (1, 2048, 1024), (2, 1024, 1025)),
    "attention": (
        (1, 1, 4, 64),
        (1, 2, 16, 64),
        (1, 2, 128, 64),
        (2, 2, 257, 128),
        (1, 2, 2048, 64),
        (1, 1, 2048, 128),
        (1, 9, 2048, 64),
    ),
    "conv": (
        (1, 1, 8, 8, 2, 3, 1, 1),
        (1, 3, 17, 17, 8, 3, 1, 1),
        (1, 16, 32, 32, 16, 3, 1, 1),
        (1, 3, 224, 224, 64, 7, 2, 3),
        (2, 64, 56, 56, 64, 3, 1, 1),
        (2, 256, 14, 14, 512, 1, 1, 0),
        (8, 64, 56, 56, 64, 3, 1, 1),
    ),
}
"""Category -> the dims of each size case (see the module docstring for what the dims are). Each
category reaches every size class with its largest tensor argument (the gate key's size)."""

DIM_KS: tuple[int, ...] = (4, 8, 10, 12, 13, 16)
"""The k of the 2^k - 1, 2^k, 2^k + 1 a one-dimension sweep visits below its top (sparse: the
common tile and block edges and the 65535 grid limit, not every power of two)."""


def _around(top: int) -> tuple[int, ...]:
    """2^k - 1, 2^k, 2^k + 1 for the k of DIM_KS below `top`, and for `top` itself."""
    return tuple(n for k in (*(k for k in DIM_KS if k < top), top) for n in (2**k - 1, 2**k, 2**k + 1))


DIM_SWEEPS: dict[str, dict[str, tuple[tuple[int, ...], ...]]] = {
    "reduction": {
        "reduced": tuple((3, n) for n in _around(20)),
        "rows": tuple((n, 3) for n in _around(16)),  # past the 65535 blocks of a grid's y and z
    },
    "matmul": {
        "K": tuple((17, 33, n) for n in _around(13)),
        "M": tuple((n, 33, 17) for n in _around(13)),
        "N": tuple((17, n, 33) for n in _around(13)),
    },
    "norm": {
        # 2-D (rows, hidden) first, then 3-D (batch, seq, hidden): a kernel may treat them apart
        "hidden": tuple((3, n) for n in _around(14)) + tuple((2, 3, n) for n in _around(14)),
        "seq": tuple((2, n, 33) for n in _around(16)),
    },
    "attention": {"seq": tuple((1, 1, n, d) for d in (64, 128) for n in _around(13))},
    "conv": {
        "C_in": tuple((1, n, 9, 9, 8, 3, 1, 1) for n in _around(12)),
        "H": tuple((1, 3, n, 9, 8, 3, 1, 1) for n in _around(12)),
        "W": tuple((1, 3, 9, n, 8, 3, 1, 1) for n in _around(12)),
        "C_out": tuple((1, 3, 9, 9, n, 3, 1, 1) for n in _around(12)),
    },
}
"""Category -> {the dimension varied -> the dims of its cases}: one dimension up to a realistic
extent (the dims as in SIZES), the others small. Elementwise ops have one dimension, their numel,
which SIZES sweeps already."""

LIMIT_PROBES: dict[str, dict[str, tuple[tuple[int, ...], ...]]] = {
    "elementwise": {"numel": ((0,),), "last": ((0,),)},
    "reduction": {"last": ((3, 0),)},
    "matmul": {"M": ((0, 33, 17),), "N": ((17, 0, 33),), "K": ((17, 33, 0),)},
    "norm": {"last": ((3, 0), (2, 3, 0))},
    "attention": {"seq": ((1, 1, 0, 64),), "head_dim": ((1, 1, 9, 0),)},
}
"""Category -> named extent (torch_fl.platform.extents) -> the dims of the cases that probe a
declared limit of it, the varied dimension given as 0 (the limit and one past it go there): a
platform that declares `K: {max: 512}` for its matmul is tried at K = 512 and 513, others small."""

MIXED_SIZES: dict[str, tuple[tuple[int, ...], ...]] = {
    "elementwise": ((255,), (4095,), (65535,), (1048575,), (1048577,)),
    "reduction": SIZES["reduction"],
    "norm": SIZES["norm"],
}
"""Category -> the sizes the dtype-mix cases run at: one per size class where the sizes are cheap, all
of them for reductions and norms (a norm backward's float32 statistics); the compute-heavy
categories run their mixes at LAYOUT_DIMS only."""

LAYOUT_DIMS: dict[str, tuple[int, ...]] = {
    "elementwise": (33, 17),
    "reduction": (33, 17),
    "matmul": (33, 17, 19),
    "norm": (2, 9, 33),
    "attention": (1, 2, 9, 16),
    "conv": (2, 3, 9, 11, 4, 3, 1, 1),
}
"""Category -> the (small) dims the layout and mixed-dtype cases run at."""

SIZED_LAYOUTS: tuple[str, ...] = ("transposed", "strided", "offset", "expanded")
"""The layouts whose indexing grows with the size (strides, offsets, stride-0 broadcast)."""

LAYOUT_SIZES: dict[str, tuple[tuple[int, ...], ...]] = {
    "elementwise": ((7, 9), (255, 257), (257, 257), (1025, 1025)),
}
"""Category -> the dims SIZED_LAYOUTS also run at, besides LAYOUT_DIMS: with them every size class
(tiny, medium, large, huge, each just past the class below; LAYOUT_DIMS is small)."""

LAYOUTS: tuple[str, ...] = ("transposed", "strided", "offset", "expanded", "channels_last", "0-dim", "empty")
"""How every tensor input of a layout case is laid out: the last two dims swapped (a transposed
view), every other element of a wider buffer, one element into its storage, a broadcast of one row
(expanded), channels_last (4-D inputs only), 0-dim, and empty (a zero extent)."""

HEAVY = frozenset({"matmul", "attention", "conv"})
"""Categories whose size sweep runs in floating dtypes only."""

GUARD = 64
"""Sentinel elements on each side of an in-place or out= target, to catch writes past its end."""

SPECIAL_SIZES: dict[str, tuple[tuple[int, ...], ...]] = {
    "elementwise": (LAYOUT_DIMS["elementwise"], (65, 65)),
    "reduction": (LAYOUT_DIMS["reduction"], (3, 4097)),  # rows that span several 1024-blocks: ties across them
    "matmul": (LAYOUT_DIMS["matmul"], (65, 65, 65)),  # K below sweep_chip's hang threshold (test fixture)
    "norm": (LAYOUT_DIMS["norm"], (2, 17, 257)),
    "attention": (LAYOUT_DIMS["attention"], (1, 2, 64, 64)),
    "conv": (LAYOUT_DIMS["conv"], (1, 3, 40, 40, 8, 3, 1, 1)),
}
"""Category -> the dims of its special-value cases: two size classes (small, and medium by its
largest tensor argument). The cases on other device indices run at them too, with random values."""

VALUE_KINDS: dict[str, str] = {
    "extremal": "1 in 16 elements NaN, +-inf, +-0.0, subnormals, the smallest normal, and the dtype's "
    "max and max/2 (one sign per row, so whether a row's sum overflows does not depend on the order "
    "of its additions); integers: max, min, max - 1 and min + 1 among magnitudes 2..5 (no 0 and no -1: "
    "integer division by zero and min // -1 trap)",
    "extremal-sparse": "1 in 128 elements NaN, +-inf, +-0.0 or subnormals, no huge finite values",
    "ties": "values from {-1, 0, 1, 2} (integers {-2, -1, 1, 2}, unsigned {1, 2, 3}), every third row all equal",
}
"""What each kind of special inputs holds (`Spec.values`); a tensor whose dtype the op fixes (a
mask, a scale) keeps its ordinary values."""

EXTREMAL_KIND: dict[str, str] = {
    "elementwise": "extremal",
    "reduction": "extremal",
    "matmul": "extremal-sparse",
    "norm": "extremal-sparse",
    "attention": "extremal-sparse",
    "conv": "extremal-sparse",
}
"""Category -> its extremal kind. Where outputs accumulate many products or normalise (matmul, norm,
attention, conv) the accumulation order is the kernel's own, and whether huge finite values overflow
on the way depends on it: those categories get the non-finite values and subnormals only, sparse
enough that most outputs stay finite."""
