"""Declared limits: a vendor that knows where its kernel breaks says so, and keeps the rest.

fixtures/sweep_chip's matmuls break past a K drawn at random for this run: `mm` hangs and `bmm`
(split-K at small M x N) is wrong. Undeclared, either refuses its dtypes at every size
(test_sweep_chip.py). Here the descriptor declares `K: {max: threshold}` for both: conformance
skips the cases beyond, tries both sides of the limit (the side beyond fails and refuses
nothing), proves the kernels inside; the runtime serves them by `vendor` up to the limit and
sends calls past it to native, counted in the C++ filter and shown by `routes explain`.
"""

from __future__ import annotations

import json
import random
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from conformance_helpers import FIXTURES, cases_by_id, conformance, run_env

from torch_fl.conformance.sizes import SIZES

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def limited_run(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    plats = tmp_path_factory.mktemp("plats")
    shutil.copytree(FIXTURES / "sweep_chip", plats / "sweep_chip")
    rng = random.Random()
    thresholds = {
        "crash_numel": 10**9,
        "hang_k": rng.choice([k for _, _, k in SIZES["matmul"] if 100 <= k < 4096]) + rng.randint(0, 1),
        "wrong_numel": 10**9,
        "norm_hidden": 10**9,
        "expanded_numel": 0,
        "split_k": rng.randint(1024, 8191),
    }
    descriptor = plats / "sweep_chip" / "platform.yaml"
    data = yaml.safe_load(descriptor.read_text())
    data["kernels"]["vendor"]["constraints"] = {
        "aten::mm": {"K": {"max": thresholds["hang_k"]}},
        "aten::bmm": {"K": {"max": thresholds["split_k"]}},
    }
    descriptor.write_text(yaml.safe_dump(data, sort_keys=False))
    env = run_env(FLAGOS_PLATFORM_PATH=str(plats), SWEEP_CHIP_THRESHOLDS=json.dumps(thresholds))
    out = conformance(
        [
            "sweep_chip",
            "--suite",
            "sweep",
            "--paths",
            "native,vendor",
            "-k",
            "mm",
            "-n",
            "2",
            "--timeout",
            "10",
            "--add",
        ],
        env,
        timeout=1200,
    )
    record = json.loads(Path(out["record"]).read_text())
    return {"out": out, "env": env, "t": thresholds, "record": record, "cases": cases_by_id(Path(out["record"]))}


def _vendor_cases(run: dict[str, Any], op: str) -> dict[str, dict[str, Any]]:
    prefix = f"sweep/{op}/float32/vendor/"
    return {i.removeprefix(prefix): c for i, c in run["cases"].items() if i.startswith(prefix)}


@pytest.mark.parametrize(("op", "threshold"), [("aten::mm", "hang_k"), ("aten::bmm", "split_k")])
def test_limits_are_tried_on_both_sides_and_the_far_side_refuses_nothing(limited_run, op, threshold):
    t = limited_run["t"][threshold]
    cases = _vendor_cases(limited_run, op)
    at = [c for n, c in cases.items() if n.startswith(f"limit=K,size=17x33x{t}/")]
    past = [c for n, c in cases.items() if n.startswith(f"limit=K,size=17x33x{t + 1}")]
    assert at and {c["status"] for c in at} == {"passed"}, (t, at)
    assert past and all(c["status"] in ("failed", "timeout") and c["outside_constraints"] for c in past), (t, past)
    beyond = [c for n, c in cases.items() if n.startswith("vary=K,") and int(n.split("x")[-1].split("/")[0]) > t]
    assert beyond and {c["status"] for c in beyond} == {"skipped"}, beyond  # never run past the limit
    assert all("outside the limits vendor declares" in c["message"] for c in beyond)
    verdicts = limited_run["record"]["gate"][op]["vendor"]
    assert verdicts and "failed" not in verdicts.values(), verdicts
    reached = limited_run["record"]["limits"][op]["vendor"]["float32,float32"]
    assert reached["K"] == t, reached  # proven up to the limit, the probe past it taught nothing


PROGRAM = r"""
import json, sys, torch, torch_fl
from torch_fl.routing import explain, stats
t = json.loads(sys.argv[1])
for op, k in ((torch.mm, t["hang_k"]), (torch.bmm, t["split_k"])):
    for kk in (k, k + 1, 2 * k):
        a, b = torch.randn(17, kk), torch.randn(kk, 33)
        if op is torch.bmm:
            a, b = a[None].expand(2, -1, -1).contiguous(), b[None].expand(2, -1, -1).contiguous()
        got = op(a.to("flagos"), b.to("flagos")).cpu()
        assert torch.allclose(got, op(a, b), atol=1e-2), (op, kk)
calls = {f"{r.op} {r.path}": r.calls for r in stats()}
print(json.dumps({"calls": calls, "mm": explain("aten::mm").as_dict(), "bmm": explain("aten::bmm").as_dict()}))
"""


def test_runtime_serves_inside_the_limit_and_sends_the_rest_on(limited_run):
    proc = subprocess.run(
        [sys.executable, "-c", PROGRAM, json.dumps(limited_run["t"])],
        env={**limited_run["env"], "FLAGOS_PLATFORM": "sweep_chip"},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, f"{limited_run['t']}:\n{proc.stderr[-3000:]}"
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    for op in ("aten::mm", "aten::bmm"):
        assert out["calls"].get(f"{op} vendor") == 1, out["calls"]  # K at the limit
        explained = out[op.removeprefix("aten::")]
        assert sum(explained["outside"].values()) == 2, explained  # K one past and twice the limit
        vendor = next(p for p in explained["paths"] if p["path"] == "vendor")
        t = limited_run["t"]["hang_k" if op == "aten::mm" else "split_k"]
        same = [limits for key, limits in vendor["limits"].items() if key.startswith("float32,float32@")]
        assert same and {limits["K"][1] for limits in same} == {t}, vendor
