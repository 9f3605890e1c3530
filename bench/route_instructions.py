"""Instructions the native route adds per op, counted by valgrind's callgrind on the host.

    python bench/route_instructions.py                       # add, add 2+4d, mm, cast, foreach, llama decode
    python bench/route_instructions.py --ops add,decode:gpt2,train:bert --top 25 --json out.json

The ops of dispatch_overhead.py, `decode:ARCH` (one greedy `generate` of a zoo architecture at host
size, 8 prompt and 8 new tokens) and `train:ARCH` (one AdamW training step of it at host size, in
float32: the CPU's autocast lists are not the ones flagos follows, CUDA's; its backward runs on the
autograd engine's device thread on flagos and inline on the CPU, so its difference holds that
hand-over too, which plain CUDA pays as flagos does) run on the plain CPU and on flagos (host_ref),
each side in its own process under callgrind with collection switched on only around each op's loop (after a
warm-up, with Python's collector off). A count of executed instructions does not depend on what
else the machine runs, so a change to the route shows even where timings on a shared host cannot
tell it (a model's rounds there vary by several percent). It is a count, not a time: cache misses,
stalls and atomic operations cost more than their share, and a board's route runs with colder
caches than this loop.
Per op: the instructions per call on each side, their difference and the part of it in flagos's
compiled core (which repeats exactly between runs of one build; the C library's share moves with
the heap's state), the native-route calls one call of the op makes on flagos and the difference
per routed call; then the difference per shared object and, with --top N, the N functions that add
the most.
With --cache-sim, callgrind also simulates the caches (a 32 KiB L1 instruction and a 48 KiB L1
data cache, and 2 MiB of last level, a core's share of a server's) and each side's misses per call
are printed too: in a model the route's code and data are evicted between its calls, and the L1
instruction misses it adds are what a count of instructions does not show.
Needs valgrind (callgrind_control and callgrind_annotate come with it).
"""

from __future__ import annotations

import argparse
import collections
import gc
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

import torch_fl
from torch_fl.runtime.build import MODULE_NAME

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))  # the helpers beside this script, however it is started
from dispatch_overhead import OPS, moved, operands  # noqa: E402

SIDES = ("plain", "flagos")
DEFAULT_OPS = "add,add 2+4d,mm,cast,foreach,decode:llama"
CALLS, WARMUP = 1000, 100
# flagos's own compiled core: the part of the difference that repeats exactly from run to run (the C
# library's share moves with the heap's state, Python's with its caches).
CORE_OBJECT = f"{MODULE_NAME}.so"
DECODE, TRAIN = "decode:", "train:"  # ops naming one `generate` or one training step of a zoo architecture
MODEL_CALL_COST = 250  # a model's run counts as this many calls of --calls (1000: 4 runs)
# the simulated caches of --cache-sim: size, associativity, line size
CACHES = ["--I1=32768,8,64", "--D1=49152,12,64", "--LL=2097152,16,64"]
# the events of a callgrind dump's totals line with --cache-sim, and the ones reported
CACHE_EVENTS = ("Ir", "Dr", "Dw", "I1mr", "D1mr", "D1mw", "ILmr", "DLmr", "DLmw")
MISSES = {"I1 misses": ("I1mr",), "D1 misses": ("D1mr", "D1mw"), "LL misses": ("ILmr", "DLmr", "DLmw")}
# one line of callgrind_annotate: "1,234 ( 5.67%)  file:function [object]"
ANNOTATED = re.compile(r"\s*([\d,]+) \([ \d.]+%\)\s+[^:]*:(.*?)(?: \[(.*)\])?$")


