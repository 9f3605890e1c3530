"""Public architectures (torch_fl/workloads/zoo.py) on flagos, side by side with the plain backing:
training steps, prefill and greedy decoding, per route configuration, in one run.

    FLAGOS_PLATFORM=nvidia_h200 python bench/model_zoo.py           # CUDA: board sizes, bf16
    python bench/model_zoo.py --host                                # CPU: host sizes, fp32, bitwise
    FLAGOS_PLATFORM=nvidia_h200 python bench/model_zoo.py --models llama,gpt2 --modes train,decode --scale 0.5

Sides, each a live process (bench/side_processes.py): the plain backing (CUDA, or the CPU with
--host; it never imports torch_fl), flagos with the platform's shipped routes.yaml (`tuned`) and
flagos with every op on the native route (`native-only`: an empty route table). For each model and
mode every side builds the case from the same CPU weights (concurrently: building is not timed),
then the timed rounds interleave across the sides, and each ratio is the median over the rounds
of that round's ratio (round i of every side ran in one turn, under one state of the machine),
with a 95% bootstrap interval over the rounds (resampled in pairs), and the host CPU time per run
against plain's, alike, which is what flagos adds (on the board
it varied between rounds as much as the wall time did). A CUDA side spins while it waits for the
GPU, which counts as CPU time: with --sleep-on-sync every side sleeps instead, and its CPU time is
its host work alone. A case is below its mode's target only when its whole interval is.

Modes (decode only for the architectures that generate):

    train      one AdamW step (bf16 autocast over fp32 weights on CUDA; fp32 on the host)
    prefill    an inference forward of the training batch (bf16 weights on CUDA): a language
               model's prompt prefill, the others' forward; its loss is the value compared
    decode     greedy `generate` with the KV cache at each --decode-batch (1 and 8), a fixed
               number of new tokens; tokens/s includes the prompt's prefill

A change to flagos itself is measured against another commit with --baseline: a checkout of it
(`git worktree add /tmp/base HEAD~1`) runs as one more flagos side, and each flagos column also
gives its throughput against that side's, from the same interleaved rounds.

How many rounds: --rounds, or with --interval-width W at least --rounds and then more until every
ratio's interval (against plain, and the baseline's) is at most W wide, within --max-rounds and
--case-seconds per case; a case that stops short is listed as WIDE at the end. On a steady machine
that ends after a few rounds, on a shared board it spends the rounds the noise needs.

Processes: a process's speed moves with its memory layout by more than its own rounds vary (on the
2-core host, two processes of one build, as a side and its --baseline, differed by 2-8% in every
case of a run, each with an interval of about +-0.01 that excluded 1). One process per side gives
intervals of the rounds alone; --processes N runs each side in N processes, every process takes
every round, and each interval also resamples each side's processes. Decide a change smaller than
a few percent, or a row near its target, with N of 3 or more.

Agreement with the plain side: on CUDA, the first --warmup training losses and every prefill loss
within a relative 2e-2 (bf16), and equal generated tokens; on the host, every loss bitwise equal
and equal tokens. The exit status is 1 when a case disagrees or a side fails.
"""

from __future__ import annotations

import argparse
import copy
import gc
import json
import os
import statistics
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))  # the helpers beside this script, however it is started
from side_processes import (  # noqa: E402
    EMPTY_TABLE,
    InterleavedRounds,
    RoundPlan,
    Side,
    add_processes_option,
    add_round_options,
    agreement,
    apply_sync_mode,
    calls_by_path,
    device_api,
    fmt,
    on_round_cpus,
    paired_difference,
    paired_ratio,
    pooled_processes,
    profile,
    ratio_interval_by_process,
    reply,
    serve,
    shared_cpus,
    side_env,
    timed_without_gc,
    zoo_module,
)

MODES = ("train", "prefill", "decode")
VARIANTS = ("tuned", "native-only")
BASELINE = "baseline"  # the variant name of the --baseline side
LR = 3e-4
# Relative agreement of the losses in bf16 on CUDA (on the host they must be bitwise equal).
BF16_RTOL = 2e-2
# Defaults that differ between the board and the host (fewer, shorter runs on two CPU cores).
DEFAULTS = {
    "board": dict(steps=5, rounds=5, warmup=3, new_tokens=64),
    "host": dict(steps=2, rounds=2, warmup=2, new_tokens=8),
}


