"""torch.nn.DataParallel on flagos devices.

DataParallel itself is device-generic (torch.accelerator streams and device indices), but the
collectives under it (torch.nn.parallel.comm: broadcast, scatter, gather) are CUDA kernels that exist
only in CUDA builds and only move CUDA tensors. For flagos tensors they are served here by plain
device-to-device copies; every other call goes to PyTorch's own. On a CUDA backing DataParallel would
also pick "cuda" as its device type (CUDA is available there), so it is told the accelerator is flagos.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.nn.parallel.comm as comm
import torch.nn.parallel.data_parallel as data_parallel
from torch._utils import _get_device_index

Devices = Sequence["int | str | torch.device"]


def install(backing: str) -> None:
    """Routes torch.nn.parallel.comm's device functions for flagos tensors here. Idempotent."""
    for name, flagos_impl in (
        ("broadcast", broadcast),
        ("broadcast_coalesced", broadcast_coalesced),
        ("scatter", scatter),
        ("gather", gather),
    ):
        original = getattr(comm, name)
        if getattr(original, "_flagos_impl", None) is None:
            setattr(comm, name, _for_flagos(original, flagos_impl))
    if backing == "cuda":
        # While flagos is registered, plain CUDA autograd is off in this process (the containment
        # rule), so DataParallel here is flagos DataParallel.
        data_parallel._get_available_device_type = lambda: "flagos"


def _for_flagos(original: Callable[..., Any], flagos_impl: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def dispatch(tensors: Any, *args: Any, **kwargs: Any) -> Any:
        if not isinstance(tensors, torch.Tensor):
            tensors = list(tensors)  # looked at twice: an iterator must not lose its first tensor
        first = tensors if isinstance(tensors, torch.Tensor) else next(iter(tensors), None)
        on_flagos = first is not None and first.device.type == "flagos"
        # A CPU tensor scattered from DataParallel goes to the accelerator, flagos.
        from_cpu = first is not None and first.device.type == "cpu" and _accelerator_is_flagos()
        if (on_flagos or from_cpu) and kwargs.get("out") is None:
            kwargs.pop("out", None)
            return flagos_impl(tensors, *args, **kwargs)
        return original(tensors, *args, **kwargs)

    dispatch._flagos_impl = flagos_impl  # type: ignore[attr-defined]
    return dispatch


def _accelerator_is_flagos() -> bool:
    accelerator = torch.accelerator.current_accelerator()
    return accelerator is not None and accelerator.type == "flagos"


def _flagos(index: int) -> torch.device:
    return torch.device("flagos", index)


def broadcast(tensor: torch.Tensor, devices: Devices) -> tuple[torch.Tensor, ...]:
    """`tensor` on each device: itself where it already is, a copy elsewhere."""
    return tuple(tensor if tensor.device == _flagos(d) else tensor.to(_flagos(d)) for d in _indices(devices))


def broadcast_coalesced(
    tensors: Sequence[torch.Tensor], devices: Devices, buffer_size: int = 10485760
) -> list[list[torch.Tensor]]:
    """Per device, the tensors on it; the first device must be the tensors' own (as in PyTorch)."""
    indices = _indices(devices)
    source = _flagos(indices[0])
    for t in tensors:
        if t.device != source:
            raise RuntimeError(f"all tensors must be on {source} (the first of the devices), found one on {t.device}")
    return [list(tensors)] + [[t.to(_flagos(d)) for t in tensors] for d in indices[1:]]


def scatter(
    tensor: torch.Tensor,
    devices: Devices,
    chunk_sizes: Sequence[int] | None = None,
    dim: int = 0,
    streams: Sequence[torch.Stream | None] | None = None,
) -> tuple[torch.Tensor, ...]:
    """Chunks of `tensor` along `dim`, one per device (equal chunks unless `chunk_sizes` says)."""
    indices = _indices(devices)
    chunks = tensor.split(list(chunk_sizes), dim) if chunk_sizes is not None else tensor.chunk(len(indices), dim)
    out = []
    for i, (chunk, d) in enumerate(zip(chunks, indices)):
        stream = streams[i] if streams is not None else None
        with torch.accelerator.device_index(d), stream if stream is not None else contextlib.nullcontext():
            out.append(chunk.to(_flagos(d), non_blocking=True, memory_format=torch.contiguous_format))
    return tuple(out)


def gather(
    tensors: Sequence[torch.Tensor], dim: int = 0, destination: int | str | torch.device | None = None
) -> torch.Tensor:
    """The tensors concatenated along `dim` on `destination` (a flagos index, "cpu", or the current device)."""
    index = _get_device_index(destination, allow_cpu=True, optional=True)
    target = torch.device("cpu") if index == -1 else _flagos(index)
    return torch.cat([t.to(target) for t in tensors], dim)


def _indices(devices: Devices) -> list[int]:
    return [_get_device_index(d) for d in devices]
