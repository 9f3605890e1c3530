"""Generated calls of one aten overload for the sweep suite: its category, its arguments by schema.

An overload's category (conformance/sizes.py) comes from its tags (pointwise, reduction) or, for
the compute-heavy families, from CATEGORY_BY_PACKET. Its arguments are filled by schema: tensors
by role (name) from the category's dims, required numbers and flags by name; an argument nothing
here knows how to fill makes the overload `not swept`, with that reason. Arguments that pick
another code path (SELECTORS) take each of their values in cases of their own (`selector_variants`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

CATEGORY_BY_PACKET: dict[str, str] = {
    **dict.fromkeys(
        ("mm", "bmm", "addmm", "baddbmm", "mv", "addmv", "linear", "matmul", "dot", "_scaled_mm"), "matmul"
    ),
    **dict.fromkeys(
        (
            "native_layer_norm",
            "layer_norm",
            "_softmax",
            "_log_softmax",
            "softmax",
            "log_softmax",
            "rms_norm",
            "_fused_rms_norm",
            "native_layer_norm_backward",
        ),
        "norm",
    ),
    **dict.fromkeys(
        (
            "_scaled_dot_product_flash_attention_for_cpu",
            "_scaled_dot_product_efficient_attention",
            "_scaled_dot_product_flash_attention",
            "scaled_dot_product_attention",
        ),
        "attention",
    ),
    **dict.fromkeys(("convolution", "conv2d", "_convolution"), "conv"),
    **dict.fromkeys(("cumsum", "cumprod", "logcumsumexp"), "reduction"),  # scans along the last dim
    "_to_copy": "elementwise",
}
"""Packets whose category their tags do not say (aten tags only pointwise ops and reductions)."""

NOT_SWEPT_TAGS = {
    "nondeterministic_seeded": "random: the ops and rng suites check it for reproducibility under a seed",
    "dynamic_output_shape": "its output shape depends on the values: the ops suite checks it",
}


SELECTORS: dict[str, tuple[Any, ...]] = {
    "keepdim": (False, True),
    "dim": (-1, 0),  # of a reduction: along rows, and across them
    "rounding_mode": (None, "trunc", "floor"),
    "approximate": ("none", "tanh"),
    "unbiased": (True, False),
    "correction": (None, 0),
    "is_causal": (False, True),
}
"""Arguments that pick another code path -> their values; the first is the plain call's (the
schema's default, or the value `build` fills a required one with)."""


class NotSwept(Exception):
    """The overload has no generator here; the message says why."""


def category(overload: torch._ops.OpOverload) -> str:
    """The overload's category, or NotSwept with the reason it has none."""
    packet = overload._schema.name.split("::", 1)[1]
    if packet in CATEGORY_BY_PACKET:
        return CATEGORY_BY_PACKET[packet]  # attention is tagged random for its dropout; swept with none
    for tag, why in NOT_SWEPT_TAGS.items():
        if getattr(torch.Tag, tag, None) in overload.tags:
            raise NotSwept(why)
    if torch.Tag.pointwise in overload.tags:
        return "elementwise"
    if getattr(torch.Tag, "reduction", None) in overload.tags:
        return "reduction"
    raise NotSwept("no sweep generator for its family (not pointwise, not a reduction, not in CATEGORY_BY_PACKET)")


def _matmul_shapes(packet: str, dims: tuple[int, ...]) -> dict[str, tuple[int, ...]]:
    m, n, k = dims
    b = 2
    return {
        "mm": {"self": (m, k), "mat2": (k, n)},
        "_scaled_mm": {"self": (m, k), "mat2": (k, n), "scale_a": (), "scale_b": ()},
        "matmul": {"self": (m, k), "other": (k, n)},
        "addmm": {"self": (m, n), "mat1": (m, k), "mat2": (k, n)},
        "bmm": {"self": (b, m, k), "mat2": (b, k, n)},
        "baddbmm": {"self": (b, m, n), "batch1": (b, m, k), "batch2": (b, k, n)},
        "mv": {"self": (m, k), "vec": (k,)},
        "addmv": {"self": (m,), "mat": (m, k), "vec": (k,)},
        "linear": {"input": (m, k), "weight": (n, k), "bias": (n,)},
        "dot": {"self": (k,), "tensor": (k,)},
    }.get(packet, {})


