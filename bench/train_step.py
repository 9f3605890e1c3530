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

With flaggems-first on CUDA a plain side "plain flaggems" runs too: plain CUDA after
`flag_gems.enable()`, the seed release's routing, so that a FlagGems kernel that fails the workload
is told from a flagos defect (its losses are shown, and judged apart from flagos').

Each eager variant is compared with plain eager, `compiled` with plain compiled. Every side runs in
a process of its own, so that no route table, compiled graph or allocator state leaks from one into
the next; the plain sides never import torch_fl (a process where flagos is registered cannot run
autograd over plain CUDA tensors; see torch_fl.activation). The sides are built and warmed up one
after the other, then stay alive while the timed rounds interleave (each side in turn), so that
the machine's drifts touch them alike. A side whose process dies (a kernel that faults the device)
is reported as failed, and the others are still measured.

Printed per side: ms per step (back-to-back steps, one synchronisation at the end, median of
rounds), host enqueue ms per step (the device idle before it), device ms per step (events), peak
memory, the calls of one step per route path; then the throughput ratios (the median of the rounds'
ratios), each with a 95% bootstrap interval over the interleaved rounds, the host CPU time per step
against the reference's, taken alike (the
process's CPU seconds: what flagos adds, and the waits for the GPU, which spin), and whether each side's
per-step losses agree with its plain reference (exit status 1 if one does not).
--profile OUT writes each side's host (CPU-side) time per op over a few steps.
--interval-width W adds rounds after --rounds until every side's interval against plain eager is
at most W wide (within --max-rounds and --case-seconds); a run that stops short says WIDE.
--processes N runs each side in N processes, each taking every round (a side's time of a round is
their median), and each interval then also resamples the processes, as model_zoo.py's do.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from types import ModuleType

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))  # the helpers beside this script, however it is started
from side_processes import (  # noqa: E402
    EMPTY_TABLE,
    VARIANTS,
    InterleavedRounds,
    RoundPlan,
    Side,
    Variant,
    add_processes_option,
    add_round_options,
    agreement,
    calls_by_path,
    device_api,
    fmt,
    mib,
    on_round_cpus,
    paired_ratio,
    pooled_processes,
    profile,
    ratio_interval_by_process,
    reply,
    serve,
    shared_cpus,
    side_env,
    timed_without_gc,
    workload_module,
)

ROOT = HERE.parent
DEFAULT_CONFIG = {"cpu": "tiny", "cuda": "large"}
DEFAULT_VARIANTS = {"cpu": "native-only", "cuda": "native-only,flaggems-first,tuned,compiled"}
LOSSES_SHOWN = 6
# Relative agreement required between the per-step losses of a flagos side and its plain reference.
LOSS_RTOL = {"cpu": 1e-4, "cuda": 2e-2}
# "flaggems" is how the seed release runs: plain CUDA with every FlagGems kernel registered. It runs
# next to flagos' flaggems-first so that a FlagGems defect is told from a flagos one.
PLAIN = {"eager": Variant(), "compiled": Variant(compiled=True), "flaggems": Variant(flag_gems=True)}


def workload() -> ModuleType:
    """torch_fl/workloads/decoder.py, loaded by path (see workload_module)."""
    return workload_module("decoder")


