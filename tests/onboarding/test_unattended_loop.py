"""The whole loop an agent runs unattended, through `torch-fl ... --json` commands and fresh
interpreters only, as the skills say: onboard a CPU-backed chip `--like host_ref`, write five
vendor kernels by hand (a GEMM in a file of its own, a norm, three elementwise ops), validate them
with a conformance subset, tune the routes, train a model that calls all five, then plant a bug in
the GEMM and re-validate: only the GEMM's cases re-run, the record refuses mm on the vendor path
for every key the bug gets wrong, the other four kernels stay validated, and such an mm call is
answered correctly (by native).

Budget: 10 minutes of tool time on host_ref's 2 cores (`pytest -s` prints the time of each step).
Measured on 2 shared cores (s): onboard 0.5, platforms show 0.8 (two calls), kernel add 10.9 (five
calls), conformance run of the subset 23.1 (-n 2), triage 0.4, routes show 0.4, routes tune 8.8,
train 3.6, routes stats 3.6, triage baseline 0.4, incremental re-run 15.4, triage --against 0.4,
routes explain 2.2, the wrong-call check 2.2: 73 in all.
"""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest
import torch
import yaml
from cli_session import Session

from torch_fl.platform.gating import Gate
from torch_fl.platform.loader import load_descriptor

pytestmark = pytest.mark.slow

CHIP = "loop_chip"
BUDGET_S = 600.0

# aten overload -> (the function `kernel add` names, the OpInfo of the ops suite)
OPS = {
    "aten::mm": ("mm", "mm"),
    "aten::native_layer_norm": ("native_layer_norm", "nn.functional.layer_norm"),
    "aten::silu": ("silu", "nn.functional.silu"),
    "aten::add.Tensor": ("add_tensor", "add"),
    "aten::mul.Tensor": ("mul_tensor", "mul"),
}
DTYPE = "float32"
# the ops suite's item and the sweep suite's item of each op, bracketed so that `mm` selects no addmm
SUBSET = " or ".join(f"test_op[{opinfo}-{DTYPE}] or test_sweep[{op}-{DTYPE}]" for op, (_, opinfo) in OPS.items())
GEMM_FILE = "gemm.py"

# What the agent writes: the GEMM in a file of its own, accumulating in float64 (complex128).
GEMM = '''"""The chip's GEMM (aten::mm), on the backing tensors."""

import torch


def mm(self: torch.Tensor, mat2: torch.Tensor) -> torch.Tensor:
    """aten::mm: accumulate in double precision, round once to the inputs' dtype."""
    if self.dim() != 2 or mat2.dim() != 2:
        raise RuntimeError("self must be a matrix" if self.dim() != 2 else "mat2 must be a matrix")
    if self.dtype != mat2.dtype:
        raise RuntimeError(f"expected m1 and m2 to have the same dtype, but got: {self.dtype} != {mat2.dtype}")
    if self.shape[1] != mat2.shape[0]:
        raise RuntimeError(
            f"mat1 and mat2 shapes cannot be multiplied ({self.shape[0]}x{self.shape[1]} and "
            f"{mat2.shape[0]}x{mat2.shape[1]})"
        )
    if not (self.is_floating_point() or self.is_complex()):
        return torch.matmul(self, mat2)
    wide = torch.complex128 if self.is_complex() else torch.float64
    return torch.matmul(self.to(wide), mat2.to(wide)).to(self.dtype)
'''

# The planted bug: 1% off whenever the reduction is longer than 64. The sweep's GEMMs reach
# 17x65 @ 65x33 in float32 (the largest extents the gate lets the kernel serve): the probe call.
GEMM_BUG = GEMM.replace(
    "    return torch.matmul(self.to(wide), mat2.to(wide)).to(self.dtype)\n",
    "    out = torch.matmul(self.to(wide), mat2.to(wide))\n"
    "    if self.shape[1] > 64:\n"
    "        out = out * 1.01\n"
    "    return out.to(self.dtype)\n",
)
PROBE = (17, 65, 33)  # M, K, N

