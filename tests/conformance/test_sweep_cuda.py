"""On the GPU board: the sweep catches FlagGems' layer-norm backward on (batch, seq, hidden) activations.

FlagGems 5.0.2's native_layer_norm_backward passes every OpInfo sample yet takes the input's first
dimension for the row count. The sweep's norm sizes are 3-D activations, so some of its gate keys
must fail on the flaggems path while native stays the reference; the run must complete.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from conformance_helpers import conformance, run_env

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.slow,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs the CUDA board (nvidia_h200)"),
]


def test_flaggems_layer_norm_backward_fails_on_transformer_activations(tmp_path: Path) -> None:
    out = conformance(
        [
            "nvidia_h200",
            "--suite",
            "sweep",
            "-k",
            "native_layer_norm_backward-float32",
            "--paths",
            "native,flaggems",
            "-n",
            "1",
            "--record-dir",
            str(tmp_path),
        ],
        run_env(),
        timeout=1800,
    )
    assert out["complete"], out
    gate = json.loads(Path(out["record"]).read_text())["gate"]
    verdicts = gate["aten::native_layer_norm_backward"]["flaggems"]
    assert "failed" in verdicts.values(), verdicts
    assert out["failures_by_path"].get("flaggems", 0) > 0 and not out["failures_by_path"].get("native"), out
