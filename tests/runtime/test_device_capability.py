"""torch.accelerator.get_device_capability() on flagos reports the active platform's capabilities: the
dtypes its descriptor declares (capabilities.dtypes), on every backing."""

from __future__ import annotations

import torch

import torch_fl


def _declared_dtypes() -> set[torch.dtype]:
    return {getattr(torch, name) for name in torch_fl.active_platform().descriptor.capabilities.dtypes}


def test_capability_reports_the_descriptor_dtypes():
    capability = torch.accelerator.get_device_capability()
    assert capability["supported_dtypes"] == _declared_dtypes()


def test_every_device_reports_the_same_capability():
    for index in range(torch.flagos.device_count()):
        capability = torch.accelerator.get_device_capability(torch.device("flagos", index))
        assert capability["supported_dtypes"] == _declared_dtypes()


def test_declared_dtypes_allocate_and_convert():
    for dtype in torch.accelerator.get_device_capability()["supported_dtypes"]:
        ones = torch.ones(3, dtype=dtype, device="flagos")
        assert ones.dtype == dtype
        # compared as bytes: not every dtype (float8, uint64) has a CPU equality kernel
        assert torch.equal(ones.cpu().view(torch.uint8), torch.ones(3, dtype=dtype).view(torch.uint8)), dtype
