"""The tuner's decision: an op gets buckets only where a candidate beats native at the workload's calls."""

from __future__ import annotations

import pytest
import torch

from torch_fl.routing.table import OpRoute
from torch_fl.routing.tuner import Measurement, Sample, bucket_bound, decide, disagreement, measure, tune


def m(op, bound, calls, native, other):
    return Measurement(op=op, bound=bound, dtype="float32", calls=calls, us={"native": native, "flaggems": other})


def test_bucket_bounds_are_powers_of_two():
    assert [bucket_bound(n) for n in (0, 1, 3, 4, 1000)] == [1, 1, 4, 4, 1024]


def test_a_clear_win_is_chosen():
    chosen = decide([m("aten::mm", 1 << 20, 10, 100.0, 50.0)], min_gain=0.05)
    # the sizes below the measured bucket were not measured: they stay native
    assert [(b.max_numel, b.dtype, b.choice) for b in chosen["aten::mm"]] == [
        (1 << 19, "float32", "native"),
        (1 << 20, "float32", "flaggems"),
    ]


def test_buckets_are_per_dtype():
    """Two dtypes of one op at one size are two buckets, each found only by its own dtype."""
    bf16 = Measurement("aten::_to_copy", 1 << 28, "bfloat16", 1, us={"native": 740.0, "flaggems": 490.0})
    fp32 = Measurement("aten::_to_copy", 1 << 28, "float32", 1, us={"native": 370.0, "flaggems": 460.0})
    chosen = decide([bf16, fp32], min_gain=0.05)
    route = OpRoute(candidates=["native", "flaggems"], buckets=chosen["aten::_to_copy"])
    assert route.bucket_for(1 << 28, "bfloat16").choice == "flaggems"
    assert route.bucket_for(1 << 28, "float32").choice == "native"
    assert route.bucket_for(1 << 20, "bfloat16").choice == "native"


def test_losses_everywhere_keep_native():
    assert decide([m("aten::add.Tensor", 1024, 100, 10.0, 140.0)], min_gain=0.05) == {}


def test_the_native_calls_a_bucket_leaves_cost_nothing():
    # one bucket wins by 10 us on 1 call; the other bucket's 100 native calls stay in C++ (route filter)
    ms = [m("aten::mm", 64, 100, 10.0, 30.0), m("aten::mm", 1 << 20, 1, 100.0, 90.0)]
    chosen = decide(ms, min_gain=0.05)
    assert [b.choice for b in chosen["aten::mm"]] == ["native", "flaggems"]


def test_tune_on_host_keeps_native_and_says_why(fresh_routes):
    from torch_fl.workloads.decoder import CONFIGS, build

    _, _, step = build(CONFIGS["tiny"], "flagos", torch.float32)
    report = tune(fresh_routes, step, "tiny", steps=1)
    assert report.kept is False and report.chosen == {}
    assert report.step_ms_native > 0 and report.note


class _NegKernels:
    """A kernel set with one aten::neg, right or wrong."""

    name = "vendor"

    def __init__(self, wrong: bool) -> None:
        self.wrong = wrong

    def ops(self):
        return ["aten::neg"]

    def implements(self, op: str) -> bool:
        return op == "aten::neg"

    def call(self, op, args, kwargs):
        from torch_fl.kernels.aliasing import call_on_backing

        return call_on_backing(lambda x: -x + (1 if self.wrong else 0), args, kwargs)


@pytest.mark.parametrize("wrong", [False, True], ids=["right", "wrong"])
def test_a_candidate_must_agree_with_native_at_the_workload_shape(fresh_routes, monkeypatch, wrong):
    monkeypatch.setitem(fresh_routes.kernel_sets, "vendor", _NegKernels(wrong))
    x = torch.randn(64, 32).to("flagos")
    sample = Sample(
        "aten::neg", torch.ops.aten.neg.default, bucket_bound(x.numel()), "float32", "float32@small", (x,), {}, calls=3
    )
    result = measure(sample, ["vendor", "native"])
    assert "native" in result.us and result.first_call_s.keys() == {"native", "vendor"}
    if wrong:
        assert "vendor" not in result.us and "wrong values at this shape" in result.errors["vendor"]
        assert result.best() == "native"
    else:
        assert "vendor" in result.us and not result.errors