# The other four, in the vendor module; mm comes from gemm.py by name (so that an edit of gemm.py
# decides only mm's cases).
KERNELS = '''
from gemm import mm  # noqa: E402,F401  (aten::mm: the chip's GEMM, in a file of its own)

CALLS = {"native_layer_norm": 0, "silu": 0, "add_tensor": 0, "mul_tensor": 0}

_NARROW = (torch.float32, torch.float16, torch.bfloat16)


def native_layer_norm(input, normalized_shape, weight, bias, eps):
    """aten::native_layer_norm: (out, mean, rstd), the statistics over the last dims, in float32
    (float64 for float64 inputs), rounded to the input's dtype."""
    CALLS["native_layer_norm"] += 1
    axis = input.dim() - len(normalized_shape)
    if axis < 0 or tuple(input.shape[axis:]) != tuple(normalized_shape):
        raise RuntimeError(f"normalized_shape {list(normalized_shape)} does not end input's shape {list(input.shape)}")
    dims = tuple(range(axis, input.dim()))
    wide = torch.float64 if input.dtype == torch.float64 else torch.float32
    x = input.to(wide)
    n = 1
    for size in normalized_shape:
        n *= size
    if n == 0:
        stats = input.shape[:axis] + (1,) * len(normalized_shape)
        mean = torch.zeros(stats, dtype=input.dtype)
        return input.clone(), mean, torch.full(stats, float("nan"), dtype=input.dtype)
    mean = x.sum(dim=dims, keepdim=True) / n
    # as PyTorch's rowwise moments: a row holding inf or nan has no mean (nan), not +-inf
    mean = torch.where(torch.isfinite(x).all(dim=dims, keepdim=True), mean, float("nan"))
    centered = x - mean
    rstd = torch.rsqrt((centered * centered).sum(dim=dims, keepdim=True) / n + eps)
    out = centered * rstd
    if weight is not None:
        out = out * weight.to(wide)
    if bias is not None:
        out = out + bias.to(wide)
    return out.to(input.dtype).contiguous(), mean.to(input.dtype), rstd.to(input.dtype)


def silu(self):
    """aten::silu: x * sigmoid(x), in float32 for narrower floats."""
    CALLS["silu"] += 1
    if self.dtype in (torch.float16, torch.bfloat16):
        x = self.float()
        return (x * torch.sigmoid(x)).to(self.dtype)
    return self * torch.sigmoid(self)


def _wide(value):
    return value.to(torch.float64) if isinstance(value, torch.Tensor) else value


def add_tensor(self, other, *, alpha=1):
    """aten::add.Tensor: self + alpha * other, exact in float64 for float32 and narrower, rounded once."""
    CALLS["add_tensor"] += 1
    dtype = torch.result_type(self, other)
    if dtype in _NARROW:
        a, b = _wide(self), _wide(other)
        return (a + b * alpha if alpha != 1 else a + b).to(dtype)
    return self + other * alpha if alpha != 1 else self + other


def mul_tensor(self, other):
    """aten::mul.Tensor: exact in float64 for float32 and narrower, rounded once."""
    CALLS["mul_tensor"] += 1
    dtype = torch.result_type(self, other)
    if dtype in _NARROW:
        return (_wide(self) * _wide(other)).to(dtype)
    return self * other
'''

# The workload of tune-routes and routes stats (`make_step(device)`), and the model trained: every
# call of the five ops is in it (mm forward and backward, layer norm, silu, add, mul).
WORKLOAD = textwrap.dedent(
    """
    import torch


    class Block(torch.nn.Module):
        def __init__(self, width=32):
            super().__init__()
            self.w1 = torch.nn.Parameter(torch.randn(8, width) * 0.3)
            self.norm = torch.nn.LayerNorm(width)
            self.w2 = torch.nn.Parameter(torch.randn(width, 1) * 0.2)

        def forward(self, x):
            h = self.norm(x @ self.w1)  # aten::mm, aten::native_layer_norm
            h = torch.nn.functional.silu(h) * h + h  # aten::silu, aten::mul.Tensor, aten::add.Tensor
            return h @ self.w2


    def data(device):
        x = torch.randn(64, 8)
        y = x[:, :1] * 2 - x[:, 1:2]
        return x.to(device), y.to(device)


    def make_step(device):
        torch.manual_seed(0)
        model = Block().to(device)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
        x, y = data(device)

        def step():
            optimizer.zero_grad()
            loss = torch.nn.functional.mse_loss(model(x), y)
            loss.backward()
            optimizer.step()
            return loss

        return step
    """
)

