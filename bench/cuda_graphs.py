"""CUDA graphs on flagos against plain CUDA, side by side (a board with CUDA; flagos on a CUDA backing).

    FLAGOS_PLATFORM=nvidia_h200 python bench/cuda_graphs.py
    FLAGOS_PLATFORM=nvidia_h200 python bench/cuda_graphs.py --cases mlp --rounds 7 --json out.json

Two sides, each in live processes (bench/side_processes.py; --processes N per side, default 1):
plain CUDA (it never imports torch_fl) and flagos with the platform's routes. Every process builds
each case from the same seeded CPU weights, warms it up (compile, CUDA graph recording), then the
timed rounds interleave across the sides and their processes, each round on the cores the zoo's
rounds use (side_processes.shared_cpus), and each ratio is the median of the rounds' ratios, with a
95% bootstrap interval over the rounds (paired) and, with several processes, the processes. With
--interval-width W, rounds are added after --rounds until the interval is at most W wide (within
--max-rounds and --case-seconds; keep those inside --timeout); a case that stops short says WIDE.

Cases, both under `torch.compile(mode="reduce-overhead")` (inductor's CUDA graph trees):

    mlp     an 8-layer bf16 MLP (Linear + GELU, --width, batch --batch), inference: us per call
    decode  greedy decoding of a small randomly initialised Llama (transformers, bf16) with a
            static KV cache: the forward's one-token decode steps compiled
            (`torch.compile(model.forward, mode="reduce-overhead")`, the prefill eager, as
            transformers does it) and `generate(..., cache_implementation="static",
            disable_compile=True)` on both sides (transformers would otherwise compile the forward
            itself on "cuda" only): tokens/s, the prompt's prefill included

Each side also times its compiled graph's calls: the whole call as inductor makes it
(`compile_fx.cudagraphify`'s callable, which on flagos is the boundary that hands the graph CUDA
aliases and takes flagos tensors back) and the part inside the tree manager (the callable
`cudagraph_trees.cudagraphify_impl` returns). Their difference is what the boundary costs per call.

Each side reports how many CUDA graphs inductor recorded and how many it skipped (the inductor
counter `cudagraph_skips`); a case passes only with graphs recorded and none skipped on both
sides, none more on flagos than on plain during the timed rounds (a warmed-up case replays), MLP
outputs that agree (relative 2e-2, bf16) and equal generated tokens. The exit status
is 1 when a case fails or a side dies, 2 when the run passes --timeout (default 150 s): the sides
are killed then, and each side's log (its faulthandler stacks included) is named.
"""

from __future__ import annotations

import argparse
import faulthandler
import json
import os
import signal
import statistics
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))  # the helpers beside this script, however it is started
from side_processes import (  # noqa: E402
    InterleavedRounds,
    RoundPlan,
    Side,
    add_processes_option,
    add_round_options,
    on_round_cpus,
    paired_ratio,
    ratio_interval_by_process,
    reply,
    serve,
    shared_cpus,
    side_env,
    timed_without_gc,
    zoo_module,
)

CASES = ("mlp", "decode")
RTOL = 2e-2  # outputs of the two sides agree within this relative difference (bf16)


@dataclass(frozen=True)
class Dims:
    """The sizes of both cases (the same on both sides)."""

    width: int = 1024
    layers: int = 8
    batch: int = 16
    hidden: int = 512
    lm_layers: int = 4
    prompt: int = 16
    new_tokens: int = 32


def mlp(dims: Dims) -> torch.nn.Module:
    """The MLP on the CPU, from seed 0: `layers` blocks of Linear(width, width) and GELU."""
    torch.manual_seed(0)
    blocks: list[torch.nn.Module] = []
    for _ in range(dims.layers):
        blocks += [torch.nn.Linear(dims.width, dims.width), torch.nn.GELU()]
    return torch.nn.Sequential(*blocks)


