"""The sweep suite's table and generators, without a platform: what sizes, layouts and calls it makes."""

from __future__ import annotations

import math

import pytest
import torch

from torch_fl.conformance.sizes import (
    DIM_SWEEPS,
    ELEMENTWISE_NUMELS,
    LAYOUTS,
    MIXED_SIZES,
    SIZED_LAYOUTS,
    SIZES,
)
from torch_fl.conformance.suites.sweep import specs
from torch_fl.conformance.sweepcall import plan_tensor
from torch_fl.conformance.sweepgen import NotSwept, build, category, selector_variants
from torch_fl.routing.gatekey import SIZE_CLASSES, size_class

ALL_CLASSES = {name for name, _ in SIZE_CLASSES}


def test_elementwise_sizes_reach_every_size_class_around_powers_of_two():
    assert {size_class(n) for n in ELEMENTWISE_NUMELS} == ALL_CLASSES
    assert {size_class(n[0]) for n in MIXED_SIZES["elementwise"]} == ALL_CLASSES
    assert {2**20 - 1, 2**20, 2**20 + 1} <= set(ELEMENTWISE_NUMELS)


def test_the_heavy_categories_reach_the_promised_extents():
    assert max(r for _, r in SIZES["reduction"]) >= 65536 and max(rows for rows, _ in SIZES["reduction"]) >= 4096
    for axis in range(3):
        assert max(d[axis] for d in SIZES["matmul"]) >= 4096
    assert any(any(e % 8 for e in d) for d in SIZES["matmul"] if max(d) >= 4096)
    assert {d for *_, s, d in SIZES["attention"] if s >= 2048} == {64, 128}
    assert any(d[1:4] == (3, 224, 224) for d in SIZES["conv"])
    assert max(d[1] for d in SIZES["norm"]) >= 2048


def _lines(cases: tuple[tuple[int, ...], ...]) -> dict[tuple[int, ...], list[int]]:
    """The other dims a one-dimension sweep holds -> its extents along the dim it varies (by rank:
    the dim whose extent changes most)."""
    lines: dict[tuple[int, ...], list[int]] = {}
    for rank in {len(d) for d in cases}:
        same_rank = [d for d in cases if len(d) == rank]
        axis = max(range(rank), key=lambda i: len({d[i] for d in same_rank}))
        for d in same_rank:
            lines.setdefault(d[:axis] + (-1,) + d[axis + 1 :], []).append(d[axis])
    return lines


def test_one_dimension_sweeps_vary_one_dim_around_powers_of_two_up_to_realistic_extents():
    top = {"reduction": {"reduced": 2**20}, "matmul": dict.fromkeys("KMN", 8192), "attention": {"seq": 8192}}
    for cat, sweeps in DIM_SWEEPS.items():
        for varied, cases in sweeps.items():
            lines = _lines(cases)
            assert len(lines) <= 2, (cat, varied, lines)  # one dim varies; the others stay put...
            for held, extents in lines.items():
                assert all(e <= 33 or e in (64, 128) for e in held), (cat, varied, held)  # ...small (head dims)
                assert {2**12 - 1, 2**12, 2**12 + 1} <= set(extents), (cat, varied)  # around powers of two
                assert max(extents) > top.get(cat, {}).get(varied, 2**12), (cat, varied)
    hidden = DIM_SWEEPS["norm"]["hidden"]
    assert {len(d) for d in hidden if d[-1] > 16384} == {2, 3}  # long rows of 2-D and 3-D inputs alike
    seq = DIM_SWEEPS["attention"]["seq"]
    assert {d[3] for d in seq if d[2] > 8192} == {64, 128} and {d[:2] for d in seq} == {(1, 1)}


def test_one_dimension_sweeps_are_size_cases_of_their_own_without_repeats():
    from torch_fl.kernels.base import resolve

    mm = specs("aten::mm", resolve("aten::mm"), "matmul", torch.float32)
    assert "vary=K,size=17x33x8193" in {s.name for s in mm} and all(s.guarded for s in mm if s.name.startswith("vary="))
    mv = [s.name for s in specs("aten::mv", resolve("aten::mv"), "matmul", torch.float32)]
    assert sum(n.startswith("vary=N,") for n in mv) == 1, mv  # a matrix-vector product has no N: no repeats
    integer = specs("aten::mm", resolve("aten::mm"), "matmul", torch.int32)
    assert not any(s.name.startswith("vary=") for s in integer)  # compute-heavy: floating dtypes only


