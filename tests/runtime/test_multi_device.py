"""Several flagos devices: indices, device guards, placement of new tensors, cross-device copies, and
mixing devices in one op raising as CUDA does. On host_ref the platform descriptor's
backing.virtual_devices (2 by default) sets how many devices the host emulates."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn

import torch_fl
from torch_fl.platform.discovery import shipped_root


@pytest.mark.backing_cpu
def test_host_reference_has_the_descriptors_device_count():
    descriptor = torch_fl.active_platform().descriptor
    assert torch.flagos.device_count() == descriptor.backing.virtual_devices
    if descriptor.name == "host_ref":
        assert torch.flagos.device_count() == 2


@pytest.mark.own_process
@pytest.mark.skipif(torch.cuda.is_available(), reason="a host_ref fact; this machine has CUDA")
def test_virtual_device_count_is_configurable(tmp_path, run_python):
    """A host_ref descriptor with virtual_devices: 3 (found through FLAGOS_PLATFORM_PATH) gives three devices."""
    source = (shipped_root() / "host_ref" / "platform.yaml").read_text()
    assert "virtual_devices: 2" in source
    folder = tmp_path / "host_ref"
    folder.mkdir()
    (folder / "platform.yaml").write_text(source.replace("virtual_devices: 2", "virtual_devices: 3"))
    result = run_python(
        """
        import torch, torch_fl
        print(torch_fl.active_platform().name, torch.flagos.device_count(), torch.accelerator.device_count())
        x = torch.ones(2, device="flagos:2")
        print(x.device, (x + 1).device)
        """,
        env={"FLAGOS_PLATFORM_PATH": str(tmp_path), "FLAGOS_PLATFORM": "host_ref"},
    )
    assert result.stdout.split() == ["host_ref", "3", "3", "flagos:2", "flagos:2"], result.stdout


def test_device_indices_and_properties():
    count = torch.flagos.device_count()
    for i in range(count):
        x = torch.zeros(1, device=f"flagos:{i}")
        assert x.device == torch.device("flagos", i) and x.get_device() == i
    with pytest.raises(RuntimeError):
        torch.zeros(1, device=f"flagos:{count}")


@pytest.mark.two_devices
def test_set_device_places_new_tensors():
    torch.flagos.set_device(1)
    assert torch.flagos.current_device() == 1
    assert torch.zeros(2, device="flagos").device == torch.device("flagos", 1)
    assert torch.tensor([1, 2], device="flagos").device.index == 1
    assert torch.ones(2).flagos().device.index == 1  # .flagos() without an index uses the current device
    assert torch.randn(2, device="flagos").device.index == 1
    assert torch.zeros(2, device="flagos:0").device.index == 0  # an explicit index wins
    torch.flagos.set_device("flagos:0")
    assert torch.zeros(1, device="flagos").device.index == 0


@pytest.mark.two_devices
def test_device_guard_context():
    with torch.flagos.device(1):
        assert torch.flagos.current_device() == 1
        x = torch.ones(3, device="flagos")
        y = x * 2
        with torch.flagos.device(0):
            assert torch.ones(1, device="flagos").device.index == 0
        assert torch.flagos.current_device() == 1
    assert torch.flagos.current_device() == 0
    assert x.device.index == 1 and y.device.index == 1
    with torch.flagos.device_of(y):
        assert torch.flagos.current_device() == 1
    with torch.flagos.device(None):
        assert torch.flagos.current_device() == 0


@pytest.mark.two_devices
def test_ops_stay_on_their_device_whatever_is_current(same):
    a = torch.randn(4, 4)
    x = a.to("flagos:1")
    assert torch.flagos.current_device() == 0
    results = [x + 1, x @ x, x.sum(), x.t().contiguous(), torch.softmax(x, 0), x.to(torch.float64), x[::2].clone()]
    for r in results:
        assert r.device == torch.device("flagos", 1)
    same(results[1], a @ a)


@pytest.mark.two_devices
def test_cross_device_copies(same):
    cpu = torch.randn(8)
    x0 = cpu.to("flagos:0")
    x1 = x0.to("flagos:1")
    assert x1.device.index == 1 and x1.data_ptr() != x0.data_ptr()
    same(x1, cpu)
    x1.add_(1)
    same(x0, cpu)  # a copy, not an alias
    target = torch.zeros(8, device="flagos:0")
    target.copy_(x1)
    same(target, cpu + 1)
    same(x1.to("flagos:0", non_blocking=True), cpu + 1)


MIXED = {
    "add": lambda a, b: a + b,
    "mul_": lambda a, b: a.mul_(b),
    "mm": lambda a, b: a[None] @ b[:, None],
    "cat": lambda a, b: torch.cat([a, b]),
    "where": lambda a, b: torch.where(a > 0, a, b),
    "index_select": lambda a, b: a.index_select(0, b.long()),
}


@pytest.mark.two_devices
@pytest.mark.parametrize("op", MIXED.values(), ids=MIXED.keys())
def test_mixing_devices_raises_like_cuda(op):
    a = torch.ones(3, device="flagos:0")
    b = torch.zeros(3, device="flagos:1")
    with pytest.raises(RuntimeError, match="Expected all tensors to be on the same device|device"):
        op(a, b)


def test_mixing_flagos_and_cpu_raises_like_cuda():
    a = torch.ones(3, device="flagos")
    with pytest.raises(RuntimeError, match="same device|device"):
        a + torch.ones(3)
    with pytest.raises(RuntimeError, match="same device|device"):
        torch.mm(a[None], torch.ones(3, 1))
    # a 0-dim CPU tensor is a scalar, allowed as on CUDA
    assert torch.equal((a * torch.tensor(2.0)).cpu(), torch.full((3,), 2.0))


@pytest.mark.two_devices
def test_module_on_second_device(same):
    torch.manual_seed(0)
    model = nn.Linear(4, 2)
    reference = model(torch.ones(1, 4))
    model.flagos(1)
    assert all(p.device == torch.device("flagos", 1) for p in model.parameters())
    out = model(torch.ones(1, 4, device="flagos:1"))
    assert out.device.index == 1
    same(out, reference.detach())
    out.sum().backward()
    assert model.weight.grad.device.index == 1


@pytest.mark.two_devices
def test_optimizer_step_on_second_device(tol):
    results = []
    for device in ("cpu", "flagos:1"):
        torch.manual_seed(0)
        model = nn.Linear(3, 3).to(device)
        opt = torch.optim.AdamW(model.parameters(), lr=0.1, foreach=True)
        for _ in range(3):
            opt.zero_grad()
            model(torch.ones(2, 3, device=device)).square().sum().backward()
            opt.step()
        results.append(model.weight.detach().cpu())
    torch.testing.assert_close(results[1], results[0], **tol)