def llama(dims: Dims) -> torch.nn.Module:
    """A small Llama on the CPU, from seed 0 (GQA 8 query / 2 key-value heads, 32000 tokens)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(
        hidden_size=dims.hidden,
        intermediate_size=dims.hidden * 11 // 4,
        num_hidden_layers=dims.lm_layers,
        num_attention_heads=8,
        num_key_value_heads=2,
        vocab_size=32000,
        max_position_embeddings=2048,
        tie_word_embeddings=False,
    )
    return LlamaForCausalLM(config)


class GraphCallTimer:
    """Times each call of the compiled graphs: the whole call inductor makes (`outer`) and the
    tree manager's part of it (`inner`)."""

    def __init__(self) -> None:
        self.ns = {"outer": 0, "inner": 0}
        self.calls = {"outer": 0, "inner": 0}

    def install(self) -> GraphCallTimer:
        """Wraps inductor's graph wrappers: before anything compiles, after flagos has registered
        (its boundary replaces `compile_fx.cudagraphify` when inductor loads)."""
        import torch._inductor.compile_fx as compile_fx
        import torch._inductor.cudagraph_trees as trees

        outer, inner = compile_fx.cudagraphify, trees.cudagraphify_impl
        compile_fx.cudagraphify = lambda *a, **k: self.timed(outer(*a, **k), "outer")
        trees.cudagraphify_impl = lambda *a, **k: self.timed(inner(*a, **k), "inner")
        return self

    def timed(self, fn: Callable[..., Any], part: str) -> Callable[..., Any]:
        def call(*args: Any, **kwargs: Any) -> Any:
            started = time.perf_counter_ns()
            try:
                return fn(*args, **kwargs)
            finally:
                self.ns[part] += time.perf_counter_ns() - started
                self.calls[part] += 1

        return call

    def take(self) -> dict[str, float | None]:
        """us per call of each part since the last take (None: no call)."""
        per_call = {p: self.ns[p] / self.calls[p] / 1e3 if self.calls[p] else None for p in self.ns}
        self.ns = dict.fromkeys(self.ns, 0)
        self.calls = dict.fromkeys(self.calls, 0)
        return per_call


def graph_counts() -> dict[str, int]:
    """CUDA graphs inductor's tree manager recorded on device 0, and the cudagraph skips counted."""
    from torch._dynamo.utils import counters
    from torch._inductor.cudagraph_trees import get_manager

    recorded = 0
    manager = get_manager(0, create_if_none_exists=False)
    if manager is not None:
        nodes = [node for roots in (manager.roots or {}).values() for node in roots]
        while nodes:
            node = nodes.pop()
            recorded += 1
            nodes += [child for children in node.children.values() for child in children]
    return {"recorded": recorded, "skips": int(counters["inductor"]["cudagraph_skips"])}