def side(name: str, ops: list[str], size: int, calls: int, workdir: Path) -> None:
    """Runs inside callgrind: each op's loop between a zeroing and a dump, in the order of `ops`.
    The flagos side also writes the native-route calls of one call of each op."""
    device = "cpu" if name == "plain" else "flagos"
    tensors = moved(operands(size), device)
    pid = str(os.getpid())

    def control(*args: str) -> None:
        subprocess.run(["callgrind_control", *args, pid], check=True, stdout=subprocess.DEVNULL)

    routed = {}
    for op in ops:
        fn = model_run(op, device) if is_model(op) else (lambda op=op: OPS[op](tensors))
        for _ in range(2 if is_model(op) else WARMUP):
            fn()
        if name == "flagos":
            torch_fl.routing.reset_stats()
            fn()
            routed[op] = sum(r.calls for r in torch_fl.routing.stats() if r.path == "native")
        # Python's collector runs when allocations cross its thresholds, at moments that differ
        # between the sides: it stays off while counting, after a collection.
        gc.collect()
        gc.disable()
        control("--zero")
        control("--instr=on")
        for _ in range(counted_calls(op, calls)):
            fn()
        control("--instr=off")
        gc.enable()
        control("--dump")
    if name == "flagos":
        (workdir / "routed.json").write_text(json.dumps(routed))


def is_model(op: str) -> bool:
    return op.startswith((DECODE, TRAIN))


def counted_calls(op: str, calls: int) -> int:
    return max(1, calls // MODEL_CALL_COST) if is_model(op) else calls


def model_run(op: str, device: str) -> Callable[[], object]:
    """One run of the zoo model that `op` (decode:ARCH or train:ARCH) names."""
    return (
        decoder(op.removeprefix(DECODE), device) if op.startswith(DECODE) else trainer(op.removeprefix(TRAIN), device)
    )


def decoder(arch: str, device: str) -> Callable[[], object]:
    """One greedy `generate` of the zoo's `arch` at host size (8 prompt and 8 new tokens)."""
    import torch

    from torch_fl.workloads import zoo

    cpu = zoo.build(arch, "host")
    model = cpu.to(device).eval()
    ids = zoo.prompt(cpu, 1, 8).to(device)

    def run() -> object:
        with torch.inference_mode():
            return zoo.generate(model, ids, 8)

    return run


def trainer(arch: str, device: str) -> Callable[[], object]:
    """One AdamW training step of the zoo's `arch` at host size, in float32."""
    from torch_fl.workloads import zoo

    cpu = zoo.build(arch, "host")
    inputs = zoo.batch(arch, cpu, zoo.ARCHS[arch].shapes["host"])
    model = cpu.to(device).train()
    return zoo.train_step(arch, model, moved(inputs, device), device, bf16=False)


def annotate(dump: Path) -> tuple[collections.Counter, collections.Counter]:
    """Instructions per (object, function) and per object in one callgrind dump."""
    out = subprocess.run(
        ["callgrind_annotate", "--threshold=100", "--show=Ir", str(dump)], capture_output=True, text=True, check=True
    ).stdout
    functions: collections.Counter = collections.Counter()
    objects: collections.Counter = collections.Counter()
    for line in out.splitlines():
        m = ANNOTATED.match(line)
        if not m:
            continue
        count = int(m.group(1).replace(",", ""))
        obj = (m.group(3) or "?").rsplit("/", 1)[-1]
        functions[(obj, m.group(2))] += count
        objects[obj] += count
    return functions, objects


def cache_misses(dump: Path) -> dict[str, int]:
    """The simulated cache misses of one dump (written with --cache-sim), summed per MISSES kind."""
    for line in dump.read_text(errors="replace").splitlines():
        if line.startswith("totals:"):
            totals = dict(zip(CACHE_EVENTS, (int(v) for v in line.split()[1:]), strict=False))
            return {kind: sum(totals.get(e, 0) for e in events) for kind, events in MISSES.items()}
    raise SystemExit(f"route_instructions: no totals line in {dump}")


def dumps_in_order(prefix: Path) -> list[Path]:
    """The dump files callgrind wrote for `prefix` (`prefix.1`, `prefix.2`, ...), in order."""
    return sorted(prefix.parent.glob(prefix.name + ".*"), key=lambda p: int(p.suffix[1:]))


def measure(
    ops: list[str], size: int, calls: int, workdir: Path, cache_sim: bool = False
) -> tuple[dict[str, dict[str, Path]], dict[str, int]]:
    """Both sides under callgrind at once (simulating the caches where `cache_sim`): their dump
    files by side and op, and the native-route calls of one call of each op on flagos."""
    procs = {}
    caches = ["--cache-sim=yes", *CACHES] if cache_sim else []
    for name in SIDES:
        prefix = workdir / f"{name}.out"
        cmd = [
            "valgrind", "--tool=callgrind", *caches, "--instr-atstart=no", f"--callgrind-out-file={prefix}",
            sys.executable, __file__, "--side", name, "--ops", ",".join(ops), "--size", str(size),
            "--calls", str(calls), "--workdir", str(workdir),
        ]  # fmt: skip
        log = open(workdir / f"{name}.log", "w")  # noqa: SIM115 (closed below, after the wait)
        # One intra-op thread: idle OpenMP workers spin, and their spinning would be counted. The
        # host-emulated platform, whatever the machine: the plain side is the CPU.
        env = {**os.environ, "OMP_NUM_THREADS": "1", "FLAGOS_PLATFORM": "host_ref"}
        procs[name] = (subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env), log)
    dumps = {}
    for name, (proc, log) in procs.items():
        rc = proc.wait()
        log.close()
        if rc != 0:
            tail = (workdir / f"{name}.log").read_text(errors="replace")[-2000:]
            raise SystemExit(f"route_instructions: the {name} side failed (exit {rc}):\n{tail}")
        found = dumps_in_order(workdir / f"{name}.out")
        if len(found) != len(ops):
            raise SystemExit(f"route_instructions: the {name} side left {len(found)} dumps for {len(ops)} ops")
        dumps[name] = dict(zip(ops, found))
    return dumps, json.loads((workdir / "routed.json").read_text())