def scaled(shape: object, scale: float) -> object:
    """`shape` (a zoo Shape) with its batch multiplied by `scale` (at least 1)."""
    return replace(shape, batch=max(1, round(shape.batch * scale)))


class ZooSide:
    """One side, in its own process: builds one case (model, mode) at a time from CPU weights made
    once per model, times rounds of it on demand, and reports it."""

    def __init__(self, side: str, variant: str, host: bool) -> None:
        if side == "flagos":
            import torch_fl
            from torch_fl.runtime.device.core import backing as current_backing

            if not torch_fl.is_active():
                sys.exit("flagos is not active here (on a CUDA machine set FLAGOS_PLATFORM, e.g. nvidia_h200)")
            self.device, self.backing = "flagos", current_backing()
        else:
            self.device = self.backing = "cpu" if host else "cuda"
        self.side, self.variant, self.size = side, variant, "host" if host else "board"
        if host:
            # One intra-op thread on every side: on a shared few-core host, a side whose kernels run
            # multi-threaded waits on busy cores at every parallel region, and its times say nothing.
            torch.set_num_threads(1)
        self.zoo = zoo_module()
        self.bf16 = self.backing != "cpu"
        self.sync, _, self.peak, self.reset_peak = device_api(self.device)
        self.cpu_model: tuple[str, torch.nn.Module] | None = None
        self.run: Callable[[], torch.Tensor] | None = None

    def weights(self, name: str) -> torch.nn.Module:
        """The model `name` on the CPU, from seed 0 (built once; every case copies it)."""
        if self.cpu_model is None or self.cpu_model[0] != name:
            self.cpu_model = None
            gc.collect()
            self.cpu_model = (name, self.zoo.build(name, self.size))
        return self.cpu_model[1]

    def on_device(self, inputs: dict[str, torch.Tensor], dtype: torch.dtype) -> dict[str, torch.Tensor]:
        return {k: v.to(self.device, dtype if v.is_floating_point() else None) for k, v in inputs.items()}

    def build(self, model: str, mode: str, scale: float, warmup: int, new_tokens: int, decode_batch: int = 1) -> dict:
        """Make the case's `run()` (one training step, one prefill, or one `generate`), warm it up."""
        arch = self.zoo.ARCHS[model]
        shape = scaled(arch.shapes[self.size], scale)
        cpu = self.weights(model)
        self.reset_peak()
        started = time.perf_counter()
        if mode == "train":
            net = copy.deepcopy(cpu).to(self.device).train()
            inputs = self.on_device(self.zoo.batch(model, cpu, shape), torch.float32)
            run = self.zoo.train_step(model, net, inputs, self.device, self.bf16, lr=LR)
        else:
            dtype = torch.bfloat16 if self.bf16 else torch.float32
            net = copy.deepcopy(cpu).to(self.device, dtype).eval()
            if mode == "prefill":
                inputs = self.on_device(self.zoo.batch(model, cpu, shape), dtype)

                def run() -> torch.Tensor:
                    with torch.inference_mode():
                        return arch.loss(net, inputs).float()
            else:
                prompt = self.zoo.prompt(cpu, decode_batch, shape.prompt).to(self.device)

                def run() -> torch.Tensor:
                    with torch.inference_mode():
                        return self.zoo.generate(net, prompt, new_tokens)

        self.run, self.mode = run, mode
        self.checks = [self.run().tolist() for _ in range(warmup if mode != "decode" else 1)]
        self.sync()
        self.rounds: list[float] = []
        self.cpu_rounds: list[float] = []
        work = {"train": shape.batch, "prefill": shape.batch, "decode": decode_batch * new_tokens}[mode]
        return {
            "ready": True,
            "warmup_s": round(time.perf_counter() - started, 2),
            "batch": shape.batch,
            "seq": shape.seq,
            "prompt": shape.prompt,
            "work_per_run": work,
            "parameters": sum(p.numel() for p in cpu.parameters()),
            # Module.parameters() lists a shared parameter once: more here than on the CPU means the
            # move to the device gave modules their own copies
            "parameter_tensors": len(list(net.parameters())),
            "cpu_parameter_tensors": len(list(cpu.parameters())),
        }

    def round(self, runs: int) -> dict:
        """ms per run over `runs` back-to-back runs, one synchronisation at the end. On a device one
        untimed run goes first: while the other sides had their turn, this side's GPU clocks, caches
        and allocator went cold, and the first run after a pause is slower by a varying amount."""
        assert self.run is not None
        with on_round_cpus():
            if self.backing != "cpu":
                self.run()
            self.sync()
            with timed_without_gc() as timed:
                outputs = [self.run() for _ in range(runs)]
                self.sync()
        self.rounds.append(timed.wall_s / runs * 1e3)
        self.cpu_rounds.append(timed.cpu_s / runs * 1e3)
        if self.mode != "decode":  # decode is checked on the tokens of its warm-up run
            self.checks += [x.tolist() for x in outputs]
        return {"ms": self.rounds[-1]}

    def finish(self, profile_runs: int = 0) -> dict:
        """The case's result; then the case is dropped (its memory freed)."""
        assert self.run is not None
        result = {
            "side": self.side,
            "variant": self.variant,
            "device": self.device,
            "backing": self.backing,
            "ms_per_run": statistics.median(self.rounds),
            "ms_per_run_rounds": self.rounds,
            "host_cpu_ms_per_run": statistics.median(self.cpu_rounds),
            "host_cpu_ms_per_run_rounds": self.cpu_rounds,
            "peak_memory_bytes": max(self.peak(), 0) or None,
            "checks": self.checks,
        }
        if self.side == "flagos":
            result["calls_by_path"] = calls_by_path(self.run)
        if profile_runs:
            result["profile"] = profile(self.run, self.sync, profile_runs)
        self.run = None
        gc.collect()
        if self.device != "cpu":
            getattr(torch, self.device).empty_cache()
        return result


