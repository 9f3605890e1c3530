"""CUDA graphs: torch.cuda's graph API on flagos, where the backing is CUDA.

A flagos tensor over CUDA is CUDA memory under a flagos label, its kernels run on the current CUDA
stream (the flagos streams are the backing's streams, relabelled by the core's device guard), and
its memory comes from CUDA's caching allocator, which routes allocations made during a capture to
the graph's private pool. So a CUDA graph captures flagos work as it captures CUDA work, and each
name here is torch.cuda's own, after one check: on any other backing it raises
NotImplementedError naming the active platform and its backing (the host reference device has no
graphs; `is_current_stream_capturing()` answers False there).
"""

from __future__ import annotations

from typing import Any

import torch

from torch_fl.runtime.device.core import backing, platform


def require_cuda_backing(what: str) -> None:
    """Raises, naming the platform and its backing, unless flagos runs on a CUDA backing."""
    if backing() != "cuda":
        raise NotImplementedError(
            f"torch.flagos.{what}: CUDA graphs need a CUDA backing; the active platform "
            f"'{platform()}' is backed by '{backing()}', which has no graph capture"
        )


def _cuda_stream(stream: Any) -> Any:
    """The CUDA stream behind a flagos stream (the same stream, CUDA's label); others unchanged."""
    if isinstance(stream, torch.Stream) and stream.device.type == "flagos":
        return torch.cuda.Stream(stream_id=stream.stream_id, device_index=stream.device_index, device_type=1)
    return stream


class CUDAGraph(torch.cuda.CUDAGraph):
    """torch.cuda.CUDAGraph, for flagos work on a CUDA backing (a torch.cuda.CUDAGraph itself)."""

    def __new__(cls, *args: Any, **kwargs: Any) -> Any:
        require_cuda_backing("CUDAGraph")
        return super().__new__(cls, *args, **kwargs)


class graph(torch.cuda.graph):
    """torch.cuda.graph: captures the block's flagos (CUDA) work into `cuda_graph`.

    `stream` may be a flagos stream (torch.flagos.Stream()) or a CUDA one; the capture runs on it.
    """

    def __init__(self, cuda_graph: Any, pool: Any = None, stream: Any = None, **kwargs: Any) -> None:
        require_cuda_backing("graph")
        super().__init__(cuda_graph, pool, _cuda_stream(stream), **kwargs)


def make_graphed_callables(callables: Any, sample_args: Any, *args: Any, **kwargs: Any) -> Any:
    """torch.cuda.make_graphed_callables for modules and functions over flagos tensors."""
    require_cuda_backing("make_graphed_callables")
    return torch.cuda.make_graphed_callables(callables, sample_args, *args, **kwargs)


def graph_pool_handle() -> Any:
    """torch.cuda.graph_pool_handle: a memory pool token that captures may share."""
    require_cuda_backing("graph_pool_handle")
    return torch.cuda.graph_pool_handle()


def is_current_stream_capturing() -> bool:
    """Whether the current stream records a graph (the host device has no graphs: False)."""
    return backing() == "cuda" and torch.cuda.is_current_stream_capturing()


__all__ = [
    "CUDAGraph",
    "graph",
    "graph_pool_handle",
    "is_current_stream_capturing",
    "make_graphed_callables",
]
