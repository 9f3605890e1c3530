"""Sending flagos tensors to other processes: torch.multiprocessing queues and pipes, DataLoader workers.

PyTorch shares CPU tensors through shared memory and CUDA tensors through CUDA IPC; a flagos tensor
is shared through its backing's mechanism. Its bytes are shared as a backing tensor (on the host,
the flagos storage first moves into shared memory, in place, as CPU's share_memory_() does), PyTorch's
own reduction sends that tensor, and the receiving process aliases it as flagos again: both
processes then see the same memory. When a backing cannot share a tensor, the producer warns with
the reason and the consumer gets that error when it takes the tensor, instead of waiting forever
for an item the queue dropped.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from multiprocessing.reduction import ForkingPickler
from typing import Any

import torch
from torch.multiprocessing import reductions  # importing it registers PyTorch's reductions first

from torch_fl.runtime.device.core import backing, core

Reduction = tuple[Callable[..., Any], tuple[Any, ...]]


def install() -> None:
    """Sends flagos tensors and storages through the backing; every other tensor as PyTorch does."""
    for cls in (*torch._tensor_classes, torch.Tensor, torch.nn.Parameter):
        ForkingPickler.register(cls, reduce_tensor)
    ForkingPickler.register(torch.UntypedStorage, reduce_storage)


def reduce_tensor(tensor: torch.Tensor) -> Reduction:
    if tensor.device.type != "flagos" or tensor.layout != torch.strided or tensor.is_nested:
        return reductions.reduce_tensor(tensor)  # sparse and nested ones come back here per part
    if tensor.requires_grad and not tensor.is_leaf:
        return reductions.reduce_tensor(tensor)  # PyTorch's own refusal, with its explanation
    try:
        rebuild, args = reductions.reduce_tensor(shareable_backing_view(tensor))
    except Exception as exc:  # noqa: BLE001 - any failure of the backing's sharing is reported the same way
        return _unshareable(tensor, exc)
    return rebuild_flagos_tensor, (rebuild, args, tensor.device.index, type(tensor), tensor.requires_grad)


def reduce_storage(storage: torch.UntypedStorage) -> Reduction:
    if storage.device.type != "flagos":
        return reductions.reduce_storage(storage)
    as_bytes = torch.empty(0, dtype=torch.uint8, device=storage.device).set_(storage)
    rebuild, args = reduce_tensor(as_bytes)
    return rebuild_flagos_storage, (rebuild, args)


def shareable_backing_view(tensor: torch.Tensor) -> torch.Tensor:
    """A backing tensor over the same bytes as `tensor` that PyTorch's reductions can share."""
    if backing() == "cuda":
        # CUDA IPC shares the caching allocator's block behind the alias; the alias keeps the
        # flagos storage alive for as long as a consumer holds the memory.
        return core().as_backing(tensor)
    if backing() != "cpu":
        raise RuntimeError(f"the '{backing()}' backing has no way to share memory with another process")
    return _host_shared_view(tensor)


def _host_shared_view(tensor: torch.Tensor) -> torch.Tensor:
    storage = tensor.untyped_storage()
    if storage.nbytes() == 0:
        shared = torch.UntypedStorage(0)
    else:
        held = core().host_bytes(tensor)
        if held is None or not held.untyped_storage().is_shared():
            held = torch.empty(storage.nbytes(), dtype=torch.uint8).share_memory_()
            core().move_host_storage(tensor, held)
        shared = held.untyped_storage()
    return torch.empty(0, dtype=tensor.dtype).set_(shared, tensor.storage_offset(), tensor.size(), tensor.stride())


def _unshareable(tensor: torch.Tensor, exc: Exception) -> Reduction:
    message = (
        f"a flagos tensor on {tensor.device} (backing '{backing()}') cannot be shared with another "
        f"process: {exc}. Send tensor.cpu() instead, or use a backing that can share memory."
    )
    warnings.warn(message, RuntimeWarning, stacklevel=2)
    return raise_unshareable, (message,)


def rebuild_flagos_tensor(
    rebuild: Callable[..., torch.Tensor], args: tuple[Any, ...], index: int, cls: type, requires_grad: bool
) -> torch.Tensor:
    tensor = core().as_flagos(rebuild(*args), index)
    if cls is torch.nn.Parameter:
        return torch.nn.Parameter(tensor, requires_grad=requires_grad)
    return tensor.requires_grad_(requires_grad)


def rebuild_flagos_storage(rebuild: Callable[..., torch.Tensor], args: tuple[Any, ...]) -> torch.UntypedStorage:
    return rebuild(*args).untyped_storage()


def raise_unshareable(message: str) -> None:
    raise RuntimeError(message)