def serve_side(side: str, variant: str, host: bool) -> None:
    import transformers

    sleeps = apply_sync_mode()  # before this process first uses CUDA
    runner = ZooSide(side, variant, host)
    ready = {
        "ready": True,
        "sleep_on_sync": sleeps,
        "backing": runner.backing,
        "torch": torch.__version__,
        "transformers": transformers.__version__,
    }
    if side == "flagos":
        import torch_fl

        ready["platform"] = torch_fl.active_platform().name
        ready["torch_fl"] = str(Path(torch_fl.__file__).parent)  # which checkout (see --baseline)
    reply(ready)
    commands = {"build": runner.build, "round": runner.round, "finish": runner.finish}
    serve({**{name: guarded(fn) for name, fn in commands.items()}, "exit": lambda: {}}, last="exit")


def guarded(command: Callable[..., dict]) -> Callable[..., dict]:
    """`command`, replying {"error": ...} where it raises: a case that fails on one side (an op the
    backing lacks, say) is reported, and the side goes on with the next case."""

    def call(**arguments: object) -> dict:
        try:
            return command(**arguments)
        except Exception as error:  # noqa: BLE001 - any failure of the case is the result
            traceback.print_exc()  # into the side's log
            return {"error": f"{type(error).__name__}: {error}"[:600]}

    return call


def compare(flagos: dict, plain: dict, mode: str, exact: bool, warmup: int) -> tuple[bool, str]:
    """Does a flagos side agree with the plain side, and how (a few words)."""
    a, b = flagos["checks"], plain["checks"]
    if mode == "decode":
        if a == b:
            return True, "tokens equal"
        rows = [next((i for i, (x, y) in enumerate(zip(ra, rb)) if x != y), None) for ra, rb in zip(a[0], b[0])]
        first = min((i for i in rows if i is not None), default=0)
        return False, f"tokens differ from token {first} of {len(a[0][0])}"
    if exact:
        return a == b, "losses bitwise equal" if a == b else "losses differ"
    # bf16 training amplifies rounding from step to step: the first steps are judged (train_step.py)
    judged = warmup if mode == "train" else len(b)
    ok, worst = agreement(a[:judged], b[:judged], BF16_RTOL)
    what = f"first {judged} losses" if mode == "train" else "losses"
    return ok and len(a) == len(b), f"{what} within {worst:.1e}"