class GraphSide:
    """One side, in its own process: builds one case at a time, times rounds of it on demand."""

    def __init__(self, side: str, compiled: bool = True, device: str | None = None) -> None:
        if device is not None:  # the tests' way to run a case's host logic on the CPU
            self.device, self.sync = device, lambda: None
        elif side == "flagos":
            import torch_fl
            from torch_fl.runtime.device.core import backing

            if not torch_fl.is_active() or backing() != "cuda":
                sys.exit("flagos on a CUDA backing is not active here (set FLAGOS_PLATFORM, e.g. nvidia_h200)")
            self.device = "flagos"
            self.sync: Callable[[], None] = torch.flagos.synchronize
        else:
            self.device = "cuda"
            self.sync = torch.cuda.synchronize
        self.compiled = compiled
        self.timer = GraphCallTimer().install() if compiled else None
        self.run: Callable[[], torch.Tensor] | None = None

    def compile(self, fn: Callable[..., torch.Tensor]) -> Callable[..., torch.Tensor]:
        return torch.compile(fn, mode="reduce-overhead") if self.compiled else fn

    def decode_steps_compiled(self, forward: Callable[..., Any]) -> Callable[..., Any]:
        """`forward` compiled for one-token decode steps only, as transformers' generate compiles
        it: the prefill runs eagerly, which allocates the static cache outside any graph and marks
        its tensors static, so the graphs update them in place. (Compiled, the prefill would make
        the cache inside the graph, unmarked: cudagraphs skip its in-place updates.)"""
        compiled = self.compile(forward)

        def step(*args: Any, **kwargs: Any) -> Any:
            ids = kwargs.get("input_ids", args[0] if args else None)
            one_token = ids is not None and ids.shape[-1] == 1
            return (compiled if one_token else forward)(*args, **kwargs)

        return step

    def build(self, case: str, dims: dict) -> dict:
        """Make the case's `run()` (one MLP call, or one `generate`) and warm it up."""
        d = Dims(**dims)
        torch._dynamo.reset()
        from torch._dynamo.utils import counters

        counters.clear()
        started = time.perf_counter()
        if case == "mlp":
            net = mlp(d).to(self.device, torch.bfloat16).eval()
            compiled = self.compile(net)
            x = torch.randn(d.batch, d.width, generator=torch.Generator().manual_seed(1)).to(
                self.device, torch.bfloat16
            )

            def run() -> torch.Tensor:
                with torch.no_grad():
                    return compiled(x)

            warmup, work = 5, 1
        else:
            decode = zoo_module().generate
            lm = llama(d).to(self.device, torch.bfloat16).eval()
            lm.forward = self.decode_steps_compiled(lm.forward)
            prompt = torch.randint(0, 32000, (1, d.prompt), generator=torch.Generator().manual_seed(1)).to(self.device)

            def run() -> torch.Tensor:
                with torch.no_grad():
                    # the compiled forward is ours, alike on both sides: transformers compiles none
                    return decode(lm, prompt, d.new_tokens, cache_implementation="static", disable_compile=True)

            warmup, work = 3, d.new_tokens
        for _ in range(warmup):
            out = run()
        self.sync()
        if self.timer is not None:
            self.timer.take()  # the rounds time replays, not the compilation and recording
        self.run = run
        check = out.float().flatten()[:64].tolist() if case == "mlp" else out.flatten().tolist()
        return {"warmup_s": round(time.perf_counter() - started, 2), "work": work, "check": check, **graph_counts()}

    def round(self, runs: int) -> dict:
        assert self.run is not None
        self.sync()
        with on_round_cpus(), timed_without_gc() as timed:
            for _ in range(runs):
                self.run()
            self.sync()
        graph_call_us = self.timer.take() if self.timer is not None else {}
        return {
            "wall_s": timed.wall_s,
            "cpu_s": timed.cpu_s,
            "recorded": graph_counts()["recorded"],
            "graph_call_us": graph_call_us,
        }

    def finish(self) -> dict:
        return {"done": True}


def serve_side(side: str, timeout: float) -> None:
    # A hung side leaves its stacks in its log, just before the parent's deadline kills it.
    faulthandler.dump_traceback_later(max(1.0, timeout - 5), exit=True)
    bench = GraphSide(side)
    reply({"ready": True, "device": bench.device, "torch": torch.__version__, "gpu": torch.cuda.get_device_name()})
    serve({"build": guarded(bench.build), "round": guarded(bench.round), "finish": bench.finish}, "finish")


def guarded(command: Callable[..., dict]) -> Callable[..., dict]:
    """A command whose exception becomes an error reply (the side stays up for the next case)."""

    def call(**arguments: object) -> dict:
        try:
            return command(**arguments)
        except Exception as exc:  # noqa: BLE001 - reported to the parent, which fails the case
            traceback.print_exc()
            return {"error": f"{type(exc).__name__}: {exc}"[:600]}

    return call


