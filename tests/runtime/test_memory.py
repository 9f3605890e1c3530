"""Memory statistics of flagos: allocated/peak/reserved move by the bytes allocated and freed, and
reset_peak_memory_stats keeps live allocations (the peak restarts at the current value, not 0).

On the host backing the core counts bytes exactly; on CUDA the numbers are the CUDA caching
allocator's own (its blocks are multiples of 512 bytes, so the sizes here are too)."""

from __future__ import annotations

import gc

import pytest
import torch

MiB = 1 << 20


@pytest.fixture(autouse=True)
def _settled():
    gc.collect()
    torch.flagos.synchronize()
    yield


def test_allocation_and_free_move_allocated_by_their_size():
    before = torch.flagos.memory_allocated()
    a = torch.empty(MiB // 4, device="flagos")  # 1 MiB of float32
    assert torch.flagos.memory_allocated() - before == MiB
    b = torch.empty(2 * MiB, dtype=torch.uint8, device="flagos")
    assert torch.flagos.memory_allocated() - before == 3 * MiB
    del a
    assert torch.flagos.memory_allocated() - before == 2 * MiB
    del b
    assert torch.flagos.memory_allocated() == before


def test_views_allocate_nothing():
    x = torch.empty(MiB // 4, device="flagos")
    before = torch.flagos.memory_allocated()
    views = [x[1:], x.view(2, -1), x.t(), x[::2], x.unsqueeze(0).expand(3, -1)]
    assert torch.flagos.memory_allocated() == before
    del views
    assert torch.flagos.memory_allocated() == before


def test_op_results_are_counted():
    x = torch.ones(MiB // 4, device="flagos")
    before = torch.flagos.memory_allocated()
    y = x * 2  # one new 1 MiB result; temporaries of the route are not counted twice
    assert torch.flagos.memory_allocated() - before == MiB
    y.add_(1)  # in place: nothing new
    assert torch.flagos.memory_allocated() - before == MiB
    z = y.cpu()  # a host copy is not flagos memory
    assert torch.flagos.memory_allocated() - before == MiB
    del y, z
    assert torch.flagos.memory_allocated() == before


def test_peak_and_reset_keep_live_allocations():
    keep = torch.empty(MiB // 4, device="flagos")
    base = torch.flagos.memory_allocated()
    torch.flagos.reset_peak_memory_stats()
    assert torch.flagos.max_memory_allocated() == base, "after a reset the peak is what is live, not 0"
    temp = torch.empty(MiB, device="flagos")  # 4 MiB, then freed
    del temp
    assert torch.flagos.memory_allocated() == base
    assert torch.flagos.max_memory_allocated() == base + 4 * MiB
    torch.flagos.reset_peak_memory_stats()
    assert torch.flagos.max_memory_allocated() == base
    stats = torch.flagos.memory_stats()
    assert stats["allocated_bytes.all.peak"] == stats["allocated_bytes.all.current"] == base
    del keep


def test_reserved_covers_allocated():
    x = torch.empty(MiB, device="flagos")
    assert torch.flagos.memory_reserved() >= torch.flagos.memory_allocated() > 0
    assert torch.flagos.max_memory_reserved() >= torch.flagos.memory_reserved()
    del x
    torch.flagos.empty_cache()


def test_memory_stats_keys_and_counters():
    stats = torch.flagos.memory_stats()
    for key in (
        "allocated_bytes.all.current",
        "allocated_bytes.all.peak",
        "allocated_bytes.all.allocated",
        "allocated_bytes.all.freed",
        "reserved_bytes.all.current",
        "active_bytes.all.current",
        "allocation.all.current",
        "num_ooms",
    ):
        assert key in stats, key
    torch.flagos.reset_accumulated_memory_stats()
    x = torch.empty(MiB // 4, device="flagos")
    del x
    stats = torch.flagos.memory_stats()
    assert stats["allocated_bytes.all.allocated"] >= MiB
    assert stats["allocated_bytes.all.freed"] >= MiB
    assert stats["allocation.all.allocated"] >= 1


def test_accelerator_memory_api_agrees():
    x = torch.empty(MiB, device="flagos")
    if hasattr(torch.accelerator, "memory_allocated"):
        assert torch.accelerator.memory_allocated() == torch.flagos.memory_allocated()
        assert torch.accelerator.max_memory_allocated() == torch.flagos.max_memory_allocated()
        assert torch.accelerator.memory_reserved() == torch.flagos.memory_reserved()
        assert torch.accelerator.memory_stats()["allocated_bytes.all.current"] == torch.flagos.memory_allocated()
    free, total = torch.flagos.mem_get_info()
    assert 0 < free <= total
    del x


def test_autograd_saved_tensors_freed_after_backward():
    warm = torch.randn(256, 256, device="flagos", requires_grad=True)
    (warm @ warm).relu().sum().backward()  # a BLAS library may keep a workspace from its first call
    del warm
    gc.collect()
    before = torch.flagos.memory_allocated()
    w = torch.randn(256, 256, device="flagos", requires_grad=True)
    loss = (w @ w).relu().sum()
    loss.backward()
    del loss
    gc.collect()
    # what remains: w and its gradient
    assert torch.flagos.memory_allocated() - before == 2 * 256 * 256 * 4
    del w
    assert torch.flagos.memory_allocated() == before


@pytest.mark.two_devices
def test_devices_are_counted_separately():
    before0, before1 = torch.flagos.memory_allocated(0), torch.flagos.memory_allocated(1)
    x = torch.empty(MiB // 4, device="flagos:1")
    assert torch.flagos.memory_allocated(1) - before1 == MiB
    assert torch.flagos.memory_allocated(0) == before0
    assert torch.flagos.memory_allocated("flagos:1") == torch.flagos.memory_allocated(1)
    y = x + 1  # results stay on their device
    assert torch.flagos.memory_allocated(1) - before1 == 2 * MiB
    del x, y
    assert torch.flagos.memory_allocated(1) == before1


@pytest.mark.backing_cuda
def test_cuda_statistics_are_the_caching_allocators():
    x = torch.empty(MiB, device="flagos")
    assert torch.flagos.memory_allocated() == torch.cuda.memory_allocated()
    assert torch.flagos.memory_reserved() == torch.cuda.memory_reserved()
    y = torch.empty(MiB, device="cuda")
    assert torch.flagos.memory_allocated() == torch.cuda.memory_allocated()
    del x, y
