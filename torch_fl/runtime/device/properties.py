"""What a flagos device is: its properties, compute capability, architectures and peers.

On a CUDA backing each answer is the backing device's own (a program that tunes for the GPU keeps doing
so on flagos). The host reference device has no CUDA architecture: it answers as a device without one
(capability (0, 0), no architectures), so code that gates a CUDA-only kernel on these takes its
portable path, and its memory and processors are the host's, shared by the virtual devices.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Union

import torch

from torch_fl.runtime.device.core import backing, index

Device = Union[torch.device, str, int, None]


@dataclass(frozen=True)
class HostDeviceProperties:
    """The fields of torch.cuda.get_device_properties() that describe any device, for a host device."""

    name: str
    total_memory: int
    multi_processor_count: int
    major: int = 0
    minor: int = 0
    is_integrated: bool = True


def get_device_properties(device: Device = None) -> Any:
    i = index(device)
    if backing() == "cuda":
        return torch.cuda.get_device_properties(i)
    return HostDeviceProperties(
        name=f"flagos host reference device {i}",
        total_memory=os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"),
        multi_processor_count=os.cpu_count() or 1,
    )


def get_device_capability(device: Device = None) -> tuple[int, int]:
    """(major, minor) compute capability: the CUDA backing's; (0, 0) on the host."""
    i = index(device)
    if backing() == "cuda":
        return torch.cuda.get_device_capability(i)
    return (0, 0)


def get_arch_list() -> list[str]:
    """The architectures the backing's kernels were built for (none on the host)."""
    return torch.cuda.get_arch_list() if backing() == "cuda" else []


def is_tf32_supported() -> bool:
    """TF32 matmuls: CUDA devices of compute capability 8.0 and later."""
    return get_device_capability() >= (8, 0)


def can_device_access_peer(device: Device, peer_device: Device) -> bool:
    """Whether `device` can read `peer_device`'s memory directly (host devices share one address space)."""
    if backing() == "cuda":
        return torch.cuda.can_device_access_peer(index(device), index(peer_device))
    return True
