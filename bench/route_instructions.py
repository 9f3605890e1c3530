"""Instructions the native route adds per op, counted by valgrind's callgrind on the host.

    python bench/route_instructions.py                       # add, mm, cast, foreach
    python bench/route_instructions.py --ops add --top 25 --json out.json

The ops of dispatch_overhead.py run on the plain backing and on flagos, each side in its own process
under callgrind with collection switched on only around each op's loop (after a warm-up). A count of
executed instructions does not depend on what else the machine runs: two runs of the same build give
the same numbers to a few instructions per call, so a change to the route shows even where timings
on a shared host cannot tell it. It is a count, not a time: cache misses and atomic operations cost
more than their share, and a board's route runs with colder caches than this loop. Per op: the
instructions per call on each side and the difference; then the difference per shared object and,
with --top N, the N functions that add the most.
Needs valgrind (callgrind_control and callgrind_annotate come with it) and a host backing.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
SIDES = ("plain", "flagos")
DEFAULT_OPS = "add,mm,cast,foreach"
CALLS, WARMUP = 1000, 100
# one line of callgrind_annotate: "1,234 ( 5.67%)  file:function [object]"
ANNOTATED = re.compile(r"\s*([\d,]+) \([ \d.]+%\)\s+[^:]*:(.*?)(?: \[(.*)\])?$")


def side(name: str, ops: list[str], size: int, calls: int) -> None:
    """Runs inside callgrind: each op's loop between a zeroing and a dump named after the op."""
    sys.path.insert(0, str(HERE))
    import torch_fl  # noqa: F401  (the flagos device)
    from dispatch_overhead import OPS, moved, operands

    tensors = moved(operands(size), "cpu" if name == "plain" else "flagos")
    pid = str(os.getpid())

    def control(*args: str) -> None:
        subprocess.run(["callgrind_control", *args, pid], check=True, stdout=subprocess.DEVNULL)

    for op in ops:
        fn = OPS[op]
        for _ in range(WARMUP):
            fn(tensors)
        control("--zero")
        control("--instr=on")
        for _ in range(calls):
            fn(tensors)
        control("--instr=off")
        control(f"--dump={op}")


def annotate(dump: Path) -> tuple[collections.Counter, collections.Counter]:
    """Instructions per (object, function) and per object in one callgrind dump."""
    out = subprocess.run(
        ["callgrind_annotate", "--threshold=100", str(dump)], capture_output=True, text=True, check=True
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


def dumps_by_op(prefix: Path) -> dict[str, Path]:
    """The dump files callgrind wrote for `prefix`, by the op named in each (its `desc:` line)."""
    found = {}
    for path in prefix.parent.glob(prefix.name + ".*"):
        for line in path.read_text(errors="replace").splitlines()[:20]:
            if line.startswith("desc: Trigger: Client Request: ") or line.startswith("desc: Trigger: "):
                found[line.rsplit(" ", 1)[-1]] = path
                break
    return found


def measure(ops: list[str], size: int, calls: int, workdir: Path) -> dict[str, dict[str, Path]]:
    """Both sides under callgrind at once; their dump files by side and op."""
    procs = {}
    for name in SIDES:
        prefix = workdir / f"{name}.out"
        cmd = [
            "valgrind", "--tool=callgrind", "--instr-atstart=no", f"--callgrind-out-file={prefix}",
            sys.executable, __file__, "--side", name, "--ops", ",".join(ops), "--size", str(size),
            "--calls", str(calls),
        ]  # fmt: skip
        log = open(workdir / f"{name}.log", "w")  # noqa: SIM115 (closed below, after the wait)
        # One intra-op thread: idle OpenMP workers spin, and their spinning would be counted.
        env = {**os.environ, "OMP_NUM_THREADS": "1"}
        procs[name] = (subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env), log)
    dumps = {}
    for name, (proc, log) in procs.items():
        rc = proc.wait()
        log.close()
        if rc != 0:
            tail = (workdir / f"{name}.log").read_text(errors="replace")[-2000:]
            raise SystemExit(f"route_instructions: the {name} side failed (exit {rc}):\n{tail}")
        dumps[name] = dumps_by_op(workdir / f"{name}.out")
    return dumps


