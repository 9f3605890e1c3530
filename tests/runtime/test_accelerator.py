"""torch.accelerator, PyTorch's device-generic API, sees flagos as the current accelerator.

Only calls that exist in the installed torch are exercised (the API grows between releases), and
each is compared with what torch.flagos says."""

from __future__ import annotations

import pytest
import torch

acc = torch.accelerator


def has(name: str) -> bool:
    return hasattr(acc, name)


def test_flagos_is_the_current_accelerator():
    assert acc.is_available()
    assert acc.current_accelerator() == torch.device("flagos")
    assert acc.current_accelerator().type == "flagos"
    assert torch._C._get_privateuse1_backend_name() == "flagos"


def test_device_count_and_index():
    assert acc.device_count() == torch.flagos.device_count()
    assert acc.current_device_index() == torch.flagos.current_device() == 0


@pytest.mark.two_devices
def test_set_device_index_moves_factories():
    acc.set_device_index(1)
    assert acc.current_device_index() == 1 == torch.flagos.current_device()
    assert torch.empty(2, device="flagos").device == torch.device("flagos", 1)
    acc.set_device_index(0)
    assert torch.empty(2, device="flagos").device == torch.device("flagos", 0)


@pytest.mark.two_devices
@pytest.mark.skipif(not has("device_index"), reason="torch.accelerator.device_index is not in this torch")
def test_device_index_context():
    with acc.device_index(1):
        assert torch.ones(1, device="flagos").device.index == 1
    assert acc.current_device_index() == 0
    with acc.device_index(None):  # None leaves the device alone
        assert acc.current_device_index() == 0


def test_invalid_device_index_raises():
    with pytest.raises(RuntimeError):
        acc.set_device_index(torch.flagos.device_count())
    assert acc.current_device_index() == 0


def test_synchronize_and_streams():
    acc.synchronize()
    acc.synchronize(0)
    stream = acc.current_stream()
    assert stream == torch.flagos.current_stream()
    assert stream.device == torch.device("flagos", 0)
    side = torch.flagos.Stream()
    acc.set_stream(side)
    assert acc.current_stream() == side
    acc.set_stream(stream)


@pytest.mark.skipif(not has("memory_allocated"), reason="the torch.accelerator memory API is not in this torch")
def test_memory_api():
    x = torch.empty(1 << 18, device="flagos")
    assert acc.memory_allocated() == torch.flagos.memory_allocated() >= x.nbytes
    assert acc.memory_allocated(0) == torch.flagos.memory_allocated(0)
    assert acc.max_memory_allocated() >= acc.memory_allocated()
    assert acc.memory_reserved() == torch.flagos.memory_reserved()
    acc.reset_peak_memory_stats()
    assert acc.max_memory_allocated() == acc.memory_allocated()
    acc.reset_accumulated_memory_stats()
    assert acc.memory_stats()["allocated_bytes.all.current"] == torch.flagos.memory_allocated()
    acc.empty_cache()
    del x


@pytest.mark.skipif(not has("get_memory_info"), reason="torch.accelerator.get_memory_info is not in this torch")
def test_memory_info():
    free, total = acc.get_memory_info()
    assert 0 < free <= total
    assert total == torch.flagos.mem_get_info()[1]  # free memory moves between two calls; the total does not


def test_device_module_lookup():
    assert torch.get_device_module("flagos") is torch.flagos
    assert torch.get_device_module(torch.device("flagos:0")) is torch.flagos


def test_amp_and_rng_through_generic_entry_points():
    assert torch.amp.is_autocast_available("flagos")
    torch.random.manual_seed(5)  # seeds every accelerator too
    a = torch.rand(3, device="flagos")
    torch.random.manual_seed(5)
    assert torch.equal(torch.rand(3, device="flagos").cpu(), a.cpu())