class Run:
    """The parent: the side processes, the cases, the table."""

    def __init__(self, args: argparse.Namespace, scratch: Path) -> None:
        self.args, self.scratch = args, scratch
        (scratch / "routes.yaml").write_text(EMPTY_TABLE)
        self.labels = ["plain", *(f"flagos {v}" for v in args.variants)]
        # every process of every side starts concurrently
        self.handles = {label: [self.start(label) for _ in range(args.processes)] for label in self.labels}
        failed = {label: h.failed for label, hs in self.handles.items() for h in hs if h.wait() is None}
        if failed:
            sys.exit(f"a side failed to start: {failed}")
        self.info = {label: hs[0].ready for label, hs in self.handles.items()}

    def start(self, label: str) -> Side:
        side, _, variant = label.partition(" ")
        command = [sys.executable, __file__, "--child", f"{side}:{variant or 'plain'}"]
        command += ["--host"] if self.args.host else []
        platform = "host_ref" if self.args.host else None
        routes = "tuned" if variant in ("", BASELINE) else variant
        env = side_env(side, routes, self.scratch / "routes.yaml", platform, self.args.sleep_on_sync)
        if variant == BASELINE:  # torch_fl and its platforms (descriptors, routes, records) from the other checkout
            base = self.args.baseline.resolve()
            for name, path in (("PYTHONPATH", base), ("FLAGOS_PLATFORM_PATH", base / "platforms")):
                env[name] = os.pathsep.join(p for p in (str(path), env.get(name, "")) if p)
        log = self.scratch / f"{label.replace(' ', '-')}.log"
        return Side(command, env, log, wait=False, cpus=None if self.args.host else shared_cpus())

    def case(self, model: str, mode: str, decode_batch: int) -> dict:
        """One case on every side: build everywhere, interleave the timed rounds, collect."""
        a = self.args
        for label, handles in self.handles.items():
            if any(h.failed is not None for h in handles):  # a side that died in an earlier case starts afresh
                for h in handles:
                    h.close()
                self.handles[label] = [self.start(label) for _ in handles]
                for h in self.handles[label]:
                    h.wait()
        for handle in (h for hs in self.handles.values() for h in hs):
            handle.send(
                "build",
                model=model,
                mode=mode,
                scale=a.scale,
                warmup=a.warmup,
                new_tokens=a.new_tokens,
                decode_batch=decode_batch,
            )
        replies = {label: first_error([h.receive() for h in hs]) for label, hs in self.handles.items()}
        built = {label: r for label, r in replies.items() if r is not None and "error" not in r}
        shape = next(iter(built.values()), {})
        errors = {label: self.why(label, r) for label, r in replies.items() if label not in built}
        runs = 1 if mode == "decode" else a.steps
        rounds = InterleavedRounds(RoundPlan.from_args(a), "plain")
        for r in rounds:
            order, turn = list(built), r % max(len(built), 1)
            for label in order[turn:] + order[:turn]:  # each side leads in turn
                answers = [h.ask("round", runs=runs) for h in self.handles[label]]
                answer = first_error(answers)
                if answer is None or "error" in answer:
                    errors[label] = self.why(label, answer)
                    del built[label]
                    rounds.drop(label)
                else:
                    for process, each in enumerate(answers):
                        rounds.add(label, each["ms"], process)
        results = {label: self.finish(label, a.profile_runs if a.profile else 0) for label in built}
        for label, result in results.items():
            if result is None or "error" in result:
                errors[label] = self.why(label, result)
        results = {
            label: {**r, "parameter_tensors": built[label]["parameter_tensors"]}
            for label, r in results.items()
            if label not in errors
        }
        case = {
            "model": model,
            "mode": mode if mode != "decode" else f"decode-b{decode_batch}",
            "shape": shape,
            "sides": results,
            "failed": errors,
            "flagos": {},
            **rounds.summary(),
        }
        plain = results.get("plain")
        for variant in a.variants:
            mine = results.get(f"flagos {variant}")
            if mine is None or plain is None:
                continue
            ok, how = compare(mine, plain, mode, exact=a.host, warmup=a.warmup)
            untied = mine["parameter_tensors"] - shape["cpu_parameter_tensors"]
            how += f" ({untied} untied)" if untied else ""
            case["flagos"][variant] = {
                "ratio": round(paired_ratio(plain["ms_by_process"], mine["ms_by_process"]), 4),
                # fastest round against fastest round: what each side can do at the host's best
                "best_round_ratio": round(min(plain["ms_per_run_rounds"]) / min(mine["ms_per_run_rounds"]), 4),
                "ratio_interval": ratio_interval_by_process(plain["ms_by_process"], mine["ms_by_process"]),
                # host CPU time per run, flagos over plain: what flagos adds on the host
                "host_cpu_ratio": round(paired_ratio(mine["cpu_ms_by_process"], plain["cpu_ms_by_process"]), 4),
                "host_cpu_interval": ratio_interval_by_process(mine["cpu_ms_by_process"], plain["cpu_ms_by_process"]),
                "host_us_per_routed_call": host_us_per_routed_call(mine, plain),
                "agree": ok,
                "how": how,
            }
            baseline = results.get(f"flagos {BASELINE}")
            if baseline is not None and variant != BASELINE:
                case["flagos"][variant]["over_baseline"] = round(
                    paired_ratio(baseline["ms_by_process"], mine["ms_by_process"]), 4
                )
                case["flagos"][variant]["over_baseline_interval"] = ratio_interval_by_process(
                    baseline["ms_by_process"], mine["ms_by_process"]
                )
        return case

    def finish(self, label: str, profile_runs: int) -> dict | None:
        """Side `label`'s result: its first process's (checks, routed calls, profile), with the rounds
        of every process; None or an error where a process fails or its checks differ."""
        replies = [
            h.ask("finish", profile_runs=profile_runs if i == 0 else 0) for i, h in enumerate(self.handles[label])
        ]
        result = first_error(replies)
        if result is None or "error" in result:
            return result
        if any(r["checks"] != result["checks"] for r in replies):
            return {"error": f"the processes of {label} computed different results"}
        return {**result, **pooled_processes(replies, "run")}

    def why(self, label: str, reply: dict | None) -> str | None:
        """What went wrong on side `label`: the error its reply names, or how a process of it ended."""
        return (reply or {}).get("error") or next((h.failed for h in self.handles[label] if h.failed), None)

    def close(self) -> None:
        for handle in (h for hs in self.handles.values() for h in hs):
            if handle.failed is None:
                handle.ask("exit")
            handle.close()