def compare(
    dumps: dict[str, dict[str, Path]], routed: dict[str, int], calls: int, top: int, cache_sim: bool = False
) -> dict:
    result = {}
    for op, by_side in dumps["flagos"].items():
        n = counted_calls(op, calls)
        (plain_fn, plain_obj), (flagos_fn, flagos_obj) = annotate(dumps["plain"][op]), annotate(by_side)
        plain, flagos = sum(plain_obj.values()) / n, sum(flagos_obj.values()) / n
        objects = {o: (flagos_obj[o] - plain_obj[o]) / n for o in set(plain_obj) | set(flagos_obj)}
        functions = {k: (flagos_fn[k] - plain_fn[k]) / n for k in set(plain_fn) | set(flagos_fn)}
        result[op] = {
            "calls": n,
            "plain": plain,
            "flagos": flagos,
            "delta": flagos - plain,
            "core": objects.get(CORE_OBJECT, 0.0),
            "routed": routed[op],
            "delta_per_routed": (flagos - plain) / routed[op] if routed[op] else None,
            "delta_by_object": dict(sorted(((o, d) for o, d in objects.items() if abs(d) >= 1), key=lambda x: -x[1])),
            "top_functions": [
                {"object": o, "function": f, "delta": d}
                for (o, f), d in sorted(functions.items(), key=lambda x: -x[1])[:top]
            ],
        }
        if cache_sim:
            plain_misses, flagos_misses = cache_misses(dumps["plain"][op]), cache_misses(by_side)
            result[op]["misses"] = {
                kind: {"plain": plain_misses[kind] / n, "flagos": flagos_misses[kind] / n} for kind in MISSES
            }
    return result


