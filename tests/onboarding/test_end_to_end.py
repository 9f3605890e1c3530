"""End to end, as CI runs it and as an agent following the skills would: onboard a chip into a
temporary platform folder, add one vendor kernel (add-vendor-kernel), run conformance on a subset,
triage it, then load the chip in a fresh process with the vendor route active and train a small
model on it, and count the vendor calls the way the skills do.

Two flows: `demo_chip` on the host backing (CI), and `demo_gpu` made `--like nvidia_h200 --backing
cuda` on a machine with a CUDA device (run on the H200 board; the subset exercises the native and
vendor routes).

Everything runs through the installed `torch-fl` command and fresh interpreters, so nothing of
this test process (its own active platform, its imports) leaks in. Budget: 10 minutes on 2 cores;
the conformance subset is one OpInfo in one dtype with one worker.
"""

from __future__ import annotations

import json
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from cli_session import Session

pytestmark = pytest.mark.slow

OP = "aten::silu"
SUBSET = "nn.functional.silu-float32 or aten::silu-float32"  # the ops suite's item, the sweep suite's item

# What an agent writes in place of the stub: the chip's own SiLU, computed on the backing
# tensor it receives, counting its calls so the test can see the runtime used it.
KERNEL = '''
CALLS = {"silu": 0}


def silu(self: torch.Tensor) -> torch.Tensor:
    """aten::silu: x * sigmoid(x), on the backing tensor."""
    CALLS["silu"] += 1
    return self * torch.sigmoid(self)
'''

TRAIN = textwrap.dedent(
    """
    import json, sys
    import torch
    import torch_fl
    from torch_fl import routing

    active = torch_fl.active_platform()
    explanation = torch_fl.explain("aten::silu")
    vendor = next(p for p in explanation.paths if p.path == "vendor")

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.SiLU(), torch.nn.Linear(32, 1)).to("flagos")
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    x = torch.randn(64, 8)
    y = (x[:, :1] * 2 - x[:, 1:2]).to("flagos")
    x = x.to("flagos")
    routing.reset_stats()
    losses = []
    for _ in range(40):
        optimizer.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    counts = {f"{r.path}:{r.op}": r.calls for r in routing.stats()}
    print(json.dumps({
        "platform": active.name,
        "gate": explanation.gate,
        "candidates": explanation.candidates,
        "python_kernel": explanation.python_kernel,
        "vendor_keys": vendor.validated_keys,
        "vendor_calls": counts.get("vendor:aten::silu", 0),
        "module_calls": sys.modules[f"torch_fl_vendor_{active.name}"].CALLS["silu"],
        "loss_first": losses[0],
        "loss_last": losses[-1],
        "device": str(next(model.parameters()).device),
    }))
    """
)


# The workload script of the skills' last step (`torch-fl routes stats NAME --workload FILE`).
WORKLOAD = textwrap.dedent(
    """
    import torch


    def make_step(device):
        model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.SiLU(), torch.nn.Linear(16, 1)).to(device)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
        x, y = torch.randn(32, 8, device=device), torch.randn(32, 1, device=device)

        def step():
            optimizer.zero_grad()
            torch.nn.functional.mse_loss(model(x), y).backward()
            optimizer.step()

        return step
    """
)


def onboard_to_training(tmp_path: Path, chip: str, onboard_options: list[str], backing: str) -> None:
    root = tmp_path / "repo"
    root.mkdir()
    s = Session(root)
    folder = root / "plats" / chip

    # 1. onboard (onboard-new-chip, step 3)
    onboarded = s.torch_fl("onboard", "--chip", chip, *onboard_options, "--platforms-dir", "plats")
    assert onboarded["ok"] and {f["action"] for f in onboarded["files"]} == {"created"}
    shown = s.torch_fl("platforms", "show", chip)["descriptor"]
    assert shown["backing"]["device"] == backing
    assert shown["kernels"]["vendor"]["ops"] == {"aten::relu": "relu"}

    # 2. add one vendor kernel (add-vendor-kernel, steps 1-2): the command writes a stub, the agent the kernel
    added = s.torch_fl("kernel", "add", chip, "--op", OP)
    assert added["ok"] and added["function"] == "silu" and added["stub_added"]
    module = folder / "vendor_kernels.py"
    text = module.read_text()
    stub = text.index("# STUB(torch-fl kernel add): replace the body of silu")
    module.write_text(text[:stub].rstrip("\n") + "\n\n" + KERNEL)

    # 3. conformance on a subset (add-vendor-kernel, step 3), then triage
    run = s.torch_fl(
        "conformance",
        "run",
        chip,
        "--suite",
        "ops,sweep",
        "-k",
        SUBSET,
        "--paths",
        "native,vendor",
        "-n",
        "1",
        "--add",  # a subset run writes a partial record; --add starts the record the gate reads with it
        timeout=480,
    )
    assert run["ok"] and run["complete"], run
    assert run["by_path"]["vendor"]["passed"] >= 1 and run["owned_failures"] == 0, run
    assert Path(run["record"]) == folder / "records" / Path(run["record"]).name
    triaged = s.torch_fl("triage", chip)
    assert triaged["summary"]["failing_owned"] == 0

    # 4. load the chip in a fresh process: the vendor route is validated and serves training
    result = s.run("train", [sys.executable, "-c", TRAIN], timeout=240, env={"FLAGOS_PLATFORM": chip})
    assert result.returncode == 0, result.stdout + result.stderr[-4000:]
    seen = json.loads(result.stdout.strip().splitlines()[-1])
    assert seen["platform"] == chip and seen["device"].startswith("flagos")
    assert seen["gate"] == "valid" and seen["candidates"][0] == "vendor" and seen["python_kernel"]
    assert any(key.startswith("float32") for key in seen["vendor_keys"]), seen["vendor_keys"]
    assert seen["vendor_calls"] >= 40 and seen["module_calls"] == seen["vendor_calls"]
    assert seen["loss_last"] < 0.5 * seen["loss_first"], seen

    # 5. the skills' own check of the same thing (onboard-new-chip step 8)
    (root / "train_step.py").write_text(WORKLOAD)
    stats = s.torch_fl("routes", "stats", chip, "--workload", "train_step.py", "--steps", "3")
    assert {"op": OP, "path": "vendor", "calls": 3} in stats["counts"], stats["counts"]
    print(s.report())


def test_onboard_add_kernel_conform_load_and_train(tmp_path):
    onboard_to_training(tmp_path, "demo_chip", ["--backing", "cpu"], "cpu")


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (run on the H200 board)")
def test_onboard_like_nvidia_h200_on_cuda(tmp_path):
    onboard_to_training(tmp_path, "demo_gpu", ["--like", "nvidia_h200", "--backing", "cuda"], "cuda")