def test_disagreement_names_nan_and_shape():
    a = torch.ones(4)
    assert disagreement(a, a.clone(), [a]) is None
    assert "1/4 elements differ" in disagreement(torch.tensor([1.0, float("nan"), 1, 1]), a, [a])
    assert disagreement(torch.tensor([1.0, float("nan")]), torch.tensor([1.0, float("nan")]), [a]) is None
    assert "shape [2]" in disagreement(torch.ones(2), a, [a])
    assert disagreement(torch.arange(3), torch.arange(3) + 1, [a]) == "result 0: values differ from native"


def test_isolated_measurement_takes_samples_with_memory_formats(fresh_routes):
    """torch.save cannot pickle a memory format; recorded zeros_like/clone calls carry one."""
    from torch_fl.routing.tuner_worker import measure_isolated

    x = torch.randn(16, 8).to("flagos")
    sample = Sample(
        "aten::zeros_like",
        torch.ops.aten.zeros_like.default,
        bucket_bound(x.numel()),
        "float32",
        "float32@tiny",
        (x,),
        {"memory_format": torch.preserve_format},
        calls=2,
    )
    [result] = measure_isolated([(sample, ["native"])], fresh_routes.descriptor.name)
    assert not result.errors and result.us["native"] > 0


@pytest.fixture
def vendor_neg_wins(fresh_routes, monkeypatch):
    """aten::neg routable to a right vendor kernel that measures 10x faster than native."""
    from torch_fl.routing import tuner

    monkeypatch.setattr(fresh_routes.table, "ops", dict(fresh_routes.table.ops))  # the tuner edits the table
    monkeypatch.setitem(fresh_routes.kernel_sets, "vendor", _NegKernels(False))
    monkeypatch.setattr(fresh_routes.gate, "allows", lambda op, dtype, path: True)
    fresh_routes.set_route("aten::neg", ["vendor", "native"], bypass_gate=True)
    monkeypatch.setattr(
        tuner,
        "measure",
        lambda sample, paths: Measurement(
            sample.op, sample.bound, "float32", sample.calls, us={"native": 100.0, "vendor": 10.0}
        ),
    )


@pytest.mark.parametrize("tuned_faster", [True, False], ids=["faster", "slower"])
def test_the_check_alternates_rounds_and_keeps_only_a_faster_table(
    fresh_routes, monkeypatch, vendor_neg_wins, tuned_faster
):
    """The workload is timed native-only and tuned in alternating rounds; the tuned buckets stay
    installed only when their median is faster, otherwise the table is as before."""
    from torch_fl.routing import tuner

    tuned_installed = []

    def fake_time(fn, repeats=5, inner=10):
        route = fresh_routes.table.ops.get("aten::neg")
        tuned = bool(route and route.buckets)
        tuned_installed.append(tuned)
        return (900.0 if tuned_faster else 1100.0) if tuned else 1000.0

    monkeypatch.setattr(tuner, "time_call", fake_time)
    x = torch.randn(64).to("flagos")
    before = fresh_routes.table.ops.get("aten::neg")
    report = tune(fresh_routes, lambda: torch.neg(x), "neg", steps=1, isolate=False, check_rounds=3)
    assert tuned_installed[-6:] == [False, True] * 3  # python_route_overhead's timings come first
    assert report.kept is tuned_faster and report.step_ms_native == 1.0
    route = fresh_routes.table.ops.get("aten::neg")
    if tuned_faster:
        assert report.chosen and [b.choice for b in route.buckets] == ["native", "vendor"]
    else:
        assert not report.chosen and route is before and "not faster" in report.note


