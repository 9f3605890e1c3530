"""`torch.flagos` next to `torch.cuda`: what user code calls on torch.cuda is there on flagos, the backing
device's answer on a CUDA backing and a host device's on the host; the rest is listed in the README."""

from __future__ import annotations

import copy
import os
import re
from pathlib import Path

import pytest
import torch

README = Path(__file__).resolve().parents[2] / "README.md"


def left_out() -> set[str]:
    """The torch.cuda names the README lists as left out of torch.flagos."""
    text = README.read_text().split("What user code calls on `torch.cuda`", 1)[1].split("\n- **", 1)[0]
    bullets = text.split("Left out, and why:", 1)[1].split("\n  - ")[1:]
    # Each bullet: "what (`name`, `name`, ...): why"
    return {name for bullet in bullets for name in re.findall(r"`([A-Za-z_]\w*)`", bullet.rsplit("):", 1)[0])}


def torch_cuda_api() -> set[str]:
    """torch.cuda's public functions, classes and submodules (not what it imports for itself, nor the
    legacy typed tensors and storages, which the README lists as a group)."""
    names = set()
    for name in dir(torch.cuda):
        value = getattr(torch.cuda, name)
        origin = value.__name__ if isinstance(value, type(torch)) else getattr(value, "__module__", None) or ""
        if name.startswith("_") or not callable(value) and not isinstance(value, type(torch)):
            continue
        if origin.startswith("torch.cuda") and not name.endswith(("Tensor", "Storage")):
            names.add(name)
    return names


def test_every_public_torch_cuda_function_is_on_flagos_or_listed():
    # torch.flagos's submodules (memory, random, streams) hold what their torch.cuda namesakes do.
    submodules = {n for n in dir(torch.flagos) if isinstance(getattr(torch.flagos, n), type(torch))}
    missing = sorted(torch_cuda_api() - set(torch.flagos.__all__) - submodules - left_out())
    assert not missing, f"torch.cuda names neither on torch.flagos nor listed as left out in the README: {missing}"


def test_listed_names_are_really_left_out():
    assert not left_out() & set(torch.flagos.__all__)


@pytest.mark.backing_cpu
def test_host_device_answers_as_a_device_without_cuda_architecture():
    assert torch.flagos.get_device_capability() == (0, 0)
    assert torch.flagos.get_device_capability("flagos:1") == (0, 0)
    assert torch.flagos.get_arch_list() == []
    assert torch.flagos.is_tf32_supported() is False
    assert torch.flagos.is_current_stream_capturing() is False


@pytest.mark.backing_cpu
def test_host_device_properties_are_the_hosts():
    props = torch.flagos.get_device_properties(1)
    assert props.name == "flagos host reference device 1" == torch.flagos.get_device_name(1)
    assert props.total_memory == os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    assert props.multi_processor_count == os.cpu_count()
    assert (props.major, props.minor) == torch.flagos.get_device_capability(1)


@pytest.mark.backing_cpu
@pytest.mark.two_devices
def test_host_devices_share_memory():
    assert torch.flagos.can_device_access_peer(0, 1)


@pytest.mark.backing_cpu
def test_host_memory_fraction_is_not_implemented():
    with pytest.raises(NotImplementedError, match="no per-process limit"):
        torch.flagos.set_per_process_memory_fraction(0.5)


def test_ipc_collect_and_out_of_memory_error():
    torch.flagos.ipc_collect()
    assert torch.flagos.OutOfMemoryError is torch.cuda.OutOfMemoryError


@pytest.mark.backing_cuda
def test_cuda_backing_answers_are_the_backings():
    assert torch.flagos.get_device_capability() == torch.cuda.get_device_capability()
    assert torch.flagos.get_device_properties(0).name == torch.cuda.get_device_properties(0).name
    assert torch.flagos.get_arch_list() == torch.cuda.get_arch_list()
    assert torch.flagos.is_tf32_supported() == (torch.cuda.get_device_capability() >= (8, 0))


GRAPH_API = ("CUDAGraph", "graph", "make_graphed_callables", "graph_pool_handle")


def test_graph_api_is_torch_cudas():
    assert set(GRAPH_API) | {"is_current_stream_capturing"} <= set(torch.flagos.__all__)
    assert issubclass(torch.flagos.CUDAGraph, torch.cuda.CUDAGraph)
    assert issubclass(torch.flagos.graph, torch.cuda.graph)


def _call_graph_api(name: str):
    if name == "graph":
        return torch.flagos.graph(None)
    if name == "make_graphed_callables":
        return torch.flagos.make_graphed_callables(torch.nn.Linear(2, 2), (torch.ones(1, 2),))
    return getattr(torch.flagos, name)()


@pytest.mark.backing_cpu
@pytest.mark.parametrize("name", GRAPH_API)
def test_host_graph_api_names_the_platform_and_its_backing(name):
    with pytest.raises(NotImplementedError, match=rf"torch\.flagos\.{name}: .*'host_ref' is backed by 'cpu'"):
        _call_graph_api(name)


@pytest.mark.backing_cuda
def test_cuda_backing_captures_and_replays_flagos_work():
    x = torch.randn(64, 64, device="flagos")
    w = torch.randn(64, 64, device="flagos")
    side = torch.flagos.Stream()
    side.wait_stream(torch.flagos.current_stream())
    with torch.flagos.stream(side):
        y = (x @ w).relu()  # warm-up outside the capture, as torch.cuda asks
    torch.flagos.current_stream().wait_stream(side)
    g = torch.flagos.CUDAGraph()
    assert isinstance(g, torch.cuda.CUDAGraph)
    with torch.flagos.graph(g, pool=torch.flagos.graph_pool_handle(), stream=torch.flagos.Stream()):
        assert torch.flagos.is_current_stream_capturing()
        y = (x @ w).relu()
    assert not torch.flagos.is_current_stream_capturing()
    assert y.device.type == "flagos"
    for _ in range(2):
        x.copy_(torch.randn(64, 64, device="flagos"))
        g.replay()
        torch.flagos.synchronize()
        torch.testing.assert_close(y, (x @ w).relu(), rtol=1e-4, atol=1e-5)


@pytest.mark.backing_cuda
def test_cuda_backing_make_graphed_callables_trains_on_flagos():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4)).to("flagos")
    reference = copy.deepcopy(model)
    x = torch.randn(8, 16, device="flagos", requires_grad=True)
    graphed = torch.flagos.make_graphed_callables(model, (x,))
    for _ in range(2):
        # Gradients set to None before each step, as with torch.cuda's graphed callables: a
        # replayed backward returns (detached) static gradient buffers, which a None .grad adopts,
        # so a second step's replay would rewrite the first step's gradients before adding to them.
        model.zero_grad(set_to_none=True)
        reference.zero_grad(set_to_none=True)
        inp = torch.randn(8, 16, device="flagos")
        out = graphed(inp)
        out.sum().backward()
        expected = reference(inp)
        expected.sum().backward()
        torch.testing.assert_close(out, expected, rtol=1e-4, atol=1e-5)
        for p, q in zip(model.parameters(), reference.parameters()):
            torch.testing.assert_close(p.grad, q.grad, rtol=1e-4, atol=1e-5)
