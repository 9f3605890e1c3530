"""Optimizers on flagos reach the same parameters as on the CPU after several steps."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn

STEPS = 5


def train(device: str, make_optimizer, steps: int = STEPS, scheduler=None) -> tuple[list[torch.Tensor], list[float]]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 4))
    data = torch.randn(6, 8)
    targets = torch.randn(6, 4)
    model.to(device)
    optimizer = make_optimizer(model.parameters())
    sched = scheduler(optimizer) if scheduler else None
    losses = []
    for _ in range(steps):
        optimizer.zero_grad(set_to_none=True)
        loss = nn.functional.mse_loss(model(data.to(device)), targets.to(device))
        loss.backward()
        optimizer.step()
        if sched:
            sched.step()
        losses.append(loss.item())
    return [p.detach().cpu() for p in model.parameters()], losses


OPTIMIZERS = {
    "sgd": lambda p: torch.optim.SGD(p, lr=0.1),
    "sgd_momentum_foreach": lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9, nesterov=True, foreach=True),
    "sgd_weight_decay_for_loop": lambda p: torch.optim.SGD(p, lr=0.1, weight_decay=0.01, foreach=False),
    "adamw_foreach": lambda p: torch.optim.AdamW(p, lr=0.01, foreach=True),
    "adamw_for_loop": lambda p: torch.optim.AdamW(p, lr=0.01, foreach=False),
    "adamw_amsgrad_foreach": lambda p: torch.optim.AdamW(p, lr=0.01, amsgrad=True, foreach=True),
    "adamw_fused": lambda p: torch.optim.AdamW(p, lr=0.01, fused=True),
    "adam_foreach": lambda p: torch.optim.Adam(p, lr=0.01, foreach=True),
    "rmsprop": lambda p: torch.optim.RMSprop(p, lr=0.01, foreach=True),
    "adagrad": lambda p: torch.optim.Adagrad(p, lr=0.1, foreach=True),
}


@pytest.mark.parametrize("make_optimizer", OPTIMIZERS.values(), ids=OPTIMIZERS.keys())
def test_parameters_match_cpu(make_optimizer, tol):
    params_fl, losses_fl = train("flagos", make_optimizer)
    params_cpu, losses_cpu = train("cpu", make_optimizer)
    for a, b in zip(params_fl, params_cpu):
        torch.testing.assert_close(a, b, **tol)
    torch.testing.assert_close(losses_fl, losses_cpu, **tol)
    assert losses_fl[-1] < losses_fl[0]


def test_optimizer_state_lives_on_flagos():
    model = nn.Linear(3, 3).to("flagos")
    optimizer = torch.optim.AdamW(model.parameters(), foreach=True)
    model(torch.randn(2, 3, device="flagos")).sum().backward()
    optimizer.step()
    state = optimizer.state[model.weight]
    assert state["exp_avg"].device.type == "flagos"
    assert state["exp_avg_sq"].device.type == "flagos"
    # the step counter stays on the CPU unless capturable/fused, as for CUDA
    assert state["step"].device.type == "cpu"


def test_lr_scheduler_and_clip_grad_norm(tol):
    def make(p):
        return torch.optim.SGD(p, lr=0.2, momentum=0.5, foreach=True)

    def sched(opt):
        return torch.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.5)

    params_fl, _ = train("flagos", make, scheduler=sched)
    params_cpu, _ = train("cpu", make, scheduler=sched)
    for a, b in zip(params_fl, params_cpu):
        torch.testing.assert_close(a, b, **tol)

    grads = [torch.randn(5, 5) * 10 for _ in range(3)]
    fl = [torch.zeros(5, 5, device="flagos", requires_grad=True) for _ in grads]
    cpu = [torch.zeros(5, 5, requires_grad=True) for _ in grads]
    for f, c, g in zip(fl, cpu, grads):
        f.grad, c.grad = g.to("flagos"), g.clone()
    norm_fl = nn.utils.clip_grad_norm_(fl, 1.0, foreach=True)
    norm_cpu = nn.utils.clip_grad_norm_(cpu, 1.0, foreach=True)
    assert norm_fl.device.type == "flagos"
    torch.testing.assert_close(norm_fl.cpu(), norm_cpu, **tol)
    for f, c in zip(fl, cpu):
        torch.testing.assert_close(f.grad.cpu(), c.grad, **tol)
