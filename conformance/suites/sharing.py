"""sharing: flagos tensors cross process boundaries through torch.multiprocessing, over the same memory.

The backing's mechanism carries them (shared memory on a host backing, CUDA IPC on a CUDA one): a
tensor sent to another process arrives there as a flagos tensor, and what that process writes into it
the sender sees. One spawned process per run, every wait bounded.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torch.multiprocessing as mp

from torch_fl.conformance import sharing_worker

SUITE = "sharing"
TIMEOUT = 45.0  # seconds; the other process imports torch and activates the platform first


@pytest.fixture(autouse=True)
def _claimed(fl: Any) -> None:
    """A claim not made is not checked: the descriptor names the platform's sharing mechanism."""
    if fl.descriptor.capabilities.sharing.mechanism == "none":
        pytest.skip("the platform does not claim a way to share tensors between processes")


def test_another_process_writes_into_the_same_memory(fl: Any) -> None:
    ctx = mp.get_context("spawn")
    queue, done = ctx.Queue(), ctx.Event()
    child = ctx.Process(target=sharing_worker.increment, args=(queue, done, TIMEOUT))
    child.start()
    try:
        tensor = torch.zeros(16, device="flagos")
        queue.put(tensor)
        assert done.wait(TIMEOUT), (
            f"the other process did not report within {TIMEOUT:.0f} s (exit code {child.exitcode})"
        )
        assert torch.equal(tensor.cpu(), torch.ones(16)), "the other process's writes are not in the sender's tensor"
    finally:
        child.join(TIMEOUT)
        if child.is_alive():
            child.kill()
    assert child.exitcode == 0, f"the other process exited with {child.exitcode}"
