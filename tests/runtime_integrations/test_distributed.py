"""The flagos collective backend: collectives, DDP and FSDP2 on flagos tensors match plain PyTorch.

Each run starts its own processes: this file doubles as the worker (`python test_distributed.py
CASE RANK WORLD INIT_FILE OUT_JSON`), which writes its results as JSON for the test to compare.
- host: 2 processes on the host reference platform (flagos over gloo) compared with the same
  collectives and the same DDP training on plain CPU tensors over gloo, in the same processes, and
  FSDP2 (fully_shard) compared with single-process training on the global batch;
- CUDA (GPU board): a one-process NCCL group on CUDA-backed flagos compared with a one-process
  plain NCCL group in a process that never imports torch_fl (plain CUDA autograd cannot run in a
  process where flagos is registered: pytorch/pytorch#161129).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import torch

HERE = Path(__file__).resolve()
REPO = HERE.parents[2]
WORLD = 2
TIMEOUT_S = 540
CUDA = torch.cuda.is_available()
needs_cuda = pytest.mark.skipif(not CUDA, reason="needs a CUDA device (NCCL); runs on the GPU board")


# ---------------------------------------------------------------------------------------------
# launching


def _launch(case: str, world: int, env: dict[str, str | None]) -> list[dict]:
    """Runs `world` worker processes of `case` and returns each rank's results."""
    # imported here: this file is also the workers' script, and the plain-CUDA worker must never import torch_fl
    from torch_fl.conformance.launch import child_env

    full_env = child_env(env)
    with tempfile.TemporaryDirectory() as tmp:
        init_file = os.path.join(tmp, "rendezvous")
        outs = [os.path.join(tmp, f"rank{r}.json") for r in range(world)]
        procs = [
            subprocess.Popen(
                [sys.executable, str(HERE), case, str(r), str(world), init_file, outs[r]],
                cwd=REPO,
                env=full_env,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            )
            for r in range(world)
        ]
        logs = []
        try:
            for p in procs:
                logs.append(p.communicate(timeout=TIMEOUT_S)[0])
        finally:
            for p in procs:
                if p.poll() is None:
                    p.kill()
        for r, p in enumerate(procs):
            assert p.returncode == 0 and os.path.exists(outs[r]), f"rank {r} exited {p.returncode}:\n{logs[r]}"
        return [json.loads(Path(o).read_text()) for o in outs]


def _part(results: list[dict], name: str) -> list:
    parts = []
    for rank, result in enumerate(results):
        value = result[name]
        assert not (isinstance(value, dict) and "error" in value), f"rank {rank}, {name}:\n{value.get('error')}"
        parts.append(value)
    return parts


HOST_ENV = {"FLAGOS_PLATFORM": "host_ref"}


@pytest.fixture(scope="module")
def host_run(tmp_path_factory: pytest.TempPathFactory) -> list[dict]:
    """One 2-process run serves every host test; under pytest-xdist the workers share it."""
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        return _launch("host", WORLD, HOST_ENV)
    from filelock import FileLock  # a dependency of torch

    shared = tmp_path_factory.getbasetemp().parent / "flagos_distributed_host_run.json"
    with FileLock(str(shared) + ".lock"):
        if not shared.exists():
            shared.write_text(json.dumps(_launch("host", WORLD, HOST_ENV)))
        return json.loads(shared.read_text())


# ---------------------------------------------------------------------------------------------
# host reference platform, 2 processes over gloo


def test_default_init_picks_the_flagos_backend(host_run):
    for info in _part(host_run, "backend"):
        assert info["group"] == "FlagosProcessGroup"
        assert info["name"] == "flagos"
        assert info["default_for_flagos"] == "flagos"


def test_collectives_equal_plain_cpu_gloo(host_run):
    for rank, (flagos, cpu) in enumerate(
        zip(_part(host_run, "collectives_flagos"), _part(host_run, "collectives_cpu"))
    ):
        assert flagos["devices"] == ["flagos"], flagos["devices"]
        assert flagos["values"].keys() == cpu["values"].keys()
        for name, expected in cpu["values"].items():
            assert flagos["values"][name] == expected, (
                f"rank {rank}: {name}: flagos {flagos['values'][name]} != cpu {expected}"
            )


