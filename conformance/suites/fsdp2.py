"""fsdp2: fully_shard (FSDP2) on a flagos device mesh trains like undistributed training.

Same launcher as ddp (dist_worker.py): each rank shards a small model over a flagos mesh, checks
that its local shards live on flagos, trains, and compares the losses with the model trained
without sharding on the global batch.
"""

from __future__ import annotations

from typing import Any

import pytest

from torch_fl.conformance.launch import run_ranks
from torch_fl.conformance.suites.ddp import TIMEOUT_S, check, require, world_size

SUITE = "fsdp2"


@pytest.mark.fl_timeout(TIMEOUT_S + 60)
def test_fsdp2_training(fl: Any) -> None:
    require(fl, SUITE)
    results = run_ranks("torch_fl.conformance.dist_worker", SUITE, world_size(), TIMEOUT_S)
    check(results, "fsdp2_training")
    fl.note(f"{len(results)} ranks, backend {results[0].get('backend', '?')}")
