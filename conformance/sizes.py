"""What the sweep suite runs each op at: sizes by op category, layouts, mixed dtypes. One table to read.

Kernels switch code paths where sizes cross powers of two (tails, tiles, block and grid limits) and
overflow where extents grow, so each category's sizes sit around those edges and reach every size
class of the gate key (torch_fl.routing.gatekey.SIZE_CLASSES: tiny <= 2^8, small <= 2^12, medium
<= 2^16, large <= 2^20, huge above). The sizes are the dims of a category's inputs:

- elementwise: numel of every tensor input, 2^k - 1, 2^k, 2^k + 1;
- reduction: (rows, reduced extent), reduced over the last dim;
- matmul: (M, N, K), extents off multiples of 8/16/64 among them; a batch of 2 for batched ops;
- norm (layer norm, softmax, RMS norm): (batch, seq, hidden), normalised over hidden;
- attention: (batch, heads, seq, head_dim);
- conv: (N, C_in, H, W, C_out, kernel, stride, padding), ImageNet-like stages.

Compute-heavy categories (matmul, attention, conv) run their size sweep in floating dtypes only;
other dtypes get their layouts there. Every category gets every layout that applies to it.
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

LAYOUTS: tuple[str, ...] = ("transposed", "strided", "offset", "expanded", "channels_last", "0-dim", "empty")
"""How every tensor input of a layout case is laid out: the last two dims swapped (a transposed
view), every other element of a wider buffer, one element into its storage, a broadcast of one row
(expanded), channels_last (4-D inputs only), 0-dim, and empty (a zero extent)."""

HEAVY = frozenset({"matmul", "attention", "conv"})
"""Categories whose size sweep runs in floating dtypes only."""

GUARD = 64
"""Sentinel elements on each side of an in-place or out= target, to catch writes past its end."""