def test_async_work_future_holds_flagos_tensors(host_run):
    for info in _part(host_run, "future"):
        assert info["device"] == "flagos"
        assert info["value"] == [float(WORLD * WORLD * i + WORLD * (WORLD - 1) // 2) for i in range(4)]
        assert info["same_tensor"]


def test_functional_collectives_on_flagos(host_run):
    for info in _part(host_run, "functional"):
        assert info["all_reduce"] == ["flagos", [float(sum(range(1, WORLD + 1))) * k for k in (1.0, 2.0)]]
        assert info["all_gather_tensor"] == ["flagos", [v * r for r in range(1, WORLD + 1) for v in (1.0, 2.0)]]
        assert info["reduce_scatter_tensor"][0] == "flagos"
    shards = [info["reduce_scatter_tensor"][1] for info in _part(host_run, "functional")]
    assert sum(shards, []) == [float(WORLD * k) for k in range(2 * WORLD)]


def test_ddp_trains_like_plain_cpu_ddp(host_run):
    for info in _part(host_run, "ddp"):
        assert info["param_device"] == "flagos"
        torch.testing.assert_close(info["flagos"], info["cpu"], rtol=1e-5, atol=1e-5)
        assert info["flagos"][0] > info["flagos"][-1]  # it trained
    first, second = _part(host_run, "ddp")
    assert first["flagos"] == second["flagos"], "ranks disagree on the averaged loss"
    assert first["params_equal_across_ranks"] and second["params_equal_across_ranks"]


def test_fsdp2_trains_like_unsharded_single_process(host_run):
    for info in _part(host_run, "fsdp2"):
        assert info["sharded_param_device"] == "flagos"
        assert info["local_shard_rows"] < info["full_rows"]  # really sharded
        torch.testing.assert_close(info["flagos"], info["reference"], rtol=1e-5, atol=1e-5)


# ---------------------------------------------------------------------------------------------
# GPU board: one-process NCCL groups


@pytest.mark.cuda
@needs_cuda
def test_nccl_world1_collectives_and_ddp_equal_plain_cuda():
    flagos = _launch("cuda-flagos", 1, {"FLAGOS_PLATFORM": "nvidia_h200"})[0]
    plain = _launch("cuda-plain", 1, {"FLAGOS_PLATFORM": None, "TORCH_DEVICE_BACKEND_AUTOLOAD": "0"})[0]
    assert _part([plain], "collectives")[0]["devices"] == ["cuda"]
    got, expected = _part([flagos], "collectives")[0], _part([plain], "collectives")[0]
    assert got["devices"] == ["flagos"]
    assert got["backend"] == "flagos" and expected["backend"] == "nccl"
    for name, value in expected["values"].items():
        torch.testing.assert_close(got["values"][name], value, rtol=0, atol=0, msg=name)
    future = _part([flagos], "future")[0]
    assert future["device"] == "flagos" and future["same_tensor"]
    got_ddp, expected_ddp = _part([flagos], "ddp")[0], _part([plain], "ddp")[0]
    assert got_ddp["param_device"] == "flagos"
    torch.testing.assert_close(got_ddp["losses"], expected_ddp["losses"], rtol=1e-4, atol=1e-5)


# ---------------------------------------------------------------------------------------------
# the worker (runs in its own process)


def _model_class():
    import torch.nn as nn

    class Block(nn.Module):
        def __init__(self, d: int, heads: int) -> None:
            super().__init__()
            self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
            self.attn = nn.MultiheadAttention(d, heads, batch_first=True)
            self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))

        def forward(self, x):
            y = self.ln1(x)
            x = x + self.attn(y, y, y, need_weights=False)[0]
            return x + self.mlp(self.ln2(x))

    class TinyTransformer(nn.Module):
        def __init__(self, vocab: int = 50, d: int = 32, heads: int = 4, layers: int = 2) -> None:
            super().__init__()
            self.emb = nn.Embedding(vocab, d)
            self.blocks = nn.ModuleList(Block(d, heads) for _ in range(layers))
            self.head = nn.Linear(d, vocab)

        def forward(self, idx):
            x = self.emb(idx)
            for block in self.blocks:
                x = block(x)
            return self.head(x)

    return TinyTransformer


def _batch(rank: int):
    g = torch.Generator().manual_seed(100 + rank)
    return torch.randint(0, 50, (4, 8), generator=g), torch.randint(0, 50, (4, 8), generator=g)


def _train(model, device: str, rank: int, world: int, group=None, steps: int = 3) -> list[float]:
    """Per-step loss averaged over the ranks (so every rank reports the same numbers)."""
    import torch.distributed as dist
    import torch.nn.functional as F

    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    x, y = (t.to(device) for t in _batch(rank))
    losses = []
    for _ in range(steps):
        opt.zero_grad()
        loss = F.cross_entropy(model(x).flatten(0, 1), y.flatten())
        loss.backward()
        opt.step()
        total = loss.detach().clone()
        dist.all_reduce(total, group=group)
        losses.append(total.item() / world)
    return losses


