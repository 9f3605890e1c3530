"""torch.save / torch.load of flagos tensors and modules, as for CUDA ones."""

from __future__ import annotations

import io

import pytest
import torch
import torch.nn as nn


def round_trip(obj, **load_kwargs):
    buffer = io.BytesIO()
    torch.save(obj, buffer)
    buffer.seek(0)
    return torch.load(buffer, **load_kwargs)


@pytest.mark.parametrize("weights_only", [True, False])
def test_tensor_round_trip(weights_only, same):
    cpu = torch.randn(3, 4)
    loaded = round_trip(cpu.to("flagos"), weights_only=weights_only)
    assert loaded.device == torch.device("flagos", 0)
    same(loaded, cpu)


@pytest.mark.parametrize(
    "dtype", [torch.float16, torch.bfloat16, torch.int64, torch.bool, torch.uint16, torch.complex64, torch.float64]
)
def test_dtypes_round_trip(dtype):
    cpu = (torch.randn(5) * 100).to(dtype)
    loaded = round_trip(cpu.to("flagos"), weights_only=True)
    assert loaded.dtype == dtype and loaded.device.type == "flagos"
    assert torch.equal(loaded.cpu(), cpu)


def test_views_keep_sharing_storage():
    x = torch.arange(12.0, device="flagos").reshape(3, 4)
    loaded = round_trip({"base": x, "row": x[1], "col": x.t()[2]}, weights_only=True)
    base = loaded["base"]
    for key in ("row", "col"):
        assert loaded[key].untyped_storage().data_ptr() == base.untyped_storage().data_ptr()
    loaded["row"].fill_(-1)
    assert torch.equal(base[1].cpu(), torch.full((4,), -1.0))
    assert torch.equal(loaded["col"].cpu(), torch.tensor([2.0, -1.0, 10.0]))


@pytest.mark.parametrize("location", ["cpu", torch.device("cpu"), {"flagos:0": "cpu"}, lambda storage, loc: storage])
def test_map_location_to_cpu(location):
    cpu = torch.randn(6)
    loaded = round_trip(cpu.to("flagos"), map_location=location, weights_only=True)
    assert loaded.device.type == "cpu"
    assert torch.equal(loaded, cpu)


def test_map_location_cpu_saved_to_flagos(same):
    cpu = torch.randn(2, 2)
    loaded = round_trip(cpu, map_location="flagos", weights_only=True)
    assert loaded.device.type == "flagos"
    same(loaded, cpu)


@pytest.mark.two_devices
def test_map_location_between_devices(same):
    cpu = torch.randn(4)
    assert round_trip(cpu.to("flagos:1"), weights_only=True).device == torch.device("flagos", 1)
    loaded = round_trip(cpu.to("flagos:0"), map_location="flagos:1", weights_only=True)
    assert loaded.device == torch.device("flagos", 1)
    same(loaded, cpu)
    loaded = round_trip(cpu.to("flagos:1"), map_location={"flagos:1": "flagos:0"}, weights_only=True)
    assert loaded.device == torch.device("flagos", 0)


def test_module_state_dict(same):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.LayerNorm(8), nn.Linear(8, 2)).to("flagos")
    state = round_trip(model.state_dict(), weights_only=True)
    assert all(t.device.type == "flagos" for t in state.values())
    clone = nn.Sequential(nn.Linear(4, 8), nn.LayerNorm(8), nn.Linear(8, 2))
    clone.load_state_dict(round_trip(model.state_dict(), map_location="cpu", weights_only=True))
    x = torch.randn(3, 4)
    same(model(x.to("flagos")), clone(x))


def test_optimizer_state_round_trip(same):
    model = nn.Linear(3, 3).to("flagos")
    opt = torch.optim.AdamW(model.parameters())
    model(torch.randn(2, 3, device="flagos")).sum().backward()
    opt.step()
    state = round_trip(opt.state_dict(), weights_only=True)
    for key in ("exp_avg", "exp_avg_sq"):
        saved = opt.state_dict()["state"][0][key]
        same(state["state"][0][key], saved.cpu())
        assert state["state"][0][key].device.type == "flagos"


def test_file_round_trip(tmp_path, same):
    path = tmp_path / "t.pt"
    cpu = torch.randn(8)
    torch.save({"t": cpu.to("flagos")}, path)
    same(torch.load(path, weights_only=True)["t"], cpu)
    assert torch.load(path, map_location="cpu", weights_only=True)["t"].device.type == "cpu"