def agree(case: str, plain: list, flagos: list) -> bool:
    """Outputs agree: MLP values within RTOL of the largest, generated tokens equal."""
    if case == "decode":
        return plain == flagos
    scale = max((abs(v) for v in plain), default=0.0) or 1.0
    return len(plain) == len(flagos) and all(abs(a - b) <= RTOL * scale for a, b in zip(plain, flagos))


def summarize(
    case: str,
    built: dict[str, list[dict]],
    rounds: dict[str, list[list[float]]],
    runs: int,
    calls: dict[str, list[dict]] | None = None,
) -> dict:
    """A case's numbers from each side's processes (`built`: their build replies, with
    "recorded_after_rounds" once timed; `rounds`: their wall seconds per round): per side the median
    round as us per call (mlp) or tokens/s (decode), and flagos against plain (a time ratio for
    mlp, a rate ratio for decode; > 1 means flagos is slower for mlp, faster for decode), with its
    bootstrap interval over the rounds and the processes; and the case's verdict."""
    sides: dict[str, dict] = {}
    for side, by_process in rounds.items():
        per_run = statistics.median(w for walls in by_process for w in walls) / runs
        work = built[side][0]["work"]
        value = per_run * 1e6 if case == "mlp" else work / per_run
        sides[side] = {
            "value": round(value, 2),
            "processes": len(by_process),
            "recorded": min(b["recorded"] for b in built[side]),
            "recorded_in_rounds": max(
                b.get("recorded_after_rounds", b["recorded"]) - b["recorded"] for b in built[side]
            ),
            "skips": sum(b["skips"] for b in built[side]),
            # the median round's us per graph call: the whole call and the tree manager's part
            "graph_call_us": {
                part: round(statistics.median(vs), 2)
                if (vs := [c[part] for c in (calls or {}).get(side, []) if c.get(part)])
                else None
                for part in ("outer", "inner")
            },
        }
    result: dict = {"case": case, "unit": "us/call" if case == "mlp" else "tokens/s", "sides": sides}
    # The time ratio flagos/plain (mlp), or the rate ratio flagos/plain (decode) = plain/flagos time.
    reference, mine = (rounds["plain"], rounds["flagos"]) if case == "decode" else (rounds["flagos"], rounds["plain"])
    result["ratio"] = round(paired_ratio(reference, mine), 4)
    result["interval"] = ratio_interval_by_process(reference, mine)
    problems = []
    for side in ("plain", "flagos"):
        if sides[side]["recorded"] == 0:
            problems.append(f"{side}: no CUDA graph recorded")
        if sides[side]["skips"]:
            problems.append(f"{side}: {sides[side]['skips']} cudagraph skips")

    # A graph flagos records during the timed rounds where plain CUDA does not means its inputs
    # stopped matching the recorded ones (a recording per call, timed as a replay). Plain may record
    # one too: transformers makes a new static cache per generate, at addresses the allocator picks.
    again = {side: sides[side]["recorded_in_rounds"] for side in ("plain", "flagos")}
    if again["flagos"] > again["plain"]:
        problems.append(f"flagos: {again['flagos']} graphs recorded during the timed rounds (plain: {again['plain']})")
    reference = built["plain"][0]["check"]
    if not all(agree(case, reference, b["check"]) for side in ("plain", "flagos") for b in built[side]):
        problems.append("outputs differ between plain and flagos")
    result["problems"] = problems
    result["ok"] = not problems
    return result


def call_us(side: dict) -> str:
    us = side.get("graph_call_us") or {}
    whole, inner = us.get("outer"), us.get("inner")
    return "-" if whole is None or inner is None else f"{whole:.2f} ({inner:.2f})"


def graphs(side: dict) -> str:
    """Graphs recorded while warming up, then "+n" for those recorded during the timed rounds."""
    later = side["recorded_in_rounds"]
    return f"{side['recorded']}" + (f"+{later}" if later else "")


