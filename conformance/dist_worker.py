"""One rank of the ddp / fsdp2 suites: `python -m torch_fl.conformance.dist_worker CASE RANK WORLD INIT OUT`.

Runs in its own process with FLAGOS_PLATFORM set, so importing torch activates flagos; the
process group uses the flagos collective backend (gloo underneath on a host backing, NCCL on a
CUDA one). Each check's outcome goes to OUT as JSON: {"checks": {name: null | "what went wrong"}}.
The reference for training is the same model trained without distribution on the global batch,
on flagos, in the same process: data parallelism and sharding must not change the numbers.
"""

from __future__ import annotations

import json
import sys
import traceback
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

STEPS = 4
TOL = {"cpu": 1e-5, "cuda": 1e-4}


def _model() -> nn.Module:
    return nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.LayerNorm(32), nn.Linear(32, 8))


def _batch(rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(100 + rank)
    return torch.randn(4, 16, generator=g), torch.randint(0, 8, (4,), generator=g)


def _reference(world: int, device: str) -> tuple[list[float], list[torch.Tensor]]:
    """Undistributed training on the global batch: what every rank must reproduce."""
    torch.manual_seed(0)
    model = _model().to(device)
    xs, ys = zip(*(_batch(r) for r in range(world)))
    losses = _steps(model, torch.cat(xs).to(device), torch.cat(ys).to(device), world=1)
    return losses, [p.detach().cpu() for p in model.parameters()]


def _train(model: nn.Module, rank: int, world: int, device: str) -> list[float]:
    x, y = (t.to(device) for t in _batch(rank))
    return _steps(model, x, y, world)


def _steps(model: nn.Module, x: torch.Tensor, y: torch.Tensor, world: int) -> list[float]:
    """STEPS of SGD; each step's loss averaged over the `world` ranks (1: no process group)."""
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    losses = []
    for _ in range(STEPS):
        opt.zero_grad()
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        total = loss.detach().clone()
        if world > 1:
            dist.all_reduce(total)
        losses.append(total.item() / world)
    return losses


def _close(a: list[float], b: list[float], tol: float) -> str | None:
    torch.testing.assert_close(torch.tensor(a), torch.tensor(b), rtol=tol, atol=tol)
    return None


def check_collectives(rank: int, world: int, device: str, tol: float) -> str | None:
    x = torch.tensor([1.0, 2.0, 3.0], device=device) * (rank + 1)
    dist.all_reduce(x)
    expected = [v * world * (world + 1) / 2 for v in (1.0, 2.0, 3.0)]
    assert x.device.type == "flagos", f"all_reduce left the tensor on {x.device}"
    assert x.cpu().tolist() == expected, f"all_reduce gave {x.cpu().tolist()}, expected {expected}"
    b = torch.full((3,), float(rank), device=device)
    dist.broadcast(b, src=world - 1)
    assert b.cpu().tolist() == [float(world - 1)] * 3, f"broadcast gave {b.cpu().tolist()}"
    parts = [torch.zeros(2, device=device) for _ in range(world)]
    dist.all_gather(parts, torch.tensor([rank, 10.0 * rank], device=device))
    got = [p.cpu().tolist() for p in parts]
    assert got == [[float(r), 10.0 * r] for r in range(world)], f"all_gather gave {got}"
    return None


def check_ddp(rank: int, world: int, device: str, tol: float) -> str | None:
    from torch.nn.parallel import DistributedDataParallel as DDP

    torch.manual_seed(0 if rank == 0 else 1000 + rank)  # other ranks start elsewhere: DDP broadcasts rank 0's weights
    model = _model().to(device)
    losses = _train(DDP(model), rank, world, device)
    ref_losses, ref_params = _reference(world, device)
    assert next(model.parameters()).device.type == "flagos", "DDP moved the parameters off flagos"
    _close(losses, ref_losses, tol)
    for p, r in zip(model.parameters(), ref_params):
        torch.testing.assert_close(
            p.detach().cpu(), r, rtol=tol, atol=tol, msg="parameters differ from undistributed training"
        )
    flat = torch.cat([p.detach().flatten() for p in model.parameters()])
    everyone = [torch.empty_like(flat) for _ in range(world)]
    dist.all_gather(everyone, flat)
    assert all(torch.equal(everyone[0].cpu(), e.cpu()) for e in everyone), "ranks ended with different parameters"
    return None


def check_fsdp2(rank: int, world: int, device: str, tol: float) -> str | None:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh("flagos", (world,))
    torch.manual_seed(0)
    model = _model().to(device)
    full_rows = model[0].weight.shape[0]
    for layer in (model[0], model[3]):
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    local = model[0].weight.to_local()
    assert local.device.type == "flagos", f"the local shard is on {local.device}"
    if world > 1:
        assert local.shape[0] < full_rows, f"not sharded: local shard has {local.shape[0]} of {full_rows} rows"
    losses = _train(model, rank, world, device)
    ref_losses, _ = _reference(world, device)
    _close(losses, ref_losses, tol)
    return None


CASES: dict[str, list[tuple[str, Callable[..., str | None]]]] = {
    "ddp": [("collectives", check_collectives), ("ddp_training", check_ddp)],
    "fsdp2": [("fsdp2_training", check_fsdp2)],
}


def main(case: str, rank: int, world: int, init_file: str, out: str) -> None:
    import torch_fl

    active = torch_fl.active_platform() or torch_fl.activate()
    backing = active.descriptor.backing.device
    torch.flagos.set_device(rank)
    device = f"flagos:{rank}"
    results: dict[str, Any] = {"platform": active.name, "checks": {}}
    try:
        dist.init_process_group(backend="flagos", init_method=f"file://{init_file}", rank=rank, world_size=world)
        results["backend"] = dist.get_backend()
        for name, check in CASES[case]:
            try:
                results["checks"][name] = check(rank, world, device, TOL.get(backing, 1e-4))
            except Exception as exc:  # a failed check is a result; the others still run
                text = str(exc).strip().splitlines()
                results["checks"][name] = f"{type(exc).__name__}: {' '.join(text[:6])[:1500]}"
        dist.barrier()
        dist.destroy_process_group()
    except Exception:
        results["error"] = traceback.format_exc()[-3000:]
    with open(out, "w") as f:
        json.dump(results, f)


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], sys.argv[5])
