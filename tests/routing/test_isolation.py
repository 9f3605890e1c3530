"""A kernel that takes its process down costs only itself: in the tuner (one sample keeps native)
and in the training benchmark (one side is reported failed, the others are measured).

The platform is a chip onboarded into a temporary folder whose vendor `relu` and `gelu` segfault
and whose vendor `neg` is right; FLAGOS_ALLOW_UNVALIDATED lets them run without a record.
"""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from torch_fl.platform.record import load_evidence

pytestmark = pytest.mark.slow  # benchmarks and tuner runs in child processes

ROOT = Path(__file__).resolve().parents[2]

VENDOR = """
import ctypes

import torch


def _crash() -> None:
    ctypes.string_at(0)  # a segfault, as a kernel that faults the device would end its process


def relu(self: torch.Tensor) -> torch.Tensor:
    _crash()
    return torch.clamp_min(self, 0)


def gelu(self: torch.Tensor, approximate: str = "none") -> torch.Tensor:
    _crash()
    return torch.nn.functional.gelu(self, approximate=approximate)


def neg(self: torch.Tensor) -> torch.Tensor:
    return torch.neg(self)
"""

OPS = "      aten::relu: relu\n      aten::gelu: gelu\n      aten::neg: neg\n"

WORKLOAD = """
import torch


def make_step(device):
    x = torch.randn(256, 64, device=device)
    return lambda: x.relu().neg()
"""