@pytest.mark.parametrize("other", ["faster", "slower", "fails-tuned", "fails-native"])
def test_a_table_must_not_slow_down_the_other_steps_it_is_checked_on(fresh_routes, monkeypatch, vendor_neg_wins, other):
    """A table faster on its workload is still refused when another checked step (a zoo model) is
    slower with it or fails only with it; a step that fails native-only too is left out."""
    from torch_fl.routing import tuner

    def tuned_now() -> bool:
        route = fresh_routes.table.ops.get("aten::neg")
        return bool(route and route.buckets)

    x = torch.randn(64).to("flagos")

    def workload():
        return torch.neg(x)

    def zoo_model():
        if other == "fails-native" or (other == "fails-tuned" and tuned_now()):
            raise RuntimeError("boom")
        return torch.neg(x)

    def fake_time(fn, repeats=5, inner=10):
        if fn is zoo_model:
            return (1100.0 if other == "slower" else 900.0) if tuned_now() else 1000.0
        return 900.0 if tuned_now() else 1000.0

    monkeypatch.setattr(tuner, "time_call", fake_time)
    seen = []
    report = tune(
        fresh_routes,
        workload,
        "neg",
        steps=1,
        isolate=False,
        check_rounds=3,
        also_check={"zoo m": lambda: zoo_model},
        progress=seen.append,
    )
    assert report.kept is (other in ("faster", "fails-native"))
    assert tuned_now() is report.kept
    if other in ("faster", "slower"):
        assert report.checked_ms == {"zoo m": [1.0, 0.9 if other == "faster" else 1.1]}
    if other == "slower":
        assert "zoo m slower with it (1.100 against 1.000 ms native-only)" in report.note
    if other == "fails-tuned":
        assert "zoo m fails with it (RuntimeError: boom)" in report.note
    if other == "fails-native":
        assert report.checked_ms == {} and any("fails native-only too" in m for m in seen)


def test_a_call_without_tensors_gets_a_bucket_of_any_dtype():
    chosen = decide([Measurement("aten::ones", 1, "None", 5, us={"native": 20.0, "flaggems": 5.0})], min_gain=0.05)
    route = OpRoute(candidates=["native", "flaggems"], buckets=chosen["aten::ones"])
    assert route.bucket_for(1, None).choice == "flaggems"


def test_a_gain_within_the_noise_keeps_native():
    """15 us faster by the medians, but the rounds spread 10 us each way: not a measured win."""
    noisy = Measurement(
        "aten::mm",
        1024,
        "float32",
        10,
        us={"native": 100.0, "vendor": 85.0},
        spread_us={"native": 10.0, "vendor": 10.0},
    )
    assert decide([noisy], min_gain=0.05) == {}
    steady = Measurement(
        "aten::mm", 1024, "float32", 10, us={"native": 100.0, "vendor": 85.0}, spread_us={"native": 1.0, "vendor": 1.0}
    )
    assert [b.choice for b in decide([steady], min_gain=0.05)["aten::mm"]] == ["native", "vendor"]


def test_a_single_outlier_round_does_not_move_a_time(fresh_routes, monkeypatch):
    """One 11 ms round of native (another process took the core) leaves native's time and choice."""
    from torch_fl.routing import tuner

    monkeypatch.setitem(fresh_routes.kernel_sets, "vendor", _NegKernels(False))
    native_rounds = iter([100.0, 100.0, 11000.0] + [100.0] * 10)

    def fake_time(fn, repeats=5, inner=10):
        route = fresh_routes.plan("aten::neg").candidates
        return next(native_rounds) if route == ["native"] else 150.0

    monkeypatch.setattr(tuner, "time_call", fake_time)
    x = torch.randn(64).to("flagos")
    sample = Sample("aten::neg", torch.ops.aten.neg.default, 64, "float32", "float32@small", (x,), {}, calls=3)
    result = measure(sample, ["vendor", "native"], rounds=5)
    assert result.us == {"native": 100.0, "vendor": 150.0} and result.spread_us["native"] == 0.0
    assert decide([result], min_gain=0.05) == {}


