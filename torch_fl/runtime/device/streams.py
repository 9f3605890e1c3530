"""Streams and events: torch.Stream / torch.Event on flagos, served by the core's device guard."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch

from torch_fl.runtime.device.core import index


# Factories rather than subclasses: PyTorch's Event methods accept only torch.Event itself.
def Stream(device: Any = None, priority: int = 0) -> torch.Stream:
    """A new flagos stream (on CUDA backing, a CUDA stream under a flagos label)."""
    return torch.Stream(device=torch.device("flagos", index(device)), priority=priority)


def Event(enable_timing: bool = False, blocking: bool = False, interprocess: bool = False) -> torch.Event:
    """A flagos event; on the host backing it records a timestamp, so elapsed_time works."""
    return torch.Event(device="flagos", enable_timing=enable_timing, blocking=blocking, interprocess=interprocess)


def current_stream(device: Any = None) -> torch.Stream:
    return torch.accelerator.current_stream(torch.device("flagos", index(device)))


def default_stream(device: Any = None) -> torch.Stream:
    i = index(device)
    current = torch.accelerator.current_stream(torch.device("flagos", i))
    # The default stream is id 0 on the host guard; on CUDA the backing names it.
    return torch.Stream(stream_id=0, device_index=i, device_type=current.device_type)


def set_stream(stream: torch.Stream) -> None:
    torch.accelerator.set_stream(stream)


@contextlib.contextmanager
def stream(s: torch.Stream | None) -> Iterator[None]:
    """Make `s` current for the block, restoring the previous stream after."""
    if s is None:
        yield
        return
    previous = torch.accelerator.current_stream(s.device)
    torch.accelerator.set_stream(s)
    try:
        yield
    finally:
        torch.accelerator.set_stream(previous)
