"""Training-step throughput of a decoder-only transformer (AdamW) on flagos, side by side with the
plain backing device, in several route configurations.

    python bench/train_step.py                                     # host_ref: config tiny, fp32
    FLAGOS_PLATFORM=nvidia_h200 python bench/train_step.py         # CUDA: config large, bf16, every variant
    FLAGOS_PLATFORM=nvidia_h200 python bench/train_step.py --config small --variants native-only

The flagos variants:

    native-only     every op on the C++ native route (an empty route table, defaults `native`)
    flaggems-first  every op FlagGems implements tried on FlagGems first, as far as the conformance
                    record allows (the seed release routes everything to FlagGems by default)
    tuned           the platform's routes.yaml, as `torch-fl routes tune` left it
    compiled        torch.compile(model) with inductor, the platform's routes.yaml for extern kernels

Each eager variant is compared with plain eager, `compiled` with plain compiled. Every side runs in
a process of its own, one after the other, so that no route table, compiled graph or allocator
state leaks from one into the next; the plain sides never import torch_fl (a process where flagos is
registered cannot run autograd over plain CUDA tensors; see torch_fl.activation).

Printed per side: ms per step (back-to-back steps, one synchronisation at the end, median of
rounds), host enqueue ms per step (the device idle before it), device ms per step (events), peak
memory, the calls of one step per route path; then the throughput ratios and whether each side's
per-step losses agree with its plain reference (exit status 1 if one does not).
--profile OUT writes each side's top 30 ops by total host (CPU-side) time over a few steps.
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType

import torch

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_CONFIG = {"cpu": "tiny", "cuda": "large"}
DEFAULT_VARIANTS = {"cpu": "native-only", "cuda": "native-only,flaggems-first,tuned,compiled"}
LOSSES_SHOWN = 6
# Relative agreement required between the per-step losses of a flagos side and its plain reference.
LOSS_RTOL = {"cpu": 1e-4, "cuda": 2e-2}
# A route table with no entries: with FLAGOS_ROUTE_DEFAULTS it puts every op on the same paths.
EMPTY_TABLE = "format: 1\nops: {}\n"


@dataclass(frozen=True)
class Variant:
    compiled: bool = False
    defaults: str | None = None  # FLAGOS_ROUTE_DEFAULTS over an empty table; None keeps routes.yaml
    env: dict[str, str] = field(default_factory=dict)


VARIANTS = {
    "native-only": Variant(defaults="native"),
    "flaggems-first": Variant(defaults="flaggems,native"),
    "tuned": Variant(),
    "compiled": Variant(compiled=True),
}
PLAIN = {"eager": Variant(), "compiled": Variant(compiled=True)}


def workload() -> ModuleType:
    """torch_fl/workloads/decoder.py loaded by path: a plain side must not import torch_fl
    (importing the package activates flagos), and the workload needs only torch."""
    path = ROOT / "torch_fl" / "workloads" / "decoder.py"
    spec = importlib.util.spec_from_file_location("flagos_bench_decoder", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def device_api(device: str) -> tuple[Callable[[], None], Callable[..., object] | None, Callable[[], int], Callable[[], None]]:
    """(synchronize, Event factory or None, peak memory, reset peak) for `device`."""
    if device == "cpu":
        return (lambda: None), None, (lambda: -1), (lambda: None)
    module = torch.cuda if device == "cuda" else getattr(torch, device)
    return module.synchronize, module.Event, module.max_memory_allocated, module.reset_peak_memory_stats


def calls_by_path(step: Callable[[], torch.Tensor]) -> dict[str, int]:
    """How many op calls of one step each route path served."""
    from torch_fl import routing

    routing.reset_stats()
    step()
    counts: Counter[str] = Counter()
    for row in routing.stats():
        counts[row.path] += row.calls
    return dict(counts)


def profile(step: Callable[[], torch.Tensor], sync: Callable[[], None], steps: int, top: int = 30) -> list[dict]:
    """CPU-side time per op over `steps` steps: the top `top` by total host time."""
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    with torch_profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(steps):
            step()
        sync()
    rows = [
        {"op": e.key, "calls": e.count, "self_host_us": e.self_cpu_time_total, "total_host_us": e.cpu_time_total}
        for e in prof.key_averages()
    ]
    rows.sort(key=lambda r: -r["total_host_us"])
    return rows[:top]


def run_side(side: str, variant: str, args: argparse.Namespace) -> dict:
    """Build the workload on this side's device, warm it up, time it; the result as a dict."""
    if side == "flagos":
        import torch_fl
        from torch_fl.routing import router
        from torch_fl.runtime.device.core import backing as current_backing

        if not torch_fl.is_active():
            sys.exit("flagos is not active here (on a CUDA machine set FLAGOS_PLATFORM, e.g. nvidia_h200)")
        device, backing = "flagos", current_backing()
        spec = VARIANTS[variant]
    else:
        device = backing = args.device
        spec = PLAIN[variant]
    decoder = workload()
    config = decoder.CONFIGS[args.config or DEFAULT_CONFIG[backing]]
    dtype = torch.bfloat16 if backing == "cuda" else torch.float32
    sync, event, peak, reset_peak = device_api(device)
    reset_peak()
    _, _, step = decoder.build(config, device, dtype, compiled=spec.compiled)
    started = time.perf_counter()
    losses = [step() for _ in range(args.warmup)]  # includes compilation and FlagGems autotuning
    sync()
    warmup_s = time.perf_counter() - started
    rounds: list[float] = []
    for _ in range(args.rounds):
        sync()
        start = time.perf_counter()
        losses += [step() for _ in range(args.steps)]
        sync()
        rounds.append((time.perf_counter() - start) / args.steps * 1e3)
    enqueue_ms, device_ms = [], []
    for _ in range(max(1, min(args.steps, 5))):
        sync()
        begin, end = (event(enable_timing=True), event(enable_timing=True)) if event else (None, None)
        if begin is not None:
            begin.record()
        start = time.perf_counter()
        losses.append(step())
        enqueue_ms.append((time.perf_counter() - start) * 1e3)
        if end is not None:
            end.record()
        sync()
        if begin is not None:
            device_ms.append(begin.elapsed_time(end))
    result = {
        "side": side,
        "variant": variant,
        "device": device,
        "backing": backing,
        "config": args.config or DEFAULT_CONFIG[backing],
        "dims": {k: getattr(config, k) for k in ("vocab", "dim", "heads", "layers", "seq", "batch")},
        "parameters": config.parameters,
        "dtype": str(dtype).removeprefix("torch."),
        "torch": torch.__version__,
        "warmup_s": round(warmup_s, 2),
        "ms_per_step": statistics.median(rounds),
        "ms_per_step_rounds": rounds,
        "host_enqueue_ms": statistics.median(enqueue_ms),
        "device_ms": statistics.median(device_ms) if device_ms else None,
        "peak_memory_bytes": max(peak(), 0) or None,
        "losses": [float(x) for x in losses],
    }
    if side == "flagos":
        result["platform"] = torch_fl.active_platform().name
        result["gate"] = router().gate.state
        result["calls_by_path"] = calls_by_path(step)
    if args.profile:
        result["profile"] = profile(step, sync, args.profile_steps)
    return result