def test_selector_values_run_at_every_size_case():
    from torch_fl.kernels.base import resolve

    for op, cat, selectors in (
        ("aten::sum.dim_IntList", "reduction", ["dim=0", "keepdim=True"]),
        ("aten::gelu", "elementwise", ["approximate=tanh"]),
        ("aten::div.Tensor_mode", "elementwise", ["rounding_mode=trunc", "rounding_mode=floor"]),
    ):
        overload = resolve(op)
        cases = {s.name: s for s in specs(op, overload, cat, torch.float32)}
        sized = [s for n, s in cases.items() if n.startswith(("size=", "vary=")) and "=" not in n.split("size=")[1]]
        assert len(sized) == len(SIZES[cat]) + sum(map(len, DIM_SWEEPS.get(cat, {}).values())), op  # sweeps too
        for plain in sized:
            for words in selectors:
                variant = cases[f"{plain.name},{words}"]
                assert variant.dims == plain.dims and variant.guarded, (op, variant)
                key, value = words.split("=")
                assert str(variant.extra[key]) == value
    mean = {s.name for s in specs("aten::mean.dim", resolve("aten::mean.dim"), "reduction", torch.int32)}
    assert {"layout=0-dim,keepdim=True", "mixed:dtype=float32,size=3x255,keepdim=True"} <= mean  # keys of their own
    div = build(torch.ops.aten.div.Tensor_mode, "elementwise", (5,), lambda role, shape: shape)
    assert div.kwargs == {"rounding_mode": None}  # the plain call: true division
    assert selector_variants(torch.ops.aten._softmax.default, "norm") == []  # a norm's dim is the last one


def test_elementwise_layouts_run_at_every_size_class():
    from torch_fl.kernels.base import resolve

    cases = specs("aten::abs", resolve("aten::abs"), "elementwise", torch.int32)
    for layout in SIZED_LAYOUTS:
        laid = [s for s in cases if s.layout == layout]
        assert {size_class(math.prod(s.dims)) for s in laid} == ALL_CLASSES, layout
        assert f"layout={layout}" in {s.name for s in laid}  # the small case keeps its name


def test_other_devices_run_a_sample_with_either_current_device():
    from torch_fl.kernels.base import resolve

    def on_others(devices, op="aten::add.Tensor", cat="elementwise", dtype=torch.float32):
        return [s for s in specs(op, resolve(op), cat, dtype, devices) if s.device is not None]

    assert on_others(1) == []
    two = on_others(2)
    assert [(s.device, s.current) for s in two] == [(1, 0)] * 3 + [(1, 1)] * 3
    assert {s.name for s in two} >= {"device=1,current=0,layout=transposed", "device=1,current=1,size=65x65"}
    assert {s.place for s in two} == {"flagos:1"} and len(on_others(3)) == 12
    assert {s.layout for s in on_others(2, "aten::mm", "matmul", torch.int32)} == {"transposed"}  # no int sizes


@pytest.mark.parametrize(
    ("cat", "op"),
    [("elementwise", "add.Tensor"), ("reduction", "sum.dim_IntList"), ("matmul", "mm"), ("norm", "native_layer_norm")],
)
def test_case_names_are_unique_and_the_plain_size_cases_come_first(cat, op):
    from torch_fl.kernels.base import resolve

    cases = specs(f"aten::{op}", resolve(f"aten::{op}"), cat, torch.float32, devices=2)
    names = [s.name for s in cases]
    assert len(names) == len(set(names))
    assert names[: len(SIZES[cat])] == [f"size={'x'.join(map(str, d))}" for d in SIZES[cat]]  # ids kept


@pytest.mark.parametrize(
    ("op", "expected"),
    [
        ("abs", "elementwise"),
        ("add.Tensor", "elementwise"),
        ("sum.dim_IntList", "reduction"),
        ("mm", "matmul"),
        ("native_layer_norm", "norm"),
        ("native_layer_norm_backward", "norm"),
        ("_softmax", "norm"),
        ("convolution", "conv"),
        ("_to_copy", "elementwise"),
    ],
)
def test_category(op, expected):
    from torch_fl.kernels.base import resolve

    assert category(resolve(f"aten::{op}")) == expected


def test_random_ops_are_not_swept_and_say_why():
    with pytest.raises(NotSwept, match="random"):
        category(torch.ops.aten.bernoulli.default)


