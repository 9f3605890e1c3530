"""Programs written for CUDA run unchanged on flagos where the machine has no CUDA device and the
user asks for it (FLAGOS_ALIAS_CUDA=1); where real CUDA exists it is never hijacked.

The alias changes process-wide state, so each case runs in its own interpreter.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path

import pytest
import torch

from torch_fl.runtime import cuda_alias

REPO = Path(__file__).resolve().parents[2]
REAL_CUDA = cuda_alias.real_cuda_present()
no_real_cuda = pytest.mark.skipif(REAL_CUDA, reason="aliasing is only for machines without a CUDA device")

# The child enables the alias as the runtime does at start-up (idempotent once start() wires it).
PRELUDE = """
import json, warnings
warnings.filterwarnings("ignore")
import torch, torch_fl
from torch_fl.runtime import cuda_alias
cuda_alias.enable_from_env()
facts = {}
def fact(name, fn):
    try:
        facts[name] = fn()
    except Exception as exc:
        facts[name] = "raised " + type(exc).__name__
"""


def _run(body: str, **env: str | None) -> dict:
    full_env = dict(os.environ, PYTHONUNBUFFERED="1")
    for key, value in env.items():
        if value is None:
            full_env.pop(key, None)
        else:
            full_env[key] = value
    code = PRELUDE + textwrap.dedent(body) + "\nprint('FACTS=' + json.dumps(facts))\n"
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, env=full_env, capture_output=True, text=True, timeout=540
    )
    assert result.returncode == 0, f"exit {result.returncode}\n{result.stdout}\n{result.stderr}"
    line = [entry for entry in result.stdout.splitlines() if entry.startswith("FACTS=")][-1]
    return json.loads(line[len("FACTS=") :])


ALIAS_BODY = """
fact("enabled", cuda_alias.enabled)
fact("is_available", torch.cuda.is_available)
fact("device_count", torch.cuda.device_count)
fact("factory", lambda: str(torch.randn(3, device="cuda").device))
fact("factory_indexed", lambda: str(torch.zeros(2, device="cuda:1").device))
fact("factory_device_object", lambda: str(torch.ones(2, device=torch.device("cuda", 1)).device))
fact("dot_cuda", lambda: str(torch.ones(2).cuda().device))
fact("dot_cuda_index", lambda: str(torch.ones(2).cuda(1).device))
fact("to_cuda", lambda: str(torch.ones(2).to("cuda").device))
fact("to_cuda_kw", lambda: str(torch.ones(2).to(device="cuda:1", dtype=torch.float64).device))
fact("module_cuda", lambda: str(torch.nn.Linear(2, 2).cuda().weight.device))
fact("module_to_cuda", lambda: str(torch.nn.Linear(2, 2).to("cuda").weight.device))
def in_device_1():
    with torch.cuda.device(1):
        inside = [str(torch.empty(1, device="cuda").device), str(torch.ones(1).cuda().device), torch.cuda.current_device()]
    return inside + [torch.cuda.current_device()]
fact("device_context", in_device_1)
def set_device():
    torch.cuda.set_device("cuda:1")
    where = [torch.cuda.current_device(), str(torch.ones(1, device="cuda").device)]
    torch.cuda.set_device(0)
    return where
fact("set_device", set_device)
def seeded():
    torch.cuda.manual_seed(7); a = torch.randn(4, device="cuda")
    torch.cuda.manual_seed(7); b = torch.randn(4, device="cuda")
    return torch.equal(a, b)
fact("manual_seed", seeded)
fact("synchronize", lambda: torch.cuda.synchronize() is None)
def allocated():
    keep = torch.ones(1024, device="cuda")
    return torch.cuda.memory_allocated() >= keep.numel() * keep.element_size()
fact("memory_allocated", allocated)
def train():
    model = torch.nn.Linear(4, 1).cuda()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = torch.randn(8, 4, device="cuda"), torch.randn(8, 1, device="cuda")
    losses = []
    for _ in range(3):
        opt.zero_grad(); loss = torch.nn.functional.mse_loss(model(x), y); loss.backward(); opt.step()
        losses.append(loss.item())
    return [str(model.weight.grad.device), losses[0] > losses[-1]]