def side_env(side: str, variant: str, table: Path) -> dict[str, str]:
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    if side == "plain":
        env["TORCH_DEVICE_BACKEND_AUTOLOAD"] = "0"
        env.pop("FLAGOS_PLATFORM", None)
        return env
    spec = VARIANTS[variant]
    if spec.defaults is not None:
        env.update(FLAGOS_ROUTES=str(table), FLAGOS_ROUTE_DEFAULTS=spec.defaults)
    return {**env, **spec.env}


def run_child(side: str, variant: str, args: argparse.Namespace, device: str, table: Path) -> dict:
    """One side in a fresh process; its JSON result."""
    command = [
        sys.executable, __file__, "--child", f"{side}:{variant}", "--device", device, "--steps", str(args.steps),
        "--rounds", str(args.rounds), "--warmup", str(args.warmup), "--profile-steps", str(args.profile_steps),
    ]
    command += ["--config", args.config] if args.config else []
    command += ["--profile", "-"] if args.profile else []
    out = subprocess.run(command, env=side_env(side, variant, table), capture_output=True, text=True)
    if out.returncode != 0:
        sys.exit(f"side {side} {variant} failed (exit {out.returncode}):\n{out.stderr[-4000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def agreement(flagos: dict, plain: dict, rtol: float, steps: int | None = None) -> tuple[bool, float]:
    """Do the per-step losses agree over the first `steps` steps (None: all), and the largest
    relative difference over all steps."""
    diffs = [abs(a - b) / max(abs(a), 1e-12) for a, b in zip(plain["losses"], flagos["losses"])]
    judged = diffs if steps is None else diffs[:steps]
    return len(flagos["losses"]) == len(plain["losses"]) and max(judged, default=0.0) <= rtol, max(diffs, default=0.0)


def fmt(value: float | None, digits: int = 3) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def mib(value: int | None) -> str:
    return "-" if value is None else f"{value / 2**20:.0f}"


def report(sides: dict[str, dict], variants: list[str], rtol: float, compiled_steps: int) -> tuple[str, dict]:
    """The side-by-side table and the summary (ratios, loss agreement)."""
    first = next(iter(sides.values()))
    lines = [
        f"config {first['config']} {first['dims']} ({first['parameters'] / 1e6:.1f} M parameters), "
        f"{first['dtype']}, AdamW, backing {first['backing']}, torch {first['torch']}",
        f"{'side':24s}{'ms/step':>10s}{'host ms':>10s}{'device ms':>10s}{'peak MiB':>10s}{'warm-up s':>10s}"
        f"{'vs plain':>10s}{'losses':>9s}  calls of one step by path",
    ]
    summary: dict = {"ratios": {}, "losses_agree": {}, "worst_loss_rel_diff": {}}
    for label, s in sides.items():
        ratio, agree = "", ""
        if s["side"] == "flagos":
            reference = sides["plain compiled" if s["variant"] == "compiled" else "plain eager"]
            value = reference["ms_per_step"] / s["ms_per_step"]
            # Eager flagos runs the backing's own kernels: every step must agree. Inductor generates
            # flagos' kernels separately (other fusions, other summation orders): the first steps
            # must agree, after which bf16 training amplifies rounding chaotically (plain compiled
            # and plain eager drift apart just as much; both drifts are printed).
            steps = compiled_steps if s["variant"] == "compiled" else None
            ok, worst = agreement(s, reference, rtol, steps)
            summary["ratios"][s["variant"]] = round(value, 4)
            summary["losses_agree"][s["variant"]] = ok
            summary["worst_loss_rel_diff"][s["variant"]] = worst
            ratio, agree = f"{value:.3f}x", "agree" if ok else "DIFFER"
        paths = " ".join(f"{p} {n}" for p, n in sorted(s.get("calls_by_path", {}).items()))
        gate = f" (record {s['gate']})" if s.get("gate") not in (None, "valid") else ""
        lines.append(
            f"{label:24s}{fmt(s['ms_per_step']):>10s}{fmt(s['host_enqueue_ms']):>10s}{fmt(s['device_ms']):>10s}"
            f"{mib(s['peak_memory_bytes']):>10s}{fmt(s['warmup_s'], 1):>10s}{ratio:>10s}{agree:>9s}  {paths}{gate}"
        )
    lines.append(
        f"losses: relative tolerance {rtol:g} against the plain side of the same mode, every step "
        f"(compiled: the first {compiled_steps}); largest relative difference over all steps: "
        + ", ".join(f"{v} {d:.2e}" for v, d in summary["worst_loss_rel_diff"].items())
    )
    if "plain compiled" in sides:
        _, drift = agreement(sides["plain compiled"], sides["plain eager"], rtol)
        lines.append(f"for scale, plain compiled against plain eager: largest relative difference {drift:.2e}")
    steps = min(LOSSES_SHOWN, len(first["losses"]))
    lines.append("first losses: " + "; ".join(
        f"{label} " + " ".join(f"{x:.4f}" for x in s["losses"][:steps]) for label, s in sides.items()
    ))
    summary["all_agree"] = all(summary["losses_agree"].values())
    summary["variants"] = variants
    return "\n".join(lines), summary


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", help="a config of torch_fl/workloads/decoder.py: tiny|small|large "
                        "(default: tiny on the host, large on CUDA)")
    parser.add_argument("--variants", help=f"comma-separated flagos variants of {', '.join(VARIANTS)} "
                        "(default: native-only on the host, all on CUDA)")
    parser.add_argument("--steps", type=int, default=10, help="timed back-to-back steps per round")
    parser.add_argument("--rounds", type=int, default=3, help="timed rounds per side (their median counts)")
    parser.add_argument("--warmup", type=int, default=3, help="untimed steps first (compilation, autotuning)")
    parser.add_argument("--json", help="write every side's result and the summary here")
    parser.add_argument("--profile", help="write the top-30 host-time ops of every side here (JSON)")
    parser.add_argument("--profile-steps", type=int, default=3, help="steps profiled with --profile")
    parser.add_argument("--child", help="(internal) SIDE:VARIANT: run one side, print its JSON")
    parser.add_argument("--device", default="cpu", help="(internal, with --child) the plain device")
    args = parser.parse_args()

    if args.child:
        side, variant = args.child.split(":")
        print(json.dumps(run_side(side, variant, args)))
        return

    with tempfile.TemporaryDirectory() as scratch:
        table = Path(scratch) / "routes.yaml"
        table.write_text(EMPTY_TABLE)
        requested = args.variants.split(",") if args.variants else None
        unknown = [v for v in requested or [] if v not in VARIANTS]
        if unknown:
            sys.exit(f"unknown variant(s) {', '.join(unknown)}; known: {', '.join(VARIANTS)}")
        first = (requested or ["native-only"])[0]
        probe = run_child("flagos", first, args, "cpu", table)  # also tells the backing device
        backing = probe["backing"]
        variants = requested or DEFAULT_VARIANTS[backing].split(",")
        sides = {"plain eager": run_child("plain", "eager", args, backing, table)}
        if "compiled" in variants:
            sides["plain compiled"] = run_child("plain", "compiled", args, backing, table)
        for variant in variants:
            sides[f"flagos {variant}"] = probe if variant == first else run_child("flagos", variant, args, backing, table)
    text, summary = report(sides, variants, LOSS_RTOL[backing], compiled_steps=args.warmup)
    print(f"platform {probe['platform']} (conformance record: {probe['gate']})")
    print(text)
    if args.profile:
        Path(args.profile).write_text(json.dumps({k: s.pop("profile", None) for k, s in sides.items()}, indent=1) + "\n")
        print(f"host-time profiles written to {args.profile}")
    if args.json:
        Path(args.json).write_text(json.dumps({"sides": sides, **summary}, indent=1) + "\n")
    sys.exit(0 if summary["all_agree"] else 1)


if __name__ == "__main__":
    main()