def first_error(replies: list[dict | None]) -> dict | None:
    """The first of one side's replies (one per process) that failed, else its first."""
    return next((r for r in replies if r is None or "error" in r), replies[0])


def rate(case: dict) -> str:
    """The plain side's speed: ms per run, or tokens/s when decoding."""
    plain = case["sides"].get("plain")
    if plain is None:
        return "FAILED"
    if case["mode"].startswith("decode"):
        return f"{case['shape']['work_per_run'] / plain['ms_per_run'] * 1e3:.1f} tok/s"
    return f"{fmt(plain['ms_per_run'], 2)} ms"


def describe(case: dict) -> str:
    s = case["shape"]
    if not s:
        return "-"
    if case["mode"].startswith("decode"):
        return f"{s['prompt']} + {s['work_per_run'] // int(case['mode'].removeprefix('decode-b'))} tok"
    return f"{s['batch']} x {s['seq']}"


def count(n: int) -> str:
    return f"{n / 1e6:.1f}M" if n >= 1e5 else f"{n / 1e3:.1f}k"


# a flagos column: "0.879x [0.861, 0.902] cpu 1.21x [1.18, 1.25] +2.10us/routed first 2 losses within 6.2e-06"
CELL = 90
TARGETS = {"train": 0.97, "prefill": 0.97, "decode": 0.95}
"""Throughput against plain that a flagos side should reach, per mode: a case is below it only
when its whole interval is."""


def interval(r: dict) -> str:
    bounds = r.get("ratio_interval")
    return f"[{bounds[0]:.3f}, {bounds[1]:.3f}]" if bounds else f"(best rounds {r['best_round_ratio']:.2f})"


def host_cpu(r: dict) -> str:
    bounds = r.get("host_cpu_interval")
    return f"cpu {r['host_cpu_ratio']:.2f}x" + (f" [{bounds[0]:.2f}, {bounds[1]:.2f}]" if bounds else "")