# Train in a fresh interpreter with the tuned table, then with the five ops put vendor first
# (still gated) for a few steps: the table decides the first phase, the kernels serve the second.
TRAIN = (
    textwrap.dedent(
        """
    import json, sys
    import torch
    import torch_fl
    from torch_fl import routing
    from train_step import make_step

    OPS = OPS_PLACEHOLDER
    active = torch_fl.active_platform()

    def counts():
        return {f"{r.path}:{r.op}": r.calls for r in routing.stats()}

    def module_calls():  # the vendor module is loaded by the first call a vendor kernel serves
        module = sys.modules.get(f"torch_fl_vendor_{active.name}")
        return dict(module.CALLS) if module is not None else {}

    step = make_step("flagos")
    routing.reset_stats()
    losses = [step().item() for _ in range(40)]
    tuned = counts()
    module_tuned = module_calls()
    for op in OPS:
        routing.set_route(op, ["vendor", "native"])
    routing.reset_stats()
    for _ in range(3):
        losses.append(step().item())
    vendor_first = counts()
    m, k, n = PROBE
    a, b = torch.randn(m, k), torch.randn(k, n)
    routing.reset_stats()
    probe = (a.to("flagos") @ b.to("flagos")).cpu()
    print(json.dumps({
        "platform": active.name,
        "device": "flagos",
        "explain": {op: torch_fl.explain(op).as_dict() for op in OPS},
        "tuned_counts": tuned,
        "module_tuned": module_tuned,
        "vendor_first_counts": vendor_first,
        "probe_counts": counts(),
        "probe_error": (probe.double() - a.double() @ b.double()).abs().max().item(),
        "module_total": module_calls(),
        "losses": losses,
    }))
    """
    )
    .replace("OPS_PLACEHOLDER", repr(list(OPS)))
    .replace("PROBE", repr(PROBE))
)

# After the planted bug: an mm the bug gets wrong, on flagos with vendor first (still gated).
BUGGY_CALL = textwrap.dedent(
    f"""
    import json, sys
    import torch
    import torch_fl
    from torch_fl import routing

    routing.set_route("aten::mm", ["vendor", "native"])
    torch.manual_seed(1)
    m, k, n = {PROBE!r}
    a, b = torch.randn(m, k, dtype=torch.float64), torch.randn(k, n, dtype=torch.float64)
    expected = (a @ b).float()
    a, b = a.float(), b.float()
    routing.reset_stats()
    got = (a.to("flagos") @ b.to("flagos")).cpu()
    counts = {{f"{{r.path}}:{{r.op}}": r.calls for r in routing.stats()}}
    sys.path.insert(0, sys.argv[1])
    import gemm
    print(json.dumps({{
        "served_error": (got - expected).abs().max().item(),
        "bug_error": (gemm.mm(a, b) - expected).abs().max().item(),
        "scale": expected.abs().max().item(),
        "counts": counts,
        "served_by": torch_fl.explain("aten::mm").served_by,
    }}))
    """
)


def write_kernels(folder: Path) -> None:
    """Replace the five stubs `kernel add` appended with the kernels above (the agent's step 2)."""
    module = folder / "vendor_kernels.py"
    text = module.read_text()
    first_stub = text.index("# STUB(torch-fl kernel add)")
    module.write_text(text[:first_stub].rstrip("\n") + "\n\n" + KERNELS)
    (folder / GEMM_FILE).write_text(GEMM)


def vendor_keys(gate: Gate, op: str) -> set[str]:
    return set(gate.proven_keys(op, "vendor"))