def report(info: dict, results: list[dict]) -> str:
    lines = [
        f"CUDA graphs (torch.compile mode='reduce-overhead'): flagos against plain CUDA on {info.get('gpu', '?')}, "
        f"torch {info.get('torch', '?')}",
        f"{'case':8s}{'unit':>10s}{'plain':>11s}{'flagos':>11s}{'ratio':>9s}  {'95% interval':16s}graphs p/f   verdict",
    ]
    for r in results:
        if "error" in r:
            lines.append(f"{r['case']:8s}  FAILED: {r['error']}")
            continue
        p, f = r["sides"]["plain"], r["sides"]["flagos"]
        low_high = "-" if r["interval"] is None else f"[{r['interval'][0]:.3f}, {r['interval'][1]:.3f}]"
        verdict = "ok" if r["ok"] else "FAILED: " + "; ".join(r["problems"])
        lines.append(
            f"{r['case']:8s}{r['unit']:>10s}{p['value']:>11.2f}{f['value']:>11.2f}{r['ratio']:>9.3f}  "
            f"{low_high:16s}{graphs(p):>5s}/{graphs(f):<5s}  {verdict}"
        )
        lines.append(f"{'':8s}us per graph call, whole (tree manager): plain {call_us(p)}, flagos {call_us(f)}")
        if r.get("narrow_enough") is False:
            lines.append(f"{'':8s}WIDE: {r['rounds']} rounds left the interval {r['widest_interval']} wide")
    lines.append(
        "ratio: flagos/plain time per call (mlp: 1.0 is parity, above is slower); flagos/plain tokens/s (decode)"
    )
    return "\n".join(lines)


class Deadline:
    """Kills the sides when the run passes `seconds`, so a hang fails the run instead of holding it."""

    def __init__(self, seconds: float, sides: list[Side]) -> None:
        self.expired = False
        self.sides = sides
        self.timer = threading.Timer(seconds, self.expire)
        self.timer.daemon = True
        self.timer.start()

    def expire(self) -> None:
        self.expired = True
        for side in self.sides:
            kill(side)

    def cancel(self) -> None:
        self.timer.cancel()


