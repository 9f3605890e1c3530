"""model: a small decoder-only transformer trains 20 steps on flagos like on the reference device.

The reference device is the backing device without flagos: the CPU, in this process, for a host
backing; for a CUDA backing, CUDA in a subprocess that never imports torch_fl (see
torch_fl/workloads/decoder.py for why). The losses must agree step by step and go down.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from torch_fl.conformance.launch import run_script
from torch_fl.workloads import decoder

SUITE = "model"
STEPS = 20
RTOL = {"cpu": 1e-4, "cuda": 2e-3}


def reference_losses(backing: str) -> list[float]:
    if backing == "cpu":
        return decoder.train(decoder.CONFIGS["tiny"], "cpu", STEPS)
    env = {"FLAGOS_PLATFORM": None, "TORCH_DEVICE_BACKEND_AUTOLOAD": "0"}
    return run_script(Path(decoder.__file__), [backing, str(STEPS), "tiny"], env, timeout=600)["losses"]


@pytest.mark.fl_timeout(900)
def test_decoder_trains_like_the_reference(fl: Any) -> None:
    losses = decoder.train(decoder.CONFIGS["tiny"], "flagos", STEPS)
    reference = reference_losses(fl.backing)
    rtol = RTOL.get(fl.backing, 2e-3)
    worst = max(abs(a - b) / max(abs(b), 1e-6) for a, b in zip(losses, reference))
    fl.note(f"losses {losses[0]:.4f} -> {losses[-1]:.4f}; largest relative difference from {fl.backing}: {worst:.2e}")
    assert len(losses) == len(reference) == STEPS
    assert worst <= rtol, (
        f"losses differ from the {fl.backing} reference by up to {worst:.2e} (rtol {rtol:g}): "
        f"flagos {[round(x, 5) for x in losses]} vs {[round(x, 5) for x in reference]}"
    )
    assert losses[-1] < 0.8 * losses[0], f"the model did not train: loss {losses[0]:.4f} -> {losses[-1]:.4f}"