@pytest.fixture
def crash_chip(tmp_path: Path) -> Callable[..., subprocess.CompletedProcess]:
    """Runs a command in tmp_path with the crashing chip on the platform path."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLAGOS_")}
    env.update(FLAGOS_PLATFORM_PATH=str(tmp_path / "plats"), FLAGOS_ALLOW_UNVALIDATED="1", PYTHONUNBUFFERED="1")
    run = functools.partial(subprocess.run, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=400)
    command = str(Path(sys.executable).with_name("torch-fl"))
    onboarded = run(
        [command, "onboard", "--chip", "crash_chip", "--backing", "cpu", "--platforms-dir", "plats", "--json"]
    )
    assert onboarded.returncode == 0, onboarded.stderr
    folder = tmp_path / "plats" / "crash_chip"
    (folder / "vendor_kernels.py").write_text(VENDOR)
    descriptor = folder / "platform.yaml"
    descriptor.write_text(descriptor.read_text().replace("      aten::relu: relu\n", OPS))
    routes = "format: 1\nops:\n"
    for op in ("relu", "neg"):  # native first: only the tuner tries vendor
        routes += f"  aten::{op}:\n    candidates: [native, vendor]\n"
    routes += "  aten::gelu:\n    candidates: [vendor, native]\n"  # vendor first: what the platform's table runs
    (folder / "routes.yaml").write_text(routes)

    def invoke(*argv: str, **extra_env: str) -> subprocess.CompletedProcess:
        program = [command, *argv[1:]] if argv[0] == "torch-fl" else [sys.executable, *argv]
        return run(program, env={**env, **extra_env})

    return invoke


def test_the_tuner_loses_only_the_crashing_sample(crash_chip, tmp_path):
    (tmp_path / "workload.py").write_text(WORKLOAD)
    tuned = crash_chip(
        "torch-fl", "routes", "tune", "crash_chip", "--workload", "workload.py", "--steps", "1", "--dry-run", "--json"
    )
    assert tuned.returncode == 0, tuned.stdout + tuned.stderr[-3000:]
    report: dict[str, Any] = json.loads(tuned.stdout)
    by_op = {m["op"]: m for m in report["measurements"]}
    assert set(by_op) == {"aten::relu", "aten::neg"}
    assert "the measuring process died" in by_op["aten::relu"]["errors"]["worker"] and not by_op["aten::relu"]["us"]
    assert set(by_op["aten::neg"]["us"]) == {"native", "vendor"} and not by_op["aten::neg"]["errors"]
    assert "aten::relu" not in report["chosen"] and not report["written"]


def test_the_benchmark_reports_a_dying_side_and_measures_the_others(crash_chip, tmp_path):
    out = tmp_path / "bench.json"
    bench = crash_chip(
        str(ROOT / "bench" / "train_step.py"),
        "--variants",
        "native-only,tuned",
        "--steps",
        "1",
        "--rounds",
        "1",
        "--warmup",
        "1",
        "--json",
        str(out),
        FLAGOS_PLATFORM="crash_chip",
    )
    assert bench.returncode == 1, bench.stdout + bench.stderr[-3000:]
    assert "flagos tuned" in bench.stdout and "FAILED (exit" in bench.stdout, bench.stdout
    summary = json.loads(out.read_text())
    assert set(summary["sides"]) == {"plain eager", "flagos native-only"} and set(summary["failed"]) == {"flagos tuned"}
    assert summary["losses_agree"] == {"native-only": True} and not summary["all_agree"]


@pytest.mark.parametrize("fault", ["crash", "wrong"])
def test_the_workload_suite_keeps_a_route_that_breaks_training_off(crash_chip, tmp_path, fault):
    """The vendor gelu breaks the decoder (it segfaults, or gives zeros): its workload case fails,
    and with that record the gate refuses it, while the right vendor ones_like it also reaches is
    allowed."""
    folder = tmp_path / "plats" / "crash_chip"
    kernels = folder / "vendor_kernels.py"
    kernels.write_text(
        kernels.read_text() + "\n\ndef ones_like(self, **kwargs):\n    return torch.ones_like(self, **kwargs)\n"
    )
    descriptor = folder / "platform.yaml"
    descriptor.write_text(
        descriptor.read_text().replace(
            "      aten::neg: neg\n", "      aten::neg: neg\n      aten::ones_like: ones_like\n"
        )
    )
    routes = folder / "routes.yaml"
    routes.write_text(routes.read_text() + "  aten::ones_like:\n    candidates: [native, vendor]\n")
    if fault == "wrong":
        kernels.write_text(
            kernels.read_text().replace(
                "    _crash()\n    return torch.nn.functional.gelu(self, approximate=approximate)",
                "    return torch.zeros_like(self)",
            )
        )
        # a person kept it off in the table: the suite still checks it, for whoever reorders the routes
        routes.write_text(
            routes.read_text().replace(
                "  aten::gelu:\n    candidates: [vendor, native]\n", "  aten::gelu:\n    candidates: [native]\n"
            )
        )
    # --add: this subset starts the record the gate reads (without it, a partial record beside it)
    run = crash_chip(*"torch-fl conformance run crash_chip --suite workload --paths vendor -n 1 --add --json".split())
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-3000:]
    record_file = folder / "records" / Path(json.loads(run.stdout)["record"]).name
    cases = {c.id: c for c in load_evidence(record_file)}
    gelu = cases["workload/vendor/aten::gelu"]
    assert gelu.status == ("crashed" if fault == "crash" else "failed"), gelu
    if fault == "wrong":
        assert "depart from native" in gelu.message
    assert cases["workload/vendor/aten::ones_like"].status == "passed"
    # the failing run vetoes every gate key gelu ran with; a run that trains proves no key by itself
    gate = json.loads(record_file.read_text())["gate"]
    assert set(gate["aten::gelu"]["vendor"].values()) == {"failed"}
    assert "aten::ones_like" not in gate
    # the gate, asked with every op on vendor first over an empty table (the benchmark's
    # flaggems-first variant), refuses the kernel that broke training for every key
    empty = tmp_path / "empty_routes.yaml"
    empty.write_text("format: 1\nops: {}\n")
    explained = crash_chip(
        "torch-fl",
        "routes",
        "explain",
        "crash_chip",
        "aten::gelu",
        "--json",
        FLAGOS_ALLOW_UNVALIDATED="0",
        FLAGOS_ROUTES=str(empty),
        FLAGOS_ROUTE_DEFAULTS="vendor,native",
    )
    paths = {p["path"]: p for p in json.loads(explained.stdout)["paths"]}
    assert paths["vendor"]["validated_keys"] == [], explained.stdout