fact("train", train)
def default_device():
    torch.set_default_device("cuda")
    try:
        return str(torch.empty(1).device)
    finally:
        torch.set_default_device(None)
fact("set_default_device", default_device)
cuda_alias.disable()
fact("after_disable", lambda: [cuda_alias.enabled(), torch.cuda.is_available(), str(torch.empty(1).device)])
fact("after_disable_factory", lambda: str(torch.randn(1, device="cuda").device))
"""


@no_real_cuda
def test_alias_maps_cuda_requests_onto_flagos():
    facts = _run(ALIAS_BODY, FLAGOS_PLATFORM="host_ref", FLAGOS_ALIAS_CUDA="1")
    assert facts["enabled"] is True
    assert facts["is_available"] is True
    assert facts["device_count"] >= 2  # the host reference platform has two virtual devices
    assert facts["factory"] == "flagos:0"
    assert facts["factory_indexed"] == "flagos:1"
    assert facts["factory_device_object"] == "flagos:1"
    assert facts["dot_cuda"] == "flagos:0"
    assert facts["dot_cuda_index"] == "flagos:1"
    assert facts["to_cuda"] == "flagos:0"
    assert facts["to_cuda_kw"] == "flagos:1"
    assert facts["module_cuda"] == "flagos:0"
    assert facts["module_to_cuda"] == "flagos:0"
    assert facts["device_context"] == ["flagos:1", "flagos:1", 1, 0]
    assert facts["set_device"] == [1, "flagos:1"]
    assert facts["manual_seed"] is True
    assert facts["synchronize"] is True
    assert facts["memory_allocated"] is True
    assert facts["train"] == ["flagos:0", True]
    assert facts["set_default_device"] == "flagos:0"
    assert facts["after_disable"] == [False, False, "cpu"]
    assert facts["after_disable_factory"].startswith("raised")


@no_real_cuda
def test_without_the_variable_nothing_changes():
    body = """
fact("enabled", cuda_alias.enabled)
fact("is_available", torch.cuda.is_available)
fact("device_count", torch.cuda.device_count)
fact("factory", lambda: str(torch.randn(3, device="cuda").device))
fact("dot_cuda", lambda: str(torch.ones(2).cuda().device))
fact("flagos_still_works", lambda: str(torch.ones(2, device="flagos").device))
"""
    facts = _run(body, FLAGOS_PLATFORM="host_ref", FLAGOS_ALIAS_CUDA=None)
    assert facts["enabled"] is False
    assert facts["is_available"] is False
    assert facts["device_count"] == 0
    assert facts["factory"].startswith("raised")
    assert facts["dot_cuda"].startswith("raised")
    assert facts["flagos_still_works"] == "flagos:0"


def test_enable_refuses_where_real_cuda_exists_simulated(monkeypatch):
    # SIMULATION: the detection function is patched to report a real CUDA device, so the refusal
    # path runs on machines without one. Nothing is patched when enable() refuses.
    monkeypatch.setattr(cuda_alias, "real_cuda_present", lambda: True)
    before = torch.cuda.is_available
    with pytest.raises(cuda_alias.RealCudaPresent, match="real CUDA device"):
        cuda_alias.enable()
    assert not cuda_alias.enabled()
    assert torch.cuda.is_available is before
    monkeypatch.setenv("FLAGOS_ALIAS_CUDA", "1")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert cuda_alias.enable_from_env() is False
    assert any("real CUDA device" in str(w.message) for w in caught)
    assert not cuda_alias.enabled()


@pytest.mark.cuda
@pytest.mark.skipif(not REAL_CUDA, reason="needs a real CUDA device (runs on the GPU board)")
def test_real_cuda_is_never_hijacked():
    body = """
fact("enabled", cuda_alias.enabled)
fact("factory", lambda: str(torch.randn(3, device="cuda").device))
fact("dot_cuda", lambda: str(torch.ones(2).cuda().device))
fact("enable", lambda: cuda_alias.enable())
"""
    facts = _run(body, FLAGOS_PLATFORM="nvidia_h200", FLAGOS_ALIAS_CUDA="1")
    assert facts["enabled"] is False
    assert facts["factory"] == "cuda:0"
    assert facts["dot_cuda"] == "cuda:0"
    assert facts["enable"] == "raised RealCudaPresent"