class SideRunner:
    """One side, in its own process: the workload built on this side's device and warmed up;
    timed rounds on demand; its result at the end."""

    def __init__(self, side: str, variant: str, args: argparse.Namespace) -> None:
        if side == "flagos":
            import torch_fl
            from torch_fl.runtime.device.core import backing as current_backing

            if not torch_fl.is_active():
                sys.exit("flagos is not active here (on a CUDA machine set FLAGOS_PLATFORM, e.g. nvidia_h200)")
            self.device, self.backing = "flagos", current_backing()
            spec = VARIANTS[variant]
        else:
            self.device = self.backing = args.device
            spec = PLAIN[variant]
        self.side, self.variant, self.args = side, variant, args
        decoder = workload()
        self.config = decoder.CONFIGS[args.config or DEFAULT_CONFIG[self.backing]]
        self.dtype = torch.bfloat16 if self.backing == "cuda" else torch.float32
        self.sync, self.event, self.peak, reset_peak = device_api(self.device)
        reset_peak()
        if spec.flag_gems:
            import flag_gems

            flag_gems.enable()
        _, _, self.step = decoder.build(self.config, self.device, self.dtype, compiled=spec.compiled)
        started = time.perf_counter()
        self.losses = [self.step() for _ in range(args.warmup)]  # includes compilation and FlagGems autotuning
        self.sync()
        self.warmup_s = time.perf_counter() - started
        self.rounds: list[float] = []
        self.cpu_rounds: list[float] = []

    def round(self) -> float:
        """ms per step over `steps` back-to-back steps, one synchronisation at the end; on a device
        backing, on the cores the parent named for rounds (the host's rounds are not pinned)."""
        with on_round_cpus() if self.backing != "cpu" else contextlib.nullcontext():
            self.sync()
            with timed_without_gc() as timed:
                self.losses += [self.step() for _ in range(self.args.steps)]
                self.sync()
        self.rounds.append(timed.wall_s / self.args.steps * 1e3)
        self.cpu_rounds.append(timed.cpu_s / self.args.steps * 1e3)
        return self.rounds[-1]

    def result(self) -> dict:
        """Host enqueue and device time of single steps (device idle before each), then everything."""
        enqueue_ms, device_ms = [], []
        for _ in range(max(1, min(self.args.steps, 5))):
            self.sync()
            begin, end = (
                (self.event(enable_timing=True), self.event(enable_timing=True)) if self.event else (None, None)
            )
            if begin is not None:
                begin.record()
            start = time.perf_counter()
            self.losses.append(self.step())
            enqueue_ms.append((time.perf_counter() - start) * 1e3)
            if end is not None:
                end.record()
            self.sync()
            if begin is not None:
                device_ms.append(begin.elapsed_time(end))
        c = self.config
        result = {
            "side": self.side,
            "variant": self.variant,
            "device": self.device,
            "backing": self.backing,
            "config": self.args.config or DEFAULT_CONFIG[self.backing],
            "dims": {k: getattr(c, k) for k in ("vocab", "dim", "heads", "layers", "seq", "batch")},
            "parameters": c.parameters,
            "dtype": str(self.dtype).removeprefix("torch."),
            "torch": torch.__version__,
            "warmup_s": round(self.warmup_s, 2),
            "ms_per_step": statistics.median(self.rounds),
            "ms_per_step_rounds": self.rounds,
            "host_cpu_ms_per_step": statistics.median(self.cpu_rounds),
            "host_cpu_ms_per_step_rounds": self.cpu_rounds,
            "host_enqueue_ms": statistics.median(enqueue_ms),
            "device_ms": statistics.median(device_ms) if device_ms else None,
            "peak_memory_bytes": max(self.peak(), 0) or None,
            "losses": [float(x) for x in self.losses],
        }
        if self.side == "flagos":
            import torch_fl
            from torch_fl.routing import router

            result["platform"] = torch_fl.active_platform().name
            result["gate"] = router().gate.state
            result["calls_by_path"] = calls_by_path(self.step)
        if self.args.profile:
            result["profile"] = profile(self.step, self.sync, self.args.profile_steps)
        return result


def start_side(side: str, variant: str, args: argparse.Namespace, device: str, scratch: Path, process: int = 0) -> Side:
    """A side's process (its `process`-th), its workload built and warmed up."""
    command = [
        sys.executable,
        __file__,
        "--child",
        f"{side}:{variant}",
        "--device",
        device,
        "--steps",
        str(args.steps),
        "--warmup",
        str(args.warmup),
        "--profile-steps",
        str(args.profile_steps),
    ]
    command += ["--config", args.config] if args.config else []
    command += ["--profile", "-"] if args.profile else []
    env = side_env(side, variant, scratch / "routes.yaml")
    # Named for every side: the first flagos side starts before the parent knows the backing (it
    # tells it), and each side pins its rounds only on a device backing (SideRunner.round).
    return Side(command, env, scratch / f"{side}-{variant}-{process}.log", cpus=shared_cpus())


def merged(replies: list[dict | None]) -> dict | None:
    """One side's result from its processes' (None where one failed): the first process's, with
    the rounds of every process (side_processes.pooled_processes)."""
    if not replies or any(r is None for r in replies):
        return None
    return {**replies[0], **pooled_processes(replies, "step")}


