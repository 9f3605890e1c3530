"""workload: each route a training step reaches, forced alone, must train the model as native does.

The ops suite checks kernels on OpInfo's samples, which are a few elements large and mostly 1- or
2-D. A kernel can pass them and still fail on a model's activations. Measured on the H200:
FlagGems 5.0.2's `native_layer_norm_backward` counts rows as the input's first dimension. On a
(batch, seq, dim) activation it normalises across seq * dim and writes the weight and bias
gradients out of bounds. That gave NaN losses at 7.5 M parameters and an illegal memory access at
435 M, after it had passed every OpInfo sample.

Here the decoder of torch_fl/workloads/decoder.py (tiny config; bfloat16 on a device backing,
float32 on the host) first trains a few steps on the native routes. Then it trains again once for
every (overload it reached, other candidate path), with that overload forced onto that path. Each
such run is case `workload/<path>/<overload>`: a route whose losses depart from native's, or whose
run crashes, is vetoed for every gate key it ran with. A run that trains proves nothing by itself
(losses agree only loosely): the keys it reached still need the ops suite's cases.
"""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch

from torch_fl.conformance.watch import Watch
from torch_fl.routing.constraints import refusal
from torch_fl.workloads import decoder

SUITE = "workload"
STEPS = 3
# bfloat16 kernels may round differently from the native ones; the first steps must still agree.
RTOL = {"cpu": 1e-4}
DEVICE_RTOL = 2e-2


def _train(dtype: torch.dtype) -> list[float]:
    return decoder.train(decoder.CONFIGS["tiny"], "flagos", STEPS, dtype)


def _departure(losses: list[float], reference: list[float]) -> float:
    if not all(math.isfinite(x) for x in losses):
        return math.inf
    return max(abs(a - b) / max(abs(b), 1e-6) for a, b in zip(losses, reference))


@pytest.mark.fl_timeout(3600)
def test_each_route_trains_the_decoder(fl: Any) -> None:
    fl.own_cases()
    dtype = torch.float32 if fl.backing == "cpu" else torch.bfloat16
    watch = Watch(focus=None)
    with watch:
        reference = _train(dtype)
    assert all(math.isfinite(x) for x in reference), f"the native routes give non-finite losses: {reference}"
    rtol = RTOL.get(fl.backing, DEVICE_RTOL)
    for op in watch.seen:
        for path in fl.candidates(op):
            if path == "native" or not fl.implements(op, path) or refusal(op, path):
                continue
            case_id = f"{SUITE}/{path}/{op}"
            if fl.done(case_id):
                continue
            with fl.case(case_id, SUITE, op=op, dtype=str(dtype).removeprefix("torch."), path=path) as case:
                case.vetoes_only = True
                with fl.forced(op, path):
                    losses = _train(dtype)  # each loss read waits for the device: a fault surfaces here
                worst = _departure(losses, reference)
                assert worst <= rtol, (
                    f"with {op} on {path} the decoder's losses depart from native's by {worst:.2e} "
                    f"(rtol {rtol:g}): {[round(x, 5) for x in losses]} vs {[round(x, 5) for x in reference]}"
                )
                case.notes.append(f"largest relative departure from native {worst:.1e}")
