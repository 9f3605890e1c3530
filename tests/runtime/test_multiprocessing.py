"""flagos tensors across processes with torch.multiprocessing: a queue carries a flagos tensor to another
process, which sees the same memory (shared memory on the host backing, CUDA IPC on a CUDA backing);
DataLoader workers yield flagos tensors; a tensor that cannot be shared fails loudly, never hangs.

Children are started with 'spawn' (as CUDA requires, and as flagos requires once initialised, see
test_lazy_init.py); every wait has a timeout."""

from __future__ import annotations

import multiprocessing
from multiprocessing.reduction import ForkingPickler

import pytest
import torch
import torch.multiprocessing as mp
from torch.utils.data import DataLoader, Dataset

from torch_fl.runtime import sharing

TIMEOUT = 120  # seconds: a spawned child imports torch and activates flagos first


def _last_device() -> torch.device:
    return torch.device("flagos", torch.flagos.device_count() - 1)


def _produce(queue: multiprocessing.Queue, done: multiprocessing.Event) -> None:
    base = torch.arange(12.0, device=_last_device()).view(3, 4)
    queue.put(base[:, 1:3])  # a strided view with a storage offset
    done.wait(TIMEOUT)  # the producer keeps the memory alive until the consumer is done


def _increment(queue: multiprocessing.Queue, done: multiprocessing.Event) -> None:
    tensor = queue.get(timeout=TIMEOUT)
    assert tensor.device.type == "flagos"
    tensor.add_(1)
    torch.flagos.synchronize()
    done.set()


def _stop(process: multiprocessing.Process) -> None:
    process.join(TIMEOUT)
    if process.is_alive():
        process.kill()
        pytest.fail("the child process hung")
    assert process.exitcode == 0, f"the child exited with {process.exitcode}"


@pytest.mark.slow  # spawned interpreters import torch
def test_a_queue_brings_a_flagos_tensor_from_another_process():
    ctx = mp.get_context("spawn")
    queue, done = ctx.Queue(), ctx.Event()
    child = ctx.Process(target=_produce, args=(queue, done))
    child.start()
    try:
        received = queue.get(timeout=TIMEOUT)
        assert received.device == _last_device()
        assert received.shape == (3, 2) and received.stride() == (4, 1)
        torch.testing.assert_close(received.cpu(), torch.arange(12.0).view(3, 4)[:, 1:3])
        del received
    finally:
        done.set()
        _stop(child)


@pytest.mark.slow  # spawned interpreters import torch
def test_the_other_process_writes_into_the_same_memory():
    ctx = mp.get_context("spawn")
    queue, done = ctx.Queue(), ctx.Event()
    child = ctx.Process(target=_increment, args=(queue, done))
    child.start()
    tensor = torch.zeros(4, device="flagos")
    queue.put(tensor)
    assert done.wait(TIMEOUT), "the child never reported back"
    _stop(child)
    torch.testing.assert_close(tensor.cpu(), torch.ones(4))


class _FlagosSquares(Dataset):
    def __len__(self) -> int:
        return 8

    def __getitem__(self, i: int) -> torch.Tensor:
        return torch.full((3,), float(i * i), device="flagos")


@pytest.mark.slow  # spawned interpreters import torch
def test_dataloader_workers_yield_flagos_tensors():
    loader = DataLoader(_FlagosSquares(), batch_size=2, num_workers=2, multiprocessing_context="spawn", timeout=TIMEOUT)
    batches = list(loader)
    assert [b.device.type for b in batches] == ["flagos"] * 4
    torch.testing.assert_close(
        torch.cat([b.cpu() for b in batches]),
        torch.tensor([float(i * i) for i in range(8)]).repeat_interleave(3).view(8, 3),
    )


@pytest.mark.backing_cpu  # within one process: CUDA IPC handles are for other processes
def test_a_pickled_tensor_shares_memory_with_the_original():
    tensor = torch.arange(6.0, device="flagos")
    copy = ForkingPickler.loads(ForkingPickler.dumps(tensor[2:]))
    assert copy.device == tensor.device
    copy.mul_(10)
    torch.testing.assert_close(tensor.cpu(), torch.tensor([0.0, 1.0, 20.0, 30.0, 40.0, 50.0]))


@pytest.mark.backing_cpu  # within one process: CUDA IPC handles are for other processes
def test_a_flagos_storage_travels_as_a_flagos_storage():
    tensor = torch.arange(4, dtype=torch.int32, device="flagos")
    storage = ForkingPickler.loads(ForkingPickler.dumps(tensor.untyped_storage()))
    assert isinstance(storage, torch.UntypedStorage) and storage.device.type == "flagos"
    assert bytes(storage.cpu()) == bytes(tensor.untyped_storage().cpu())


def test_an_unshareable_tensor_warns_the_producer_and_raises_in_the_consumer(monkeypatch: pytest.MonkeyPatch):
    def refuse(tensor: torch.Tensor) -> torch.Tensor:
        raise RuntimeError("this backing shares nothing")

    monkeypatch.setattr(sharing, "shareable_backing_view", refuse)
    tensor = torch.ones(2, device="flagos")
    with pytest.warns(RuntimeWarning, match="cannot be shared with another process: this backing shares nothing"):
        payload = ForkingPickler.dumps(tensor)
    with pytest.raises(RuntimeError, match="cannot be shared"):
        ForkingPickler.loads(payload)
    queue = mp.get_context("spawn").Queue()
    queue.put(tensor)
    with pytest.raises(RuntimeError, match="cannot be shared"):  # not a consumer waiting forever
        queue.get(timeout=TIMEOUT)