def host_us_per_routed_call(flagos: dict, plain: dict) -> float | None:
    """The host CPU time flagos adds per run (paired within rounds, as the cpu ratio is) over its
    routed calls per run: what one routed call costs inside the model (the warm loop of
    dispatch_overhead.py shows far less). On a GPU a side spins while it waits, so where the GPU
    bounds a run this counts that wait too."""
    routed = sum(flagos.get("calls_by_path", {}).values())
    if not routed:
        return None
    added_ms = paired_difference(plain["cpu_ms_by_process"], flagos["cpu_ms_by_process"])
    return round(added_ms * 1e3 / routed, 3)


def per_routed_call(r: dict) -> str:
    us = r.get("host_us_per_routed_call")
    return "" if us is None else f" {us:+.2f}us/routed"


def against_baseline(r: dict) -> str:
    if "over_baseline" not in r:
        return ""
    bounds = r["over_baseline_interval"]
    return f"; {r['over_baseline']:.3f}x baseline" + (f" [{bounds[0]:.3f}, {bounds[1]:.3f}]" if bounds else "")


def row(c: dict, variants: list[str]) -> str:
    """One case: the plain side's speed, then per flagos side its ratio and agreement."""
    cells = []
    for v in variants:
        r = c["flagos"].get(v)
        cells.append(
            "FAILED (below)"
            if f"flagos {v}" in c["failed"]
            else "-"
            if r is None
            else f"{r['ratio']:.3f}x {interval(r)} {host_cpu(r)}{per_routed_call(r)} {'' if r['agree'] else 'DIFFER: '}{r['how']}"
            + against_baseline(r)
        )
    params = count(c["shape"]["parameters"]) if c["shape"] else "-"
    plain = rate(c) + (f", {c['rounds']} rounds" if "narrow_enough" in c else "")  # a count the plan chose
    return f"{c['model']:10s}{c['mode']:11s}{params:>9s}  {describe(c):16s}{plain:>14s}" + "".join(
        f"  {cell:>{CELL}s}" for cell in cells
    )


def columns(variants: list[str]) -> str:
    return f"{'model':10s}{'mode':11s}{'params':>9s}  {'shape':16s}{'plain':>14s}" + "".join(
        f"  {'flagos ' + v:>{CELL}s}" for v in variants
    )


def closing(cases: list[dict]) -> str:
    """What follows the rows: how to read them, and every failure in full."""
    lines = [
        "flagos columns: throughput against plain (plain time / flagos time; above 1: flagos faster), the "
        "median of the rounds' ratios, its 95% bootstrap interval over the interleaved rounds (and the processes, with --processes), "
        "host CPU time per run against plain's (cpu; flagos over plain, with its interval) and the host CPU time "
        "it adds per routed call (us/routed: the median of the rounds' differences over the run's routed calls), then the agreement check; with --baseline, then the "
        "throughput against the baseline's (baseline time / this side's time, with its interval)"
    ]
    for c in cases:
        target = TARGETS[c["mode"].split("-")[0]]
        for variant, r in c["flagos"].items():
            bounds = r.get("ratio_interval")
            if bounds and bounds[1] < target:
                lines.append(f"BELOW TARGET {c['model']} {c['mode']} {variant}: {interval(r)} under {target}")
        if c.get("narrow_enough") is False:
            lines.append(
                f"WIDE {c['model']} {c['mode']}: {c['rounds']} rounds left an interval {c['widest_interval']} wide"
            )
    lines += [f"FAILED {c['model']} {c['mode']} on {label}: {why}" for c in cases for label, why in c["failed"].items()]
    return "\n".join(lines)


def header(args: argparse.Namespace, info: dict[str, dict]) -> str:
    plain, flagos = info["plain"], next(v for k, v in info.items() if k != "plain")
    return (
        f"model zoo: {'host sizes, fp32' if args.host else 'board sizes, bf16'}, backing {plain['backing']}, "
        f"platform {flagos.get('platform')}, torch {plain['torch']}, transformers {plain['transformers']}; "
        f"medians of {RoundPlan.from_args(args).describe()} ({args.steps} runs each; decode: 1 generate of "
        f"{args.new_tokens} tokens per round)"
        + (f"; {args.processes} processes per side" if args.processes > 1 else "")
    )


