"""ddp: collectives and DistributedDataParallel on flagos tensors, in separate processes.

Two ranks (one per flagos device; fewer where the board has fewer devices, since NCCL needs a
device per rank) use the flagos collective backend: gloo underneath on a host backing, NCCL on
a CUDA one. See dist_worker.py for the checks; each is one case here.
"""

from __future__ import annotations

from typing import Any

import pytest

from torch_fl.conformance.launch import run_ranks

SUITE = "ddp"
CHECKS = ("collectives", "ddp_training")
TIMEOUT_S = 240.0


def world_size() -> int:
    import torch

    return max(1, min(2, torch.flagos.device_count()))


def require(fl: Any, feature: str) -> None:
    """Skip unless the descriptor claims `feature` (a claim not made is not checked)."""
    distributed = fl.descriptor.capabilities.distributed
    if distributed.backend == "none" or feature not in distributed.features:
        pytest.skip(f"the platform does not claim distributed feature {feature!r}")


@pytest.fixture(scope="module")
def ranks(fl: Any) -> list[dict[str, Any]] | str:
    """The ranks' results, or why they could not be had (reported by each check as its failure)."""
    require(fl, SUITE)
    try:
        return run_ranks("torch_fl.conformance.dist_worker", SUITE, world_size(), TIMEOUT_S)
    except AssertionError as exc:
        return str(exc)


def check(results: list[dict[str, Any]] | str, name: str) -> None:
    assert not isinstance(results, str), results
    for rank, result in enumerate(results):
        assert "error" not in result, f"rank {rank} could not run: {result['error'].strip().splitlines()[-1]}"
        problem = result["checks"].get(name, "not run")
        assert problem is None, f"rank {rank}: {problem}"


@pytest.mark.fl_timeout(TIMEOUT_S + 60)
@pytest.mark.parametrize("name", CHECKS)
def test_ddp(name: str, ranks: list[dict[str, Any]] | str, fl: Any) -> None:
    check(ranks, name)
    fl.note(f"{len(ranks)} ranks, backend {ranks[0].get('backend', '?')}")