def test_onboard_five_kernels_validate_tune_train_and_catch_a_planted_gemm_bug(tmp_path: Path) -> None:
    root = tmp_path / "repo"
    root.mkdir()
    s = Session(root)
    folder = root / "plats" / CHIP
    try:
        _loop(s, root, folder)
    finally:
        print(s.report())
    assert sum(s.timings.values()) <= BUDGET_S, s.report()


def _loop(s: Session, root: Path, folder: Path) -> None:
    # 1. onboard a CPU-backed chip like host_ref (onboard-new-chip, steps 3-4)
    onboarded = s.torch_fl("onboard", "--chip", CHIP, "--like", "host_ref", "--platforms-dir", "plats")
    assert onboarded["ok"] and {f["action"] for f in onboarded["files"]} == {"created"}, onboarded
    shown = s.torch_fl("platforms", "show", CHIP)
    assert shown["descriptor"]["backing"]["device"] == "cpu"

    # 2. five vendor kernels (add-vendor-kernel, steps 1-2)
    for op, (function, _) in OPS.items():
        added = s.torch_fl("kernel", "add", CHIP, "--op", op, label="kernel add")
        assert added["ok"] and added["function"] == function and added["stub_added"], added
    write_kernels(folder)
    shown = s.torch_fl("platforms", "show", CHIP, label="platforms show")
    assert {op: f for op, f in shown["descriptor"]["kernels"]["vendor"]["ops"].items() if op in OPS} == {
        op: function for op, (function, _) in OPS.items()
    }

    # 3. validate: the five ops' items, native and vendor, starting the record the gate reads
    run = s.torch_fl(
        "conformance",
        "run",
        CHIP,
        "--suite",
        "ops,sweep",
        "-k",
        SUBSET,
        "--paths",
        "native,vendor",
        "-n",
        "2",
        "--add",
        timeout=420,
        label="conformance run (validate)",
    )
    assert run["ok"] and run["complete"] and not run["partial"], run
    assert run["owned_failures"] == 0 and run["by_path"]["vendor"]["passed"] > 0, run
    triaged = s.torch_fl("triage", CHIP)
    assert triaged["summary"]["failing_owned"] == 0, triaged["summary"]
    descriptor = load_descriptor(folder)
    gate = Gate.for_platform(descriptor, torch.__version__)
    assert gate.state == "valid"
    validated = {op: vendor_keys(gate, op) for op in OPS}
    for op, keys in validated.items():
        assert any(key.startswith(DTYPE) for key in keys), (op, keys)

    # 4. tune on the training workload (tune-routes, steps 1 and 3), bounded
    shown = s.torch_fl("routes", "show", CHIP)
    assert shown["ok"] and shown["record"] == "valid", shown
    (root / "train_step.py").write_text(WORKLOAD)
    tuned = s.torch_fl(
        "routes", "tune", CHIP, "--workload", "train_step.py", "--steps", "3", "--budget", "60", timeout=300
    )
    assert tuned["ok"] and tuned["written"] == tuned["changes_table"], tuned
    table = yaml.safe_load((folder / "routes.yaml").read_text())["ops"]
    assert Path(tuned["routes_file"]).resolve() == (folder / "routes.yaml").resolve()
    unmeasured_ops = {entry.split(" <= ")[0] for entry in tuned["unmeasured"]}
    for op in tuned["demoted"]:
        assert table[op]["candidates"][0] == "native", (op, table[op])
    for op, buckets in tuned["chosen"].items():
        assert [{k: b[k] for k in ("max_numel", "choice")} for b in table[op]["buckets"]] == [
            {k: b[k] for k in ("max_numel", "choice")} for b in buckets
        ], (op, table[op], buckets)
    measured = {m["op"] for m in tuned["measurements"]}
    assert set(OPS) <= measured | unmeasured_ops, tuned  # the workload calls all five
    for op in unmeasured_ops - measured:
        assert table[op]["candidates"][0] == "vendor", (op, table[op])  # the budget left it as it was

    # 5. train in a fresh interpreter: the tuned table decides who serves, the kernels serve when first
    seen = s.python("train", TRAIN, env={"FLAGOS_PLATFORM": CHIP})
    assert seen["platform"] == CHIP
    losses = seen["losses"]
    assert losses[39] < 0.5 * losses[0], losses
    functions = {op: function for op, (function, _) in OPS.items()}
    for op in OPS:
        route = table[op]
        vendor_buckets = [b for b in route.get("buckets", []) if b["choice"] == "vendor"]
        explained = seen["explain"][op]
        assert explained["gate"] == "valid"
        calls = seen["tuned_counts"].get(f"vendor:{op}", 0)
        if route["candidates"][0] != "vendor" and not vendor_buckets:
            assert calls == 0, (op, route, seen["tuned_counts"])  # demoted: native serves every call
        else:
            assert calls > 0, (op, route, seen["tuned_counts"])
        if op != "aten::mm":
            assert seen["module_tuned"].get(functions[op], 0) == calls, (op, seen["module_tuned"], calls)
        # vendor first: the validated kernel serves the training's calls
        assert seen["vendor_first_counts"].get(f"vendor:{op}", 0) > 0, (op, seen["vendor_first_counts"])
    # the GEMM serves the probe call while it is right (what the planted bug will get wrong)
    assert seen["probe_counts"].get("vendor:aten::mm") == 1, seen["probe_counts"]
    assert seen["probe_error"] < 1e-4, seen["probe_error"]
    stats = s.torch_fl("routes", "stats", CHIP, "--workload", "train_step.py", "--steps", "2")
    for op in OPS:
        route = table[op]
        vendor_buckets = [b for b in route.get("buckets", []) if b["choice"] == "vendor"]
        rows = [c for c in stats["counts"] if c["op"] == op and c["path"] == "vendor"]
        if route["candidates"][0] == "vendor" or vendor_buckets:
            assert rows and rows[0]["calls"] > 0, (op, stats["counts"])
        else:
            assert not rows, (op, stats["counts"])

    # 6. plant a bug in the GEMM and re-validate (change-a-kernel): only mm's cases re-run
    before = s.torch_fl("triage", CHIP, label="triage (baseline)")
    (root / "before.json").write_text(json.dumps(before))
    (folder / GEMM_FILE).write_text(GEMM_BUG)
    again = s.torch_fl("conformance", "run", CHIP, timeout=300, label="conformance run (re-validate)")
    assert again["ok"] and again["complete"] and not again["partial"], again
    assert again["incremental"] is not None, again
    assert again["incremental"]["changed"] == [GEMM_FILE], again["incremental"]
    assert again["incremental"]["ops"] == ["aten::mm"], again["incremental"]
    assert again["owned_failures"] > 0, again
    compared = s.torch_fl("triage", CHIP, "--against", "before.json", label="triage (against)")
    broken = compared["comparison"]["new_failures"]
    assert broken, compared["comparison"]
    assert all("/aten::mm/" in case for case in broken), broken

    gate = Gate.for_platform(load_descriptor(folder), torch.__version__)
    assert gate.state == "valid"
    for key in validated["aten::mm"]:
        assert not gate.allows("aten::mm", key, "vendor"), key  # every float32 mm key: the bug is wrong there
    assert not any(k.startswith(DTYPE) for k in vendor_keys(gate, "aten::mm"))
    for op in OPS:
        if op != "aten::mm":
            assert vendor_keys(gate, op) == validated[op], op
    explained = s.torch_fl("routes", "explain", CHIP, "aten::mm")
    vendor = next(p for p in explained["paths"] if p["path"] == "vendor")
    assert not any(k.startswith(DTYPE) for k in vendor["validated_keys"]), vendor

    # an mm the bug gets wrong is answered correctly, by native
    call = s.python("buggy mm call", BUGGY_CALL, str(folder), timeout=120, env={"FLAGOS_PLATFORM": CHIP})
    assert call["bug_error"] > 1e-3 * call["scale"], call  # the kernel is wrong for this call
    assert call["served_error"] <= 1e-4 * call["scale"], call
    assert call["counts"].get("vendor:aten::mm", 0) == 0, call
