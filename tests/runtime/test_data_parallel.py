"""torch.nn.DataParallel over flagos devices: the batch is scattered over the devices, each replica runs
on its own device, outputs are gathered, and the gradients equal a single-device model's."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

pytestmark = pytest.mark.two_devices


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))


@pytest.mark.parametrize("input_device", ["flagos:0", "cpu"])
def test_forward_and_backward_match_one_device(input_device: str, tol):
    reference = _model()
    model = copy.deepcopy(reference).to("flagos:0")
    seen: set[torch.device] = set()
    model[0].register_forward_hook(lambda module, args, out: seen.add(out.device))
    parallel = nn.DataParallel(model, device_ids=[0, 1])
    x = torch.randn(10, 8)

    out = parallel(x.to(input_device))
    out.square().sum().backward()
    expected = reference(x)
    expected.square().sum().backward()

    assert seen == {torch.device("flagos", 0), torch.device("flagos", 1)}
    assert out.device == torch.device("flagos", 0)
    torch.testing.assert_close(out.detach().cpu(), expected.detach(), **tol)
    for p, q in zip(model.parameters(), reference.parameters()):
        assert p.grad is not None and p.grad.device == torch.device("flagos", 0)
        torch.testing.assert_close(p.grad.cpu(), q.grad, **tol)


def test_default_device_ids_are_every_flagos_device():
    parallel = nn.DataParallel(_model().to("flagos:0"))
    assert parallel.device_ids == list(range(torch.flagos.device_count()))
    out = parallel(torch.randn(6, 8, device="flagos:0"))
    assert out.shape == (6, 4) and out.device == torch.device("flagos", 0)


def test_output_device_gathers_there():
    parallel = nn.DataParallel(_model().to("flagos:0"), device_ids=[0, 1], output_device=1)
    assert parallel(torch.randn(4, 8, device="flagos:0")).device == torch.device("flagos", 1)
