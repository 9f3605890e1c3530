"""The CUDA containment rule: on a machine with a real CUDA device, PyTorch's autoload registers flagos only
when FLAGOS_PLATFORM asks for it (torch_fl.activate() always asks), because a registered PrivateUse1 device
becomes PyTorch's accelerator and breaks autograd over plain CUDA tensors in that process
(pytorch/pytorch#161129).

Plain-CUDA code must keep working after `import torch` and `import torch_fl`; the user is told why flagos
is off. The policy itself is checked on any machine by making torch report a CUDA device and then calling
the autoload entry point as PyTorch's `import torch` does."""

from __future__ import annotations

import pytest
import torch

from torch_fl.activation import CONTAINMENT_NOTE

real_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a real CUDA device (runs on the GPU board)")

# Makes this interpreter's torch report one CUDA device, then runs torch_fl's autoload entry point.
PRETEND_CUDA = """
    import warnings, torch
    torch.cuda._is_compiled = lambda: True
    torch.cuda.device_count = lambda: 1
    import torch_fl
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch_fl._autoload()
    print("active", torch_fl.is_active(), hasattr(torch, "flagos"))
    for w in caught:
        print("warning:", w.message)
"""


@pytest.mark.own_process
def test_policy_leaves_a_cuda_machine_alone(run_python):
    result = run_python(PRETEND_CUDA, env={"TORCH_DEVICE_BACKEND_AUTOLOAD": "0", "FLAGOS_PLATFORM": None})
    assert "active False False" in result.stdout, result.stdout
    assert CONTAINMENT_NOTE.splitlines()[0][:60] in result.stdout
    assert "FLAGOS_PLATFORM" in result.stdout and "torch_fl.activate()" in result.stdout


@pytest.mark.own_process
def test_policy_activates_when_a_platform_is_asked_for(run_python):
    result = run_python(PRETEND_CUDA, env={"TORCH_DEVICE_BACKEND_AUTOLOAD": "0", "FLAGOS_PLATFORM": "host_ref"})
    assert "active True True" in result.stdout, result.stdout + result.stderr
    assert "flagos was not registered" not in result.stdout


@pytest.mark.own_process
def test_activate_is_an_explicit_ask(run_python):
    result = run_python(
        PRETEND_CUDA.replace("torch_fl._autoload()", "torch_fl.activate()"),
        env={"TORCH_DEVICE_BACKEND_AUTOLOAD": "0", "FLAGOS_PLATFORM": None},
    )
    assert "active True True" in result.stdout, result.stdout + result.stderr
    assert "flagos was not registered" not in result.stdout


PLAIN_CUDA_TRAINING = """
    import sys, torch
    import torch_fl
    import torch.nn as nn
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 4)).cuda()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = torch.randn(16, 32, device="cuda"), torch.randint(0, 4, (16,), device="cuda")
    losses = []
    for _ in range(5):
        opt.zero_grad()
        loss = nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < losses[0], losses
    assert model[0].weight.grad.device.type == "cuda"
    print("trained", not torch_fl.is_active(), hasattr(torch, "flagos"), torch.accelerator.current_accelerator())
"""


@pytest.mark.own_process
@real_cuda
def test_plain_cuda_training_after_import_torch_fl(run_python):
    result = run_python(PLAIN_CUDA_TRAINING, env={"FLAGOS_PLATFORM": None, "TORCH_DEVICE_BACKEND_AUTOLOAD": None})
    assert "trained True False cuda" in result.stdout, result.stdout + result.stderr


@pytest.mark.own_process
@real_cuda
def test_user_is_told_why_flagos_is_off(run_python):
    result = run_python(
        """
        import torch_fl, torch
        print(torch_fl.is_active())
        """,
        env={"FLAGOS_PLATFORM": None, "TORCH_DEVICE_BACKEND_AUTOLOAD": None, "PYTHONWARNINGS": None},
    )
    assert result.stdout.split() == ["False"]
    assert "flagos was not registered" in result.stderr
    assert "FLAGOS_PLATFORM" in result.stderr and "torch_fl.activate()" in result.stderr