def test_build_fills_the_schema():
    def make(role, shape):
        return (role, shape)

    inplace = build(torch.ops.aten.add_.Tensor, "elementwise", (5,), make)
    assert inplace.inplace and inplace.args == [("self", (5,)), ("other", (5,))]
    out = build(torch.ops.aten.add.out, "elementwise", (5,), make)
    assert out.out_slots == [(None, "out")] and not out.inplace
    conv = build(torch.ops.aten.convolution.default, "conv", (1, 3, 224, 224, 64, 7, 2, 3), make)
    assert conv.args[0] == ("input", (1, 3, 224, 224)) and conv.args[1] == ("weight", (64, 3, 7, 7))
    assert conv.args[3:] == [[2, 2], [3, 3], [1, 1], False, [0, 0], 1]
    reduced = build(torch.ops.aten.sum.dim_IntList, "reduction", (3, 7), make, {"dtype": torch.int64})
    assert reduced.args[1] == -1 and reduced.kwargs == {"dtype": torch.int64}


def test_layouts_make_the_strides_they_name():
    g = torch.Generator().manual_seed(0)

    def laid(layout, shape=(4, 6)):
        planned, applied = plan_tensor(shape, torch.int32, layout, False, g)
        assert applied, layout
        return planned.view(planned.base)

    assert laid("transposed").stride() == (1, 4)
    assert laid("strided").stride() == (12, 2)
    assert laid("offset").storage_offset() == 1
    assert laid("expanded").stride()[0] == 0
    assert laid("channels_last", (2, 3, 4, 5)).is_contiguous(memory_format=torch.channels_last)
    assert laid("0-dim").dim() == 0 and laid("empty").numel() == 0
    guarded, _ = plan_tensor((3, 5), torch.float32, None, True, g)
    assert guarded.guarded and guarded.view(guarded.base).storage_offset() > 0


def test_every_dtype_gets_every_layout_and_integers_get_dtype_mixes():
    names = {s.name for s in specs("aten::sum.dim_IntList", torch.ops.aten.sum.dim_IntList, "reduction", torch.int32)}
    assert {f"layout={layout}" for layout in LAYOUTS if layout != "channels_last"} <= names
    assert any(n.startswith("mixed:dtype=float32") for n in names)
    mm = {s.name for s in specs("aten::mm", torch.ops.aten.mm.default, "matmul", torch.int32)}
    assert not any(n.startswith("size=") for n in mm) and "layout=transposed" in mm  # integer matmul: layouts only


def test_a_layer_norm_backward_gets_per_row_statistics():
    def make(role, shape):
        return (role, shape)

    call = build(torch.ops.aten.native_layer_norm_backward.default, "norm", (2, 2048, 1024), make)
    shapes = dict(a for a in call.args if isinstance(a, tuple))
    assert shapes["grad_out"] == shapes["input"] == (2, 2048, 1024) and shapes["mean"] == shapes["rstd"] == (2, 2048, 1)
    assert shapes["weight"] == (1024,) and call.args[-1] == [True, True, True]


@pytest.mark.parametrize(
    ("category_name", "op"),
    [
        ("reduction", "sum.dim_IntList"),
        ("matmul", "mm"),
        ("matmul", "addmm"),
        ("norm", "native_layer_norm"),
        ("attention", "_scaled_dot_product_flash_attention_for_cpu"),
        ("conv", "convolution"),
    ],
)
def test_every_category_reaches_every_size_class_by_its_largest_argument(category_name, op):
    from torch_fl.kernels.base import resolve

    shapes: list[tuple[int, ...]] = []
    classes = set()
    for dims in SIZES[category_name]:
        shapes.clear()
        build(resolve(f"aten::{op}"), category_name, dims, lambda role, shape: shapes.append(shape))
        classes.add(size_class(max(math.prod(s) for s in shapes)))
    assert classes == ALL_CLASSES, (op, classes)


# ---- special values
def test_every_category_gets_special_cases_last_at_two_size_classes():
    from torch_fl.kernels.base import resolve

    for cat, op in (("elementwise", "abs"), ("reduction", "argmax"), ("matmul", "mm"), ("norm", "native_layer_norm")):
        overload = resolve(f"aten::{op}")
        for dtype in (torch.float32, torch.int32):
            cases = specs(f"aten::{op}", overload, cat, dtype)
            special = [s for s in cases if s.values is not None]
            assert {s.name.split(",")[0] for s in special} == {"special=ties", "special=extremal"}, (op, dtype)
            assert cases[-len(special) :] == special  # the other cases keep their place (and names, seeds)
            classes = set()
            for spec in special:
                shapes: list[tuple[int, ...]] = []
                build(overload, cat, spec.dims, lambda role, shape, shapes=shapes: shapes.append(shape))
                classes.add(size_class(max(math.prod(s) for s in shapes)))
            assert classes == {"small", "medium"}, (op, classes)
    bools = specs("aten::abs", resolve("aten::abs"), "elementwise", torch.bool)
    assert {s.name.split(",")[0] for s in bools if s.values} == {"special=ties"}  # no extremes in bool