def _collectives(device: str, rank: int, world: int, group=None) -> dict:
    """The same collectives on `device` tensors; values as plain lists for comparison."""
    import torch.distributed as dist

    v: dict[str, list] = {}
    seen: set[str] = set()

    def t(values, dtype=torch.float32):
        out = torch.tensor(values, dtype=dtype).to(device)
        seen.add(out.device.type)
        return out

    x = t([1.0, 2.0, 3.0, 4.0]) * (rank + 1)
    dist.all_reduce(x, group=group)
    v["all_reduce_sum"] = x.tolist()
    m = t([rank, -rank, 5.0, 2.0 * rank])
    dist.all_reduce(m, op=dist.ReduceOp.MAX, group=group)
    v["all_reduce_max"] = m.tolist()
    i = t([rank + 1, 7], dtype=torch.int64)
    dist.all_reduce(i, group=group)
    v["all_reduce_int64"] = i.tolist()
    b = t([float(rank)] * 3)
    dist.broadcast(b, src=world - 1, group=group)
    v["broadcast"] = b.tolist()
    gathered = [t([0.0, 0.0]) for _ in range(world)]
    dist.all_gather(gathered, t([rank + 1.0, 10.0 * rank]), group=group)
    v["all_gather"] = [g.tolist() for g in gathered]
    into = t([0.0] * (2 * world))
    dist.all_gather_into_tensor(into, t([rank + 1.0, -rank - 1.0]), group=group)
    v["all_gather_into_tensor"] = into.tolist()
    rs = t([0.0, 0.0])
    dist.reduce_scatter(rs, [t([r + rank, r * rank]) for r in range(world)], group=group)
    v["reduce_scatter"] = rs.tolist()
    rst = t([0.0, 0.0])
    dist.reduce_scatter_tensor(rst, t([float(k * (rank + 1)) for k in range(2 * world)]), group=group)
    v["reduce_scatter_tensor"] = rst.tolist()
    if world > 1:
        if rank == 0:
            dist.send(t([7.0, 8.0]), dst=1, group=group)
            v["send_recv"] = [7.0, 8.0]
        else:
            got = t([0.0, 0.0])
            dist.recv(got, src=0, group=group)
            v["send_recv"] = got.tolist()
    dist.barrier(group=group)
    return {"values": v, "devices": sorted(seen)}


def _guard(fn, *args, **kwargs):
    try:
        return fn(*args, **kwargs)
    except Exception:  # noqa: BLE001 - reported to the test, which fails with the traceback
        import traceback

        return {"error": traceback.format_exc()}


def _functional_case(rank: int, world: int) -> dict:
    """Functional collectives (what DTensor uses), entered from C++ rather than through Python."""
    import torch.distributed as dist
    import torch.distributed._functional_collectives as funcol

    group = dist.group.WORLD
    x = torch.tensor([1.0, 2.0]).to("flagos") * (rank + 1)
    results = {
        "all_reduce": funcol.all_reduce(x, "sum", group),
        "all_gather_tensor": funcol.all_gather_tensor(x, 0, group),
        "reduce_scatter_tensor": funcol.reduce_scatter_tensor(torch.arange(2.0 * world).to("flagos"), "sum", 0, group),
    }
    waited = {name: funcol.wait_tensor(t) if hasattr(funcol, "wait_tensor") else t for name, t in results.items()}
    return {name: [t.device.type, t.cpu().tolist()] for name, t in waited.items()}


def _future_case(device: str, world: int) -> dict:
    import torch.distributed as dist

    x = torch.arange(4.0).to(device) * world + torch.distributed.get_rank()
    work = dist.all_reduce(x, async_op=True)
    value = work.get_future().wait()
    work.wait()
    return {
        "device": value[0].device.type,
        "value": value[0].tolist(),
        "same_tensor": value[0].data_ptr() == x.data_ptr(),
    }


def _ddp_case_host(rank: int, world: int) -> dict:
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    model_class = _model_class()
    torch.manual_seed(rank)  # different initial weights per rank: DDP must broadcast rank 0's
    flagos_model = model_class().to("flagos")
    flagos_losses = _train(DDP(flagos_model), "flagos", rank, world)
    gloo = dist.new_group(backend="gloo")
    torch.manual_seed(rank)
    cpu_losses = _train(DDP(model_class(), process_group=gloo), "cpu", rank, world, group=gloo)
    flat = torch.cat([p.detach().flatten() for p in flagos_model.parameters()]).cpu()
    everyone = [torch.empty_like(flat) for _ in range(world)]
    dist.all_gather(everyone, flat, group=gloo)
    return {
        "flagos": flagos_losses,
        "cpu": cpu_losses,
        "param_device": next(flagos_model.parameters()).device.type,
        "params_equal_across_ranks": all(torch.equal(everyone[0], e) for e in everyone),
    }