def compare(dumps: dict[str, dict[str, Path]], ops: list[str], calls: int, top: int) -> dict:
    result = {}
    for op in ops:
        counted = {name: annotate(dumps[name][op]) for name in SIDES}
        (plain_fn, plain_obj), (flagos_fn, flagos_obj) = counted["plain"], counted["flagos"]
        per_call = {name: sum(counted[name][1].values()) / calls for name in SIDES}
        objects = {o: (flagos_obj[o] - plain_obj[o]) / calls for o in set(plain_obj) | set(flagos_obj)}
        functions = {k: (flagos_fn[k] - plain_fn[k]) / calls for k in set(plain_fn) | set(flagos_fn)}
        result[op] = {
            "plain": per_call["plain"],
            "flagos": per_call["flagos"],
            "delta": per_call["flagos"] - per_call["plain"],
            "delta_by_object": dict(sorted(((o, d) for o, d in objects.items() if abs(d) >= 1), key=lambda x: -x[1])),
            "top_functions": [
                {"object": o, "function": f, "delta": d}
                for (o, f), d in sorted(functions.items(), key=lambda x: -x[1])[:top]
            ],
        }
    return result


def report(result: dict, calls: int) -> str:
    lines = [
        f"instructions per call, {calls} calls per op under callgrind (flagos: the native route on host_ref)",
        f"{'op':10s}{'plain':>10s}{'flagos':>10s}{'delta':>10s}",
    ]
    for op, r in result.items():
        lines.append(f"{op:10s}{r['plain']:>10.0f}{r['flagos']:>10.0f}{r['delta']:>+10.0f}")
    for op, r in result.items():
        objects = ", ".join(f"{o} {d:+.0f}" for o, d in r["delta_by_object"].items())
        lines.append(f"\n{op}: delta by object: {objects}")
        for f in r["top_functions"]:
            lines.append(f"  {f['delta']:+8.0f}  {f['object'][:20]:20s} {f['function'][:150]}")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ops", default=DEFAULT_OPS, help=f"comma-separated ops of dispatch_overhead.py ({DEFAULT_OPS})")
    parser.add_argument("--size", type=int, default=64, help="square operand size")
    parser.add_argument("--calls", type=int, default=CALLS, help="calls counted per op")
    parser.add_argument("--top", type=int, default=0, help="also list the N functions that add the most per op")
    parser.add_argument("--json", help="also write the numbers to this file")
    parser.add_argument("--side", choices=SIDES, help=argparse.SUPPRESS)  # one side, run under callgrind
    args = parser.parse_args()
    ops = [o for o in args.ops.split(",") if o]
    if args.side:
        side(args.side, ops, args.size, args.calls)
        return
    sys.path.insert(0, str(HERE))
    from dispatch_overhead import OPS

    unknown = sorted(set(ops) - set(OPS))
    if unknown:
        raise SystemExit(f"route_instructions: unknown op(s) {', '.join(unknown)}; known: {', '.join(OPS)}")
    missing = [tool for tool in ("valgrind", "callgrind_control", "callgrind_annotate") if not shutil.which(tool)]
    if missing:
        raise SystemExit(f"route_instructions: needs valgrind; not found on PATH: {', '.join(missing)}")
    with tempfile.TemporaryDirectory(prefix="route_instructions_") as tmp:
        dumps = measure(ops, args.size, args.calls, Path(tmp))
        result = compare(dumps, ops, args.calls, args.top)
    print(report(result, args.calls))
    if args.json:
        Path(args.json).write_text(json.dumps({"calls": args.calls, "size": args.size, "ops": result}, indent=1) + "\n")


if __name__ == "__main__":
    main()