def report(
    sides: dict[str, dict], failed: dict[str, str], variants: list[str], rtol: float, judged_steps: int
) -> tuple[str, dict]:
    """The side-by-side table and the summary (ratios, loss agreement, failed sides)."""
    first = next(iter(sides.values()))
    lines = [
        f"config {first['config']} {first['dims']} ({first['parameters'] / 1e6:.1f} M parameters), "
        f"{first['dtype']}, AdamW, backing {first['backing']}, torch {first['torch']}",
        f"{'side':24s}{'ms/step':>10s}{'host ms':>10s}{'device ms':>10s}{'peak MiB':>10s}{'warm-up s':>10s}"
        f"{'vs plain':>10s}{'95% interval':>16s}{'host cpu':>10s}{'losses':>9s}  calls of one step by path",
    ]
    summary: dict = {
        "ratios": {},
        "ratio_intervals": {},
        "host_cpu_ratios": {},
        "losses_agree": {},
        "worst_loss_rel_diff": {},
        "failed": failed,
    }
    for label, s in sides.items():
        ratio, interval, cpu, agree = "", "", "", ""
        reference_label = "plain compiled" if s["variant"] == "compiled" else "plain eager"
        if label != reference_label and reference_label in sides:
            reference = sides[reference_label]
            value = paired_ratio(reference["ms_by_process"], s["ms_by_process"])
            # Eager flagos on the host runs the CPU's own kernels: every step must agree. Inductor
            # generates flagos' kernels separately (other fusions, other summation orders), and
            # CUDA's own step is not bitwise reproducible (flash attention's backward accumulates
            # with atomics; on the H200 native-only equalled plain eager over all 58 steps in one
            # run and over 9 in another): there the first steps must agree, after which bf16
            # training amplifies rounding chaotically (plain compiled and plain eager drift apart
            # just as much; the drifts are printed).
            exact = s["variant"] != "compiled" and s["backing"] == "cpu"
            steps = None if exact else judged_steps
            ok, worst = agreement(s["losses"], reference["losses"], rtol, steps)
            key = s["variant"] if s["side"] == "flagos" else label
            summary["ratios"][key] = round(value, 4)
            bounds = ratio_interval_by_process(reference["ms_by_process"], s["ms_by_process"])
            summary["ratio_intervals"][key] = bounds
            # host CPU per step over the reference's: what this side adds on the host
            summary["host_cpu_ratios"][key] = round(
                paired_ratio(s["cpu_ms_by_process"], reference["cpu_ms_by_process"]), 4
            )
            interval = f"[{bounds[0]:.3f}, {bounds[1]:.3f}]" if bounds else "-"
            cpu = f"{summary['host_cpu_ratios'][key]:.2f}x"
            summary["losses_agree"][key] = ok
            summary["worst_loss_rel_diff"][key] = worst
            ratio, agree = f"{value:.3f}x", "agree" if ok else "DIFFER"
        paths = " ".join(f"{p} {n}" for p, n in sorted(s.get("calls_by_path", {}).items()))
        gate = f" (record {s['gate']})" if s.get("gate") not in (None, "valid") else ""
        lines.append(
            f"{label:24s}{fmt(s['ms_per_step']):>10s}{fmt(s['host_enqueue_ms']):>10s}{fmt(s['device_ms']):>10s}"
            f"{mib(s['peak_memory_bytes']):>10s}{fmt(s['warmup_s'], 1):>10s}{ratio:>10s}{interval:>16s}{cpu:>10s}"
            f"{agree:>9s}  {paths}{gate}"
        )
    for label, why in failed.items():
        lines.append(f"{label:24s}FAILED ({why})")
    lines.append(
        f"losses: relative tolerance {rtol:g} against the plain side of the same mode, every step on the host, "
        f"the first {judged_steps} on a device and when compiled; largest relative difference over all steps: "
        + ", ".join(f"{v} {d:.2e}" for v, d in summary["worst_loss_rel_diff"].items())
    )
    if "plain compiled" in sides:
        _, drift = agreement(sides["plain compiled"]["losses"], sides["plain eager"]["losses"], rtol)
        lines.append(f"for scale, plain compiled against plain eager: largest relative difference {drift:.2e}")
    steps = min(LOSSES_SHOWN, len(first["losses"]))
    lines.append(
        "first losses: "
        + "; ".join(f"{label} " + " ".join(f"{x:.4f}" for x in s["losses"][:steps]) for label, s in sides.items())
    )
    # plain flaggems is a reference for FlagGems itself: its losses judge FlagGems, not flagos
    summary["all_agree"] = all(ok for key, ok in summary["losses_agree"].items() if key in variants) and not any(
        label != "plain flaggems" for label in failed
    )
    summary["variants"] = variants
    return "\n".join(lines), summary


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--config",
        help="a config of torch_fl/workloads/decoder.py: tiny|small|large (default: tiny on the host, large on CUDA)",
    )
    parser.add_argument(
        "--variants",
        help=f"comma-separated flagos variants of {', '.join(VARIANTS)} "
        "(default: native-only on the host, all on CUDA)",
    )
    parser.add_argument("--steps", type=int, default=10, help="timed back-to-back steps per round")
    add_round_options(parser, 5, "timed rounds per side (their median counts; 3 at least for an interval)")
    parser.add_argument("--warmup", type=int, default=3, help="untimed steps first (compilation, autotuning)")
    add_processes_option(parser)
    parser.add_argument("--json", help="write every side's result and the summary here")
    parser.add_argument("--profile", help="write every side's host time per op here (JSON)")
    parser.add_argument("--profile-steps", type=int, default=3, help="steps profiled with --profile")
    parser.add_argument("--child", help="(internal) SIDE:VARIANT: run one side, print its JSON")
    parser.add_argument("--device", default="cpu", help="(internal, with --child) the plain device")
    args = parser.parse_args()

    if args.child:
        side, variant = args.child.split(":")
        runner = SideRunner(side, variant, args)
        reply({"ready": True, "backing": runner.backing})
        serve({"round": lambda: {"ms": runner.round()}, "finish": runner.result}, last="finish")
        return

    requested = args.variants.split(",") if args.variants else None
    unknown = [v for v in requested or [] if v not in VARIANTS]
    if unknown:
        sys.exit(f"unknown variant(s) {', '.join(unknown)}; known: {', '.join(VARIANTS)}")
    with tempfile.TemporaryDirectory() as folder:
        scratch = Path(folder)
        (scratch / "routes.yaml").write_text(EMPTY_TABLE)
        # Each side is built and warmed up alone, one after the other; then the timed rounds
        # interleave (every side in turn), so that drifts of the machine touch every side alike.
        first = (requested or ["native-only"])[0]
        probe = start_side("flagos", first, args, "cpu", scratch)  # it tells the backing
        if probe.ready is None:
            sys.exit(f"flagos {first} failed: {probe.failed}")
        backing = probe.ready["backing"]
        variants = requested or DEFAULT_VARIANTS[backing].split(",")

        def processes(side: str, variant: str, *given: Side) -> list[Side]:
            more = range(len(given), args.processes)
            return [*given, *(start_side(side, variant, args, backing, scratch, process) for process in more)]

        handles = {f"flagos {first}": processes("flagos", first, probe)}
        handles["plain eager"] = processes("plain", "eager")
        if "compiled" in variants:
            handles["plain compiled"] = processes("plain", "compiled")
        if "flaggems-first" in variants and backing == "cuda":
            handles["plain flaggems"] = processes("plain", "flaggems")
        for variant in [v for v in variants if v != first]:
            handles[f"flagos {variant}"] = processes("flagos", variant)
        rounds = InterleavedRounds(RoundPlan.from_args(args), "plain eager")
        dropped: set[str] = set()
        for _ in rounds:
            for label, sides_of_label in handles.items():
                if label in dropped:
                    continue
                answers = [handle.ask("round") for handle in sides_of_label]
                if any(answer is None for answer in answers):
                    dropped.add(label)
                    rounds.drop(label)
                else:
                    for process, answer in enumerate(answers):
                        rounds.add(label, answer["ms"], process)
        results = {
            label: merged([h.ask("finish") for h in sides_of_label]) for label, sides_of_label in handles.items()
        }
    order = ["plain eager", "plain compiled", "plain flaggems"] + [f"flagos {v}" for v in variants]
    sides = {label: results[label] for label in order if results.get(label) is not None}
    failed = {
        label: next((h.failed for h in handles[label] if h.failed), None) or "no result"
        for label in order
        if label in handles and results[label] is None
    }
    if "plain eager" not in sides:
        sys.exit(f"the plain side failed: {failed.get('plain eager')}")
    text, summary = report(sides, failed, variants, LOSS_RTOL[backing], judged_steps=args.warmup)
    summary.update(rounds.summary())
    if summary.get("narrow_enough") is False:
        text += f"\nWIDE: {summary['rounds']} rounds left an interval {summary['widest_interval']} wide"
    probe = next((s for s in sides.values() if s["side"] == "flagos"), {"platform": "?", "gate": "?"})
    print(f"platform {probe['platform']} (conformance record: {probe['gate']})")
    print(text)
    if args.profile:
        Path(args.profile).write_text(
            json.dumps({k: s.pop("profile", None) for k, s in sides.items()}, indent=1) + "\n"
        )
        print(f"host-time profiles written to {args.profile}")
    if args.json:
        Path(args.json).write_text(json.dumps({"sides": sides, **summary}, indent=1) + "\n")
    sys.exit(0 if summary["all_agree"] else 1)


if __name__ == "__main__":
    main()