def report(result: dict) -> str:
    lines = [
        "instructions per call under callgrind: plain CPU against flagos (host_ref); core: the part of the",
        f"difference in {CORE_OBJECT}; routed: native-route calls per call of the op; per routed: the",
        "difference over them",
        f"{'op':16s}{'calls':>6s}{'plain':>12s}{'flagos':>12s}{'delta':>10s}{'core':>10s}{'routed':>8s}"
        f"{'per routed':>12s}",
    ]
    for op, r in result.items():
        per = f"{r['delta_per_routed']:+.0f}" if r["delta_per_routed"] is not None else "-"
        lines.append(
            f"{op:16s}{r['calls']:>6d}{r['plain']:>12.0f}{r['flagos']:>12.0f}{r['delta']:>+10.0f}{r['core']:>+10.0f}"
            f"{r['routed']:>8d}{per:>12s}"
        )
    if any("misses" in r for r in result.values()):
        lines.append(
            "\nsimulated cache misses per call (--cache-sim): plain, flagos, the difference and per routed call"
        )
        for op, r in result.items():
            for kind, m in r["misses"].items():
                per = f"{(m['flagos'] - m['plain']) / r['routed']:+.1f}" if r["routed"] else "-"
                lines.append(
                    f"{op:16s}{kind:>11s}{m['plain']:>12.0f}{m['flagos']:>12.0f}{m['flagos'] - m['plain']:>+10.0f}{per:>10s}"
                )
    for op, r in result.items():
        objects = ", ".join(f"{o} {d:+.0f}" for o, d in r["delta_by_object"].items())
        lines.append(f"\n{op}: delta by object: {objects}")
        for f in r["top_functions"]:
            lines.append(f"  {f['delta']:+10.0f}  {f['object'][:20]:20s} {f['function'][:150]}")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--ops",
        default=DEFAULT_OPS,
        help=f"comma-separated ops of dispatch_overhead.py, decode:ARCH and train:ARCH (default {DEFAULT_OPS})",
    )
    parser.add_argument("--size", type=int, default=64, help="square operand size")
    parser.add_argument(
        "--calls", type=int, default=CALLS, help=f"calls counted per op (a model's run counts as {MODEL_CALL_COST})"
    )
    parser.add_argument("--top", type=int, default=0, help="also list the N functions that add the most per op")
    parser.add_argument("--cache-sim", action="store_true", help="also simulate the caches and report misses per call")
    parser.add_argument("--json", help="also write the numbers to this file")
    parser.add_argument("--side", choices=SIDES, help=argparse.SUPPRESS)  # one side, run under callgrind
    parser.add_argument("--workdir", type=Path, help=argparse.SUPPRESS)  # where that side leaves its routed calls
    args = parser.parse_args()
    ops = [o for o in args.ops.split(",") if o]
    if args.side:
        side(args.side, ops, args.size, args.calls, args.workdir)
        return
    from torch_fl.workloads import zoo

    models = [DECODE + name for name, arch in zoo.ARCHS.items() if arch.generates]
    models += [TRAIN + name for name in zoo.ARCHS]
    unknown = sorted(o for o in ops if o not in OPS and o not in models)
    if unknown:
        raise SystemExit(
            f"route_instructions: unknown op(s) {', '.join(unknown)}; known: {', '.join(OPS)} and {', '.join(models)}"
        )
    missing = [tool for tool in ("valgrind", "callgrind_control", "callgrind_annotate") if not shutil.which(tool)]
    if missing:
        raise SystemExit(f"route_instructions: needs valgrind; not found on PATH: {', '.join(missing)}")
    with tempfile.TemporaryDirectory(prefix="route_instructions_") as tmp:
        dumps, routed = measure(ops, args.size, args.calls, Path(tmp), args.cache_sim)
        result = compare(dumps, routed, args.calls, args.top, args.cache_sim)
    print(report(result))
    if args.json:
        Path(args.json).write_text(json.dumps({"calls": args.calls, "size": args.size, "ops": result}, indent=1) + "\n")


if __name__ == "__main__":
    main()
