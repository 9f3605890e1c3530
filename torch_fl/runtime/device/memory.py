"""Memory statistics of the flagos allocator (tracked by the core on the host backing, the
backing caching allocator's own statistics on CUDA)."""

from __future__ import annotations

from typing import Any, Union

import torch

from torch_fl.runtime.device.core import backing, core, index

Device = Union[torch.device, str, int, None]

# What running out of flagos memory raises on a CUDA backing, named as torch.cuda names it.
OutOfMemoryError = torch.OutOfMemoryError


def memory_stats(device: Device = None) -> dict[str, Any]:
    return dict(core().memory_stats(index(device)))


def memory_allocated(device: Device = None) -> int:
    return memory_stats(device)["allocated_bytes.all.current"]


def max_memory_allocated(device: Device = None) -> int:
    return memory_stats(device)["allocated_bytes.all.peak"]


def memory_reserved(device: Device = None) -> int:
    return memory_stats(device)["reserved_bytes.all.current"]


def max_memory_reserved(device: Device = None) -> int:
    return memory_stats(device)["reserved_bytes.all.peak"]


def reset_peak_memory_stats(device: Device = None) -> None:
    core().reset_peak_memory_stats(index(device))


def reset_accumulated_memory_stats(device: Device = None) -> None:
    core().reset_accumulated_memory_stats(index(device))


def empty_cache() -> None:
    if backing() == "cuda":
        torch.cuda.empty_cache()


def mem_get_info(device: Device = None) -> tuple[int, int]:
    return torch._C._accelerator_getMemoryInfo(index(device))


def set_per_process_memory_fraction(fraction: float, device: Device = None) -> None:
    if backing() != "cuda":
        raise NotImplementedError(
            "the flagos host reference device allocates host memory, which has no per-process limit"
        )
    torch.cuda.set_per_process_memory_fraction(fraction, index(device))


def ipc_collect() -> None:
    """Frees the backing's memory held for tensors that other processes have released."""
    if backing() == "cuda":
        torch.cuda.ipc_collect()
