"""The other process of the sharing suite: takes a flagos tensor from a torch.multiprocessing queue,
adds one to it in place, and reports through `done` (started with 'spawn', so it activates the
platform named by FLAGOS_PLATFORM, as the worker that sent the tensor did)."""

from __future__ import annotations

from typing import Any

import torch


def increment(queue: Any, done: Any, timeout: float) -> None:
    tensor = queue.get(timeout=timeout)
    if tensor.device.type != "flagos":
        raise RuntimeError(f"the tensor arrived on {tensor.device}, not on flagos")
    tensor.add_(1)
    torch.flagos.synchronize()
    done.set()