@pytest.fixture
def vendor_neg_loses(fresh_routes, monkeypatch):
    """aten::neg with vendor first in the table, a right vendor kernel that measures 10x slower."""
    from torch_fl.routing import tuner

    monkeypatch.setattr(fresh_routes.table, "ops", dict(fresh_routes.table.ops))
    fresh_routes.table.ops["aten::neg"] = OpRoute(candidates=["vendor", "native"])
    monkeypatch.setitem(fresh_routes.kernel_sets, "vendor", _NegKernels(False))
    monkeypatch.setattr(fresh_routes.gate, "allows", lambda op, dtype, path: True)
    fresh_routes.refresh("aten::neg")
    monkeypatch.setattr(
        tuner,
        "measure",
        lambda sample, paths: Measurement(
            sample.op, sample.bound, "float32", sample.calls, us={"native": 10.0, "vendor": 100.0}
        ),
    )
    yield
    fresh_routes.table.ops.pop("aten::neg", None)
    fresh_routes.refresh("aten::neg")


def test_a_slower_vendor_first_is_demoted_and_the_report_says_so(fresh_routes, vendor_neg_loses):
    """'No candidate beat native; the table keeps native' must be what the table then serves."""
    x = torch.randn(64).to("flagos")
    report = tune(fresh_routes, lambda: torch.neg(x), "neg", steps=1, isolate=False, check_rounds=1)
    assert report.chosen == {} and report.demoted == ["aten::neg"] and report.changes_table
    assert fresh_routes.table.ops["aten::neg"].candidates == ["native", "vendor"]
    assert fresh_routes.plan("aten::neg").candidates[0] == "native"
    assert "native first now for aten::neg" in report.note


def test_gemms_are_tuned_by_default():
    import inspect

    assert inspect.signature(tune).parameters["include_gemm"].default is True


def test_the_time_budget_leaves_the_rest_as_it_was(fresh_routes, vendor_neg_loses):
    x = torch.randn(64).to("flagos")
    report = tune(fresh_routes, lambda: torch.neg(x), "neg", steps=1, isolate=False, check_rounds=1, budget_s=0)
    assert report.unmeasured == ["aten::neg <= 64"] and report.demoted == [] and not report.changes_table
    assert fresh_routes.table.ops["aten::neg"].candidates == ["vendor", "native"]
    assert "left 1 samples unmeasured" in report.note


def test_wins_the_whole_step_refuses_end_native_first_too(fresh_routes, vendor_neg_loses, monkeypatch):
    """vendor first in the table and faster per call, but the tuned step is no faster than native
    only: 'not faster than native-only' must leave native first, not the vendor order as before."""
    from torch_fl.routing import tuner

    monkeypatch.setattr(
        tuner,
        "measure",
        lambda sample, paths: Measurement(
            sample.op, sample.bound, "float32", sample.calls, us={"native": 100.0, "vendor": 10.0}
        ),
    )
    monkeypatch.setattr(
        tuner, "time_call", lambda fn, repeats=5, inner=10: 1000.0 if not _tuned(fresh_routes) else 1100.0
    )
    x = torch.randn(64).to("flagos")
    report = tune(fresh_routes, lambda: torch.neg(x), "neg", steps=1, isolate=False, check_rounds=3)
    assert not report.kept and report.demoted == ["aten::neg"] and report.changes_table
    route = fresh_routes.table.ops["aten::neg"]
    assert route.candidates == ["native", "vendor"] and not route.buckets


def _tuned(router) -> bool:
    route = router.table.ops.get("aten::neg")
    return bool(route and route.buckets)