def _fsdp2_case(rank: int, world: int) -> dict:
    import torch.nn.functional as F
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    model_class = _model_class()
    mesh = init_device_mesh("flagos", (world,))
    torch.manual_seed(0)
    model = model_class().to("flagos")
    full_rows = model.head.weight.shape[0]
    for block in model.blocks:
        fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)
    local = model.head.weight.to_local()
    sharded = _train(model, "flagos", rank, world)

    torch.manual_seed(0)
    reference_model = model_class()
    opt = torch.optim.AdamW(reference_model.parameters(), lr=1e-2)
    xs, ys = zip(*(_batch(r) for r in range(world)))
    x, y = torch.cat(xs), torch.cat(ys)
    reference = []
    for _ in range(3):
        opt.zero_grad()
        loss = F.cross_entropy(reference_model(x).flatten(0, 1), y.flatten())
        loss.backward()
        opt.step()
        reference.append(loss.item())
    return {
        "flagos": sharded,
        "reference": reference,
        "sharded_param_device": local.device.type,
        "local_shard_rows": local.shape[0],
        "full_rows": full_rows,
    }


def _host_worker(rank: int, world: int, init_file: str) -> dict:
    import torch.distributed as dist

    import torch_fl
    from torch_fl.runtime import distributed as flagos_dist

    assert torch_fl.active_platform().name == "host_ref"
    flagos_dist.register("cpu")  # idempotent; the runtime's start() registers it too
    # No backend named: flagos is this process's accelerator, so its default backend is chosen.
    dist.init_process_group(init_method=f"file://{init_file}", rank=rank, world_size=world)
    results = {
        "backend": {
            "group": type(dist.group.WORLD).__name__,
            "name": dist.group.WORLD.name(),
            "default_for_flagos": dist.Backend.default_device_backend_map.get("flagos"),
        }
    }
    results["collectives_flagos"] = _guard(_collectives, "flagos", rank, world)
    gloo = dist.new_group(backend="gloo")
    results["collectives_cpu"] = _guard(_collectives, "cpu", rank, world, gloo)
    results["future"] = _guard(_future_case, "flagos", world)
    results["functional"] = _guard(_functional_case, rank, world)
    results["ddp"] = _guard(_ddp_case_host, rank, world)
    results["fsdp2"] = _guard(_fsdp2_case, rank, world)
    dist.destroy_process_group()
    return results


def _cuda_worker(flagos: bool, init_file: str) -> dict:
    """A one-process NCCL group: on flagos (CUDA backing) or, in a process without torch_fl, plain CUDA."""
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    device = "flagos" if flagos else "cuda"
    if flagos:
        import torch_fl
        from torch_fl.runtime import distributed as flagos_dist

        assert torch_fl.active_platform().descriptor.backing.device == "cuda"
        flagos_dist.register("cuda")
        dist.init_process_group(init_method=f"file://{init_file}", rank=0, world_size=1)
    else:
        assert "torch_fl" not in sys.modules
        dist.init_process_group("nccl", init_method=f"file://{init_file}", rank=0, world_size=1)
    results: dict = {}
    collectives = _guard(_collectives, device, 0, 1)
    if "values" in collectives:
        collectives["backend"] = dist.group.WORLD.name() if flagos else dist.get_backend()
    results["collectives"] = collectives
    results["future"] = _guard(_future_case, device, 1)

    def ddp() -> dict:
        model_class = _model_class()
        torch.manual_seed(0)
        model = model_class().to(device)
        losses = _train(DDP(model), device, 0, 1)
        torch.cuda.synchronize()
        return {"losses": losses, "param_device": next(model.parameters()).device.type}

    results["ddp"] = _guard(ddp)
    dist.destroy_process_group()
    return results


def _main(argv: list[str]) -> None:
    case, rank, world, init_file, out = argv[0], int(argv[1]), int(argv[2]), argv[3], argv[4]
    if case == "host":
        results = _host_worker(rank, world, init_file)
    elif case in ("cuda-flagos", "cuda-plain"):
        results = _cuda_worker(case == "cuda-flagos", init_file)
    else:
        raise SystemExit(f"unknown case {case}")
    Path(out).write_text(json.dumps(results))


if __name__ == "__main__":
    import warnings

    warnings.filterwarnings("ignore")
    _main(sys.argv[1:])