def save(args: argparse.Namespace, info: dict[str, dict], cases: list[dict], profiles: dict[str, dict]) -> bool:
    """Write --json and --profile (after every case: a run cut short keeps what it measured); whether
    every case agrees."""
    all_agree = all(r["agree"] for c in cases for r in c["flagos"].values()) and not any(c["failed"] for c in cases)
    if args.json:
        Path(args.json).write_text(json.dumps({"info": info, "cases": cases, "all_agree": all_agree}, indent=1) + "\n")
    if args.profile:
        Path(args.profile).write_text(json.dumps(profiles, indent=1) + "\n")
    return all_agree


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--host",
        action="store_true",
        help="host sizes, fp32, flagos (host_ref) against the CPU (the default where CUDA is absent)",
    )
    parser.add_argument("--models", help="comma-separated architectures (default: all)")
    parser.add_argument("--modes", default=",".join(MODES), help=f"comma-separated of {', '.join(MODES)}")
    parser.add_argument(
        "--variants",
        default=",".join(VARIANTS),
        help="flagos sides: tuned (routes.yaml), native-only (empty route table)",
    )
    parser.add_argument(
        "--baseline",
        type=Path,
        help="a checkout of torch_fl (a git worktree of another commit, say) run as one more flagos side, "
        "`flagos baseline`, with its own platforms; every other flagos column then also gives its "
        "throughput against the baseline's, with its interval",
    )
    add_processes_option(parser)
    parser.add_argument("--scale", type=float, default=1.0, help="multiply every training and prefill batch")
    parser.add_argument("--decode-batch", default="1,8", help="comma-separated decode batch sizes")
    parser.add_argument("--new-tokens", type=int, help="tokens generated per decode run (board 64, host 8)")
    parser.add_argument("--steps", type=int, help="back-to-back runs per timed round (board 5, host 2)")
    add_round_options(parser, None, "timed rounds per side, interleaved (board 5, host 2)")
    parser.add_argument("--warmup", type=int, help="untimed runs first; their losses are checked (board 3, host 2)")
    parser.add_argument("--json", help="write every case, side and check here")
    parser.add_argument("--profile", help="write each side's host time per op per case here (JSON)")
    parser.add_argument("--profile-runs", type=int, default=3, help="runs profiled with --profile")
    parser.add_argument(
        "--sleep-on-sync",
        action="store_true",
        help="every side sleeps while it waits for the GPU instead of spinning: host CPU time then "
        "counts host work only (by default it equals wall time wherever a side waits)",
    )
    parser.add_argument("--child", help="(internal) SIDE:VARIANT: serve one side")
    args = parser.parse_args()
    args.host = args.host or not torch.cuda.is_available()
    if args.child:
        side, variant = args.child.split(":")
        serve_side(side, variant, args.host)
        return
    for key, value in DEFAULTS["host" if args.host else "board"].items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    zoo = zoo_module()
    models = args.models.split(",") if args.models else list(zoo.ARCHS)
    modes, args.variants = args.modes.split(","), args.variants.split(",")
    unknown = [m for m in models if m not in zoo.ARCHS] + [m for m in modes if m not in MODES]
    unknown += [v for v in args.variants if v not in VARIANTS]
    if unknown:
        sys.exit(f"unknown model, mode or variant: {', '.join(unknown)}")
    if args.baseline is not None:
        if not (args.baseline / "torch_fl" / "__init__.py").is_file():
            sys.exit(f"--baseline {args.baseline}: expected a checkout of torch_fl (no torch_fl/__init__.py there)")
        args.variants.append(BASELINE)

    cases: list[dict] = []
    profiles: dict[str, dict] = {}
    all_agree = True
    with tempfile.TemporaryDirectory() as folder:
        run = Run(args, Path(folder))
        print(header(args, run.info), columns(args.variants), sep="\n", flush=True)
        try:
            for model in models:
                for mode in modes:
                    if mode == "decode" and not zoo.ARCHS[model].generates:
                        continue
                    for decode_batch in [int(b) for b in args.decode_batch.split(",")] if mode == "decode" else [1]:
                        cases.append(run.case(model, mode, decode_batch))
                        c = cases[-1]
                        profiles[f"{model} {c['mode']}"] = {k: s.pop("profile", None) for k, s in c["sides"].items()}
                        print(row(c, args.variants), flush=True)
                        all_agree = save(args, run.info, cases, profiles)
        finally:
            run.close()
    print(closing(cases))
    sys.exit(0 if all_agree else 1)


if __name__ == "__main__":
    main()