def tensor_shapes(cat: str, packet: str, dims: tuple[int, ...]) -> Callable[[str], tuple[int, ...] | None]:
    """role name -> the shape of that tensor argument (None: this category has no such role)."""
    if cat == "elementwise":
        return lambda name: dims
    if cat == "reduction":
        return lambda name: dims
    if cat == "matmul":
        table = _matmul_shapes(packet, dims)
        return table.get
    if cat == "norm":
        per_row = dims[:-1] + (1,)  # a layer norm's saved mean and rstd
        return lambda name: dims[-1:] if name in ("weight", "bias") else per_row if name in ("mean", "rstd") else dims
    if cat == "attention":
        return lambda name: dims if name in ("query", "key", "value") else None
    if cat == "conv":
        n, c, h, w, c_out, kernel, _, _ = dims
        return {"input": (n, c, h, w), "weight": (c_out, c, kernel, kernel), "bias": (c_out,)}.get
    raise AssertionError(cat)


def _number(name: str, cat: str, dims: tuple[int, ...]) -> Any:
    """A required non-tensor argument, by name; NotSwept when nothing here knows it."""
    if cat == "conv":
        stride, padding = dims[6], dims[7]
        known = {
            "stride": [stride, stride],
            "padding": [padding, padding],
            "dilation": [1, 1],
            "transposed": False,
            "output_padding": [0, 0],
            "groups": 1,
        }
        if name in known:
            return known[name]
    table = {
        **{selector: values[0] for selector, values in SELECTORS.items()},
        "half_to_float": False,
        "eps": 1e-5,
        "dropout_p": 0.0,
        "compute_log_sumexp": False,
        "return_debug_mask": False,
        "normalized_shape": [dims[-1]],
        "output_mask": [True, True, True],
    }
    if name in table:
        return table[name]
    raise NotSwept(f"required argument {name!r}: no sweep value for it")


def selector_variants(overload: torch._ops.OpOverload, cat: str) -> list[dict[str, Any]]:
    """One {argument: value} per value other than the plain one of each selector the overload takes
    (SELECTORS), in schema order; `dim` only for reductions (a norm normalises the last dim)."""
    return [
        {arg.name: value}
        for arg in overload._schema.arguments
        if arg.name in SELECTORS and (arg.name != "dim" or cat == "reduction")
        for value in SELECTORS[arg.name][1:]
    ]


@dataclass
class Call:
    """One generated call: arguments with flagos tensors made by `make`, and where its outputs go."""

    args: list[Any]
    kwargs: dict[str, Any]
    out_slots: list[tuple[int | None, str]] = field(default_factory=list)  # (position, name) of out= tensors
    inplace: bool = False  # the first argument is written and returned


def writes_self(overload: torch._ops.OpOverload) -> bool:
    """Whether the overload is in place: its first (positional) argument is written."""
    first = overload._schema.arguments[0] if overload._schema.arguments else None
    if first is None or first.kwarg_only or first.alias_info is None:
        return False
    return bool(first.alias_info.is_write)


Maker = Callable[[str, tuple[int, ...]], torch.Tensor]


def build(
    overload: torch._ops.OpOverload, cat: str, dims: tuple[int, ...], make: Maker, extra: dict[str, Any] | None = None
) -> Call:
    """The call of `overload` at `dims`: tensors from make(role, shape), out= tensors left None."""
    packet = overload._schema.name.split("::", 1)[1]
    shape_of = tensor_shapes(cat, packet, dims)
    call = Call([], {}, inplace=writes_self(overload))
    extra = dict(extra or {})
    by_name = False  # once an optional positional argument is left out, later ones go by name
    for arg in overload._schema.arguments:
        kind = str(getattr(arg, "real_type", arg.type))
        if arg.kwarg_only and arg.alias_info is not None and arg.alias_info.is_write:
            call.out_slots.append((None, arg.name))
            call.kwargs[arg.name] = None
            continue
        if arg.name in extra:
            value = extra.pop(arg.name)
        elif kind in ("Tensor", "Optional[Tensor]") and (not arg.has_default_value() or shape_of(arg.name)):
            shape = shape_of(arg.name)
            if shape is None:
                raise NotSwept(f"tensor argument {arg.name!r}: no shape for it in the {cat} generator")
            value = make(arg.name, shape)
        elif arg.has_default_value() and not (cat == "reduction" and arg.name == "dim"):
            by_name = True
            continue  # defaults are the plain call; a reduction is swept over its last dim
        elif kind == "Scalar":
            value = 2
        else:
            value = _number(arg.name, cat, dims)
        if arg.kwarg_only or by_name:
            call.kwargs[arg.name] = value
        else:
            call.args.append(value)
    if extra:
        raise NotSwept(f"no argument named {sorted(extra)}")
    return call
