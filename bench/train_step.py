"""A decoder-only transformer training step (AdamW) on flagos against the plain backing device.

    python bench/train_step.py                                   # host_ref: config tiny, fp32
    FLAGOS_PLATFORM=nvidia_h200 python bench/train_step.py       # CUDA: config large, bf16
    python bench/train_step.py --config small --steps 20 --json out.json --profile prof.json

The model, its data and its initial weights come from torch_fl/workloads/decoder.py, seeded alike
for both sides. Printed: ms per step (back-to-back steps, one synchronisation at the end), the
throughput ratio flagos/plain, host enqueue time per step (the Python time to issue one step, the
device idle before it), device time per step (events around one step), peak memory, and the
per-step losses of both sides, which must agree (exit status 1 if they do not).

On a CUDA backing the plain reference runs in a subprocess that never imports torch_fl (a process
where flagos is registered cannot run autograd over plain CUDA tensors; see torch_fl.activation):
the script re-runs itself with --reference and TORCH_DEVICE_BACKEND_AUTOLOAD=0 and reads its JSON.
On the host both run in this process, one after the other.

--profile OUT writes, for both sides, the top 30 ops by total host (CPU-side) time of a few
profiled steps, with their self times and call counts.
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import torch

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_CONFIG = {"cpu": "tiny", "cuda": "large"}
LOSSES_SHOWN = 8
# Relative agreement required between the per-step losses of flagos and plain.
LOSS_RTOL = {"cpu": 1e-4, "cuda": 2e-2}


def workload() -> ModuleType:
    """torch_fl/workloads/decoder.py loaded by path: the reference process must not import torch_fl
    (importing the package activates flagos), and this file needs only torch."""
    path = ROOT / "torch_fl" / "workloads" / "decoder.py"
    spec = importlib.util.spec_from_file_location("flagos_bench_decoder", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


DeviceApi = tuple[Callable[[], None], Callable[..., object] | None, Callable[[], int], Callable[[], None]]


def device_api(device: str) -> DeviceApi:
    """(synchronize, Event factory or None, peak memory, reset peak) for `device`."""
    if device == "cpu":
        return (lambda: None), None, (lambda: -1), (lambda: None)
    module = torch.cuda if device == "cuda" else getattr(torch, device)
    return module.synchronize, module.Event, module.max_memory_allocated, module.reset_peak_memory_stats


class Side:
    """One side of the comparison: the workload built on `device`, warmed up, timed on demand."""

    def __init__(self, device: str, backing: str, config: str, warmup: int) -> None:
        decoder = workload()
        self.device, self.backing, self.config = device, backing, config
        self.c = decoder.CONFIGS[config]
        self.dtype = torch.bfloat16 if backing == "cuda" else torch.float32
        self.sync, self.event, self.peak, reset_peak = device_api(device)
        reset_peak()
        _, _, self.step = decoder.build(self.c, device, self.dtype)
        self.losses = [self.step() for _ in range(warmup)]
        self.sync()
        self.ms_per_step: list[float] = []
        self.enqueue_ms: list[float] = []
        self.device_ms: list[float] = []

    def throughput_round(self, steps: int) -> None:
        """Back-to-back steps, one synchronisation at the end."""
        self.sync()
        start = time.perf_counter()
        self.losses += [self.step() for _ in range(steps)]
        self.sync()
        self.ms_per_step.append((time.perf_counter() - start) / steps * 1e3)

    def enqueue_round(self, steps: int) -> None:
        """One step at a time with the device idle before each: host enqueue and device time."""
        for _ in range(steps):
            self.sync()
            begin = end = None
            if self.event is not None:
                begin, end = self.event(enable_timing=True), self.event(enable_timing=True)
            if begin is not None:
                begin.record()
            t0 = time.perf_counter()
            self.losses.append(self.step())
            self.enqueue_ms.append((time.perf_counter() - t0) * 1e3)
            if end is not None:
                end.record()
            self.sync()
            if begin is not None and self.backing == "cuda":
                self.device_ms.append(begin.elapsed_time(end))

    def result(self, profile_steps: int) -> dict:
        peak = self.peak()
        result = {
            "device": self.device,
            "backing": self.backing,
            "config": self.config,
            "dims": {k: getattr(self.c, k) for k in ("vocab", "dim", "heads", "layers", "seq", "batch")},
            "parameters": self.c.parameters,
            "dtype": str(self.dtype).removeprefix("torch."),
            "ms_per_step": statistics.median(self.ms_per_step),
            "ms_per_step_rounds": self.ms_per_step,
            "host_enqueue_ms": statistics.median(self.enqueue_ms),
            "device_ms": statistics.median(self.device_ms) if self.device_ms else None,
            "peak_memory_bytes": peak if peak >= 0 else None,
            "losses": [float(x) for x in self.losses],
            "torch": torch.__version__,
        }
        if profile_steps:
            result["profile"] = profile(self.step, self.sync, profile_steps)
        return result


def measure(sides: list[Side], steps: int, rounds: int, profile_steps: int) -> list[dict]:
    """Interleaved rounds (each side in turn), so that machine noise affects every side alike."""
    for _ in range(rounds):
        for side in sides:
            side.throughput_round(steps)
    for _ in range(rounds):
        for side in sides:
            side.enqueue_round(max(1, min(steps, 5)))
    return [side.result(profile_steps) for side in sides]


def profile(step: Callable[[], torch.Tensor], sync: Callable[[], None], steps: int, top: int = 30) -> list[dict]:
    """CPU-side time per op over `steps` steps: the top `top` by total host time."""
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    with torch_profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(steps):
            step()
        sync()
    rows = [
        {
            "op": e.key,
            "calls": e.count,
            "self_host_us": e.self_cpu_time_total,
            "total_host_us": e.cpu_time_total,
        }
        for e in prof.key_averages()
    ]
    rows.sort(key=lambda r: -r["total_host_us"])
    return rows[:top]


def run_reference(args: argparse.Namespace, backing: str, config: str) -> dict:
    """The plain-backing side in a fresh process that never imports torch_fl."""
    env = {**os.environ, "TORCH_DEVICE_BACKEND_AUTOLOAD": "0", "PYTHONUNBUFFERED": "1"}
    env.pop("FLAGOS_PLATFORM", None)
    command = [
        sys.executable, __file__, "--reference", "--device", backing, "--config", config, "--steps", str(args.steps),
        "--rounds", str(args.rounds), "--warmup", str(args.warmup),
        "--profile-steps", str(args.profile_steps if args.profile else 0),
    ]
    out = subprocess.run(command, env=env, capture_output=True, text=True)
    if out.returncode != 0:
        sys.exit(f"the reference run failed (exit {out.returncode}):\n{out.stderr[-4000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def fmt(value: float | None, unit: str = "", digits: int = 3) -> str:
    return "-" if value is None else f"{value:.{digits}f}{unit}"


def mib(value: int | None) -> str:
    return "-" if value is None else f"{value / 2**20:.1f} MiB"


def compare(flagos: dict, plain: dict, rtol: float) -> tuple[str, bool]:
    lines = [
        f"config {flagos['config']} {flagos['dims']} ({flagos['parameters'] / 1e6:.2f} M parameters), "
        f"{flagos['dtype']}, backing {flagos['backing']}, torch {flagos['torch']}",
        f"{'':28s}{'plain ' + plain['device']:>16s}{'flagos':>16s}",
        f"{'ms/step':28s}{fmt(plain['ms_per_step']):>16s}{fmt(flagos['ms_per_step']):>16s}",
        f"{'host enqueue ms/step':28s}{fmt(plain['host_enqueue_ms']):>16s}{fmt(flagos['host_enqueue_ms']):>16s}",
        f"{'device ms/step (events)':28s}{fmt(plain['device_ms']):>16s}{fmt(flagos['device_ms']):>16s}",
        f"{'peak memory':28s}{mib(plain['peak_memory_bytes']):>16s}{mib(flagos['peak_memory_bytes']):>16s}",
        f"throughput ratio flagos/plain: {plain['ms_per_step'] / flagos['ms_per_step']:.3f}  "
        f"(host enqueue ratio {flagos['host_enqueue_ms'] / plain['host_enqueue_ms']:.2f}x)",
        "",
        f"{'step':>4s}{'plain loss':>14s}{'flagos loss':>14s}{'rel diff':>11s}",
    ]
    ok = len(flagos["losses"]) == len(plain["losses"])
    for i, (a, b) in enumerate(zip(plain["losses"], flagos["losses"])):
        rel = abs(a - b) / max(abs(a), 1e-12)
        ok = ok and rel <= rtol
        if i < LOSSES_SHOWN:
            lines.append(f"{i:>4d}{a:>14.6f}{b:>14.6f}{rel:>11.2e}")
    verdict = "agree" if ok else "DISAGREE"
    lines.append(f"losses {verdict} (all {len(plain['losses'])} steps, relative tolerance {rtol:g})")
    return "\n".join(lines), ok


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", help="a config of torch_fl/workloads/decoder.py: tiny|small|large "
                        "(default: tiny on the host, large on CUDA)")
    parser.add_argument("--steps", type=int, default=10, help="timed back-to-back steps per round")
    parser.add_argument("--rounds", type=int, default=3, help="timed rounds per side (their median counts)")
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--json", help="write both results here")
    parser.add_argument("--profile", help="write the top-30 host-time ops of both sides here (JSON)")
    parser.add_argument("--profile-steps", type=int, default=3, help="steps profiled with --profile")
    parser.add_argument("--reference", action="store_true", help="(internal) run the plain side only, print JSON")
    parser.add_argument("--device", default="cpu", help="(internal, with --reference) the plain device")
    args = parser.parse_args()

    if args.reference:
        config = args.config or DEFAULT_CONFIG[args.device]
        (result,) = measure([Side(args.device, args.device, config, args.warmup)], args.steps, args.rounds,
                            args.profile_steps)
        print(json.dumps(result))
        return

    import torch_fl

    if not torch_fl.is_active():
        sys.exit("flagos is not active here (on a CUDA machine set FLAGOS_PLATFORM, e.g. nvidia_h200)")
    from torch_fl.runtime.device.core import backing as current_backing

    backing = current_backing()
    config = args.config or DEFAULT_CONFIG[backing]
    profile_steps = args.profile_steps if args.profile else 0
    if backing == "cpu":
        sides = [Side("cpu", "cpu", config, args.warmup), Side("flagos", "cpu", config, args.warmup)]
        plain, flagos = measure(sides, args.steps, args.rounds, profile_steps)
    else:
        plain = run_reference(args, backing, config)
        (flagos,) = measure([Side("flagos", backing, config, args.warmup)], args.steps, args.rounds, profile_steps)
    text, ok = compare(flagos, plain, LOSS_RTOL[backing])
    print(f"platform {torch_fl.active_platform().name}")
    print(text)
    if args.profile:
        Path(args.profile).write_text(
            json.dumps({"plain": plain.pop("profile", None), "flagos": flagos.pop("profile", None)}, indent=1) + "\n"
        )
        print(f"host-time profiles written to {args.profile}")
    if args.json:
        summary = {
            "plain": plain,
            "flagos": flagos,
            "throughput_ratio": plain["ms_per_step"] / flagos["ms_per_step"],
            "losses_agree": ok,
        }
        Path(args.json).write_text(json.dumps(summary, indent=1) + "\n")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