def kill(side: Side) -> None:
    """Ends a side and what it started (its compile workers hold its output pipe open): the side
    leads its own process group (Side(session=True))."""
    try:
        os.killpg(side.proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def run_case(case: str, sides: dict[str, list[Side]], dims: Dims, runs: int, plan: RoundPlan) -> dict:
    """One case on every process of every side: build everywhere, then interleaved timed rounds
    (each process of each side times one round per turn)."""
    for side in (s for processes in sides.values() for s in processes):
        side.send("build", case=case, dims=dims.__dict__)
    built: dict[str, list[dict]] = {}
    for name, processes in sides.items():
        for side in processes:
            reply_ = side.receive()
            if reply_ is None or "error" in reply_:
                why = side.failed if reply_ is None else reply_["error"]
                return {"case": case, "error": f"{name} side: {why} (log: {side.log})"}
            built.setdefault(name, []).append(reply_)
    rounds = InterleavedRounds(plan, "plain")
    calls: dict[str, list[dict]] = {name: [] for name in sides}
    for _ in rounds:
        for name, processes in sides.items():
            for process, side in enumerate(processes):
                answer = side.ask("round", runs=runs)
                if answer is None or "error" in answer:
                    why = side.failed if answer is None else answer["error"]
                    return {"case": case, "error": f"{name} side: {why} (log: {side.log})"}
                rounds.add(name, answer["wall_s"], process)
                calls[name].append(answer.get("graph_call_us", {}))
                built[name][process]["recorded_after_rounds"] = answer["recorded"]
    by_process = {name: list(walls.values()) for name, walls in rounds.by_process.items()}
    return {**summarize(case, built, by_process, runs, calls), **rounds.summary()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cases", default=",".join(CASES), help="comma-separated subset of: " + ", ".join(CASES))
    add_round_options(parser, 5, "timed rounds per side (interleaved)")
    parser.add_argument("--mlp-runs", type=int, default=200, help="MLP calls per round")
    # Six: with two, a round's time was one or two slow generates and the 9-round interval of the
    # ratio spanned +-0.25 on the board; six gave +-0.04.
    parser.add_argument("--decode-runs", type=int, default=6, help="generate calls per round")
    parser.add_argument("--width", type=int, default=Dims.width, help="MLP width")
    parser.add_argument("--batch", type=int, default=Dims.batch, help="MLP batch")
    parser.add_argument("--hidden", type=int, default=Dims.hidden, help="Llama hidden size")
    parser.add_argument("--lm-layers", type=int, default=Dims.lm_layers, help="Llama layers")
    parser.add_argument("--new-tokens", type=int, default=Dims.new_tokens, help="tokens generated per call")
    add_processes_option(parser)
    parser.add_argument("--timeout", type=float, default=150.0, help="the whole run's limit in seconds")
    parser.add_argument("--json", help="also write the results to this file")
    parser.add_argument("--side", choices=("plain", "flagos"), help=argparse.SUPPRESS)  # a side's process
    args = parser.parse_args(argv)
    if args.side:
        serve_side(args.side, args.timeout)
        return 0
    cases = [c for c in args.cases.split(",") if c]
    unknown = sorted(set(cases) - set(CASES))
    if unknown:
        parser.error(f"unknown cases {unknown}; known: {', '.join(CASES)}")
    if not os.environ.get("FLAGOS_PLATFORM"):
        parser.error("set FLAGOS_PLATFORM to the CUDA-backed platform (e.g. nvidia_h200)")
    dims = Dims(width=args.width, batch=args.batch, hidden=args.hidden, lm_layers=args.lm_layers)
    dims = Dims(**{**dims.__dict__, "new_tokens": args.new_tokens})
    scratch = Path(tempfile.mkdtemp(prefix="cuda_graphs_"))
    table = scratch / "empty_routes.yaml"  # side_env's argument; the "tuned" sides keep routes.yaml
    started = time.perf_counter()
    cpus = shared_cpus()
    sides = {
        name: [
            Side(
                [sys.executable, __file__, "--side", name, "--timeout", str(args.timeout)],
                side_env(name, "tuned", table),
                scratch / f"{name}-{process}.log",
                wait=False,
                cpus=cpus,
                session=True,
            )
            for process in range(args.processes)
        ]
        for name in ("plain", "flagos")
    }
    every = [side for processes in sides.values() for side in processes]
    deadline = Deadline(args.timeout, every)
    results: list[dict] = []
    info: dict = {}
    try:
        for name, processes in sides.items():
            for side in processes:
                ready = side.wait()
                if ready is None:
                    results.append({"case": "start", "error": f"{name} side: {side.failed} (log: {side.log})"})
                else:
                    info = {**ready, **info}
        if not results:
            for case in cases:
                results.append(
                    run_case(
                        case,
                        sides,
                        dims,
                        args.mlp_runs if case == "mlp" else args.decode_runs,
                        RoundPlan.from_args(args),
                    )
                )
        for side in every:
            side.send("finish")
            side.close()
    finally:
        deadline.cancel()
        for side in every:
            kill(side)
    print(report(info, results))
    elapsed = round(time.perf_counter() - started, 1)
    status = 2 if deadline.expired else (0 if all(r.get("ok") for r in results) else 1)
    if deadline.expired:
        print(f"TIMED OUT after {args.timeout:.0f} s: the sides were killed; logs: {scratch}", file=sys.stderr)
    print(f"({elapsed} s; side logs in {scratch})")
    if args.json:
        Path(args.json).write_text(
            json.dumps(
                {"info": info, "dims": dims.__dict__, "results": results, "elapsed_s": elapsed, "status": status},
                indent=1,
            )
            + "\n"
        )
    return status


if __name__ == "__main__":
    sys.exit(main())
