"""The tuner's decision: an op gets buckets only when its net gain over the workload is positive."""
from __future__ import annotations

import torch

from torch_fl.routing.tuner import Measurement, bucket_bound, decide, tune


def m(op, bound, calls, native, other):
    return Measurement(op=op, bound=bound, dtype="float32", calls=calls, us={"native": native, "flaggems": other})


def test_bucket_bounds_are_powers_of_two():
    assert [bucket_bound(n) for n in (0, 1, 3, 4, 1000)] == [1, 1, 4, 4, 1024]


def test_a_clear_win_is_chosen():
    chosen = decide([m("aten::mm", 1 << 20, 10, 100.0, 50.0)], overhead_us=5.0, min_gain=0.05)
    assert [b.choice for b in chosen["aten::mm"]] == ["flaggems"]


def test_losses_everywhere_keep_native():
    assert decide([m("aten::add.Tensor", 1024, 100, 10.0, 140.0)], overhead_us=5.0, min_gain=0.05) == {}


def test_python_overhead_on_the_native_calls_can_cancel_a_win():
    # one bucket wins by 10 us on 1 call, the other bucket's 100 native calls would each pay 5 us
    ms = [m("aten::mm", 64, 100, 10.0, 30.0), m("aten::mm", 1 << 20, 1, 100.0, 90.0)]
    assert decide(ms, overhead_us=5.0, min_gain=0.05) == {}
    chosen = decide(ms, overhead_us=0.01, min_gain=0.05)
    assert [b.choice for b in chosen["aten::mm"]] == ["native", "flaggems"]


def test_tune_on_host_keeps_native_and_says_why(fresh_routes):
    from torch_fl.workloads.decoder import CONFIGS, build

    _, _, step = build(CONFIGS["tiny"], "flagos", torch.float32)
    report = tune(fresh_routes, step, "tiny", steps=1)
    assert report.kept is False and report.chosen == {}
    assert report.step_ms_native > 0 and report.note