def _special(shape: tuple[int, ...], dtype: torch.dtype, kind: str, seed: int = 0) -> torch.Tensor:
    planned, applied = plan_tensor(shape, dtype, None, False, torch.Generator().manual_seed(seed), kind)
    assert not applied
    return planned.view(planned.base)


def test_random_values_are_unchanged_without_a_kind():
    planned, _ = plan_tensor((33, 17), torch.float32, None, False, torch.Generator().manual_seed(3))
    expected = torch.randn((33, 17), generator=torch.Generator().manual_seed(3), dtype=torch.float64).float()
    assert torch.equal(planned.base, expected)  # existing records stay comparable


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16, torch.float64])
def test_extremal_floats_hold_every_special_value(dtype):
    t = _special((65, 65), dtype, "extremal").double()
    fi = torch.finfo(dtype)
    assert t.isnan().any() and (t == math.inf).any() and (t == -math.inf).any()
    assert ((t == 0) & t.signbit()).any() and ((t == 0) & ~t.signbit()).any()
    assert ((t != 0) & (t.abs() < fi.tiny)).any(), "no subnormal"
    assert (t == fi.max).any() and (t == fi.min).any() and (t.abs() == fi.max / 2).any()
    finite = t[t.isfinite()]
    assert (finite.abs() < 10).float().mean() > 0.8  # ordinary values around them
    huge = (t.isfinite() & (t.abs() >= fi.max / 2)).double() * t.sign()  # infinities: either sign
    rows = huge.reshape(65, 65)
    assert ((rows >= 0).all(1) | (rows <= 0).all(1)).all(), "a row's huge values share a sign"
    assert torch.equal(
        _special((65, 65), dtype, "extremal", seed=1).isnan(), _special((65, 65), dtype, "extremal", 1).isnan()
    )


def test_sparse_extremal_values_have_no_huge_finite_values():
    t = _special((65, 65), torch.float32, "extremal-sparse")
    assert t.isnan().any() and t.isinf().any()
    assert t[t.isfinite()].abs().max() < 100


def test_extremal_complex_values_in_both_parts():
    t = _special((65, 65), torch.complex64, "extremal")
    assert t.real.isnan().any() and t.imag.isinf().any()


@pytest.mark.parametrize("dtype", [torch.int8, torch.int32, torch.int64, torch.uint8])
def test_extremal_integers_hold_the_extremes_and_never_trap(dtype):
    t = _special((65, 65), dtype, "extremal")
    info = torch.iinfo(dtype)
    assert (t == info.max).any()
    assert not (t == 0).any()  # x // 0 traps on the CPU...
    if info.min < 0:
        assert (t == info.min).any() and not (t == -1).any()  # ...and so does min // -1
    torch.floor_divide(t, t.flip(0))  # so the native op itself does not raise


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int32, torch.uint8, torch.bool])
def test_ties_repeat_values_and_make_all_equal_rows(dtype):
    t = _special((33, 17), dtype, "ties")
    assert t.dtype == dtype and len(t.unique()) <= 4
    assert (t[::3] == t[::3, :1]).all()  # every third row one value throughout
    if dtype != torch.bool:
        assert dtype.is_floating_point or not (t == 0).any()  # integer division by zero raises
        first = torch.argmax(t, -1)
        last = t.shape[-1] - 1 - torch.argmax(t.flip(-1), -1)
        assert (first != last).float().mean() > 0.5  # an argmax giving the last of equal values fails


def test_masks_and_scales_keep_their_ordinary_values():
    from torch_fl.conformance.suites.sweep import Spec, make_plan

    spec = Spec("special=extremal", (33, 17), values="extremal")
    plan = make_plan(torch.ops.aten.where.self, "elementwise", spec, torch.float32, 0)
    condition, *others = plan.call.args
    assert condition.base.dtype == torch.bool
    assert all(o.base.isnan().any() for o in others)
