"""Host cost of one op on flagos against the plain backing device, measured side by side.

    python bench/dispatch_overhead.py                  # host_ref (or FLAGOS_PLATFORM=...)
    python bench/dispatch_overhead.py --json out.json
    python bench/dispatch_overhead.py --evict-mib 16   # caches cold before each call

Three ways to run an op, each timed in the same process with warm-up and the best of several
median-of-repeats rounds (rounds interleave the ways, so machine noise hits them alike):
  plain    the backing device's own tensors (cpu or cuda), no flagos involved
  native   flagos tensors served by the C++ native route (the backing kernel on zero-copy aliases)
  python   flagos tensors whose aten::add.Tensor kernel is a Python function (torch.library) that
           runs torch.add on torch_fl.as_backing aliases and wraps the result with torch_fl.as_flagos:
           what an op routed to a Python kernel (FlagGems, vendor) costs before the kernel itself.
On a CUDA backing each timed loop ends with a synchronisation, so queued GPU work is counted.
Ops: add, mm and two views on square float32 operands (--size); `add 2+4d`, two adds whose operands
alternate between 2-D and 4-D shapes, as a model's consecutive ops do; a cast to bfloat16 (what
autocast adds before each matmul); one decode step's attention (scaled_dot_product_attention, batch 1, 16
heads, 1 query, 256 keys, head_dim 64) and a prefill's (bf16, causal, 128 queries and keys: the
fused kernel a CUDA backing picks for a model's prompt); a foreach add over 8 tensors that reads
one list twice, and `foreach_`, one in place over two lists of 8 (an optimizer's update: no tensor
repeats).
The delta of an op is native minus plain within each round (the two ran back to back), its median
over the rounds with a 95% bootstrap interval. Targets (TARGET_US): on CUDA at most +0.3 us per
add, mm or cast and +0.1 us per foreach tensor; on the host at most +0.5 us per add; a view at most
+0.2 us and either attention +2 us on either. A target is met when the whole interval is under
it, missed when the whole interval is over it, and undecided otherwise.

--evict-mib N times each call alone, after an untimed pass over N MiB of host memory: the caches
are cold, as they are after a kernel launch on a board (the driver's code and data evict the
route's), where the route costs more than on a warm host. The times are then host times only (no
GPU work), and the default calls per loop drop to 200.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import statistics
import sys
import time
import warnings
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F

import torch_fl
from torch_fl.runtime.device.core import backing as current_backing

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))  # the helpers beside this script, however it is started
from side_processes import median_interval  # noqa: E402

FOREACH_TENSORS = 8
# The native route's delta over the plain backing that an op should stay within, in us, per backing.
TARGET_US = {
    "cuda": {
        "add": 0.3,
        "mm": 0.3,
        "cast": 0.3,
        "foreach": 0.1 * FOREACH_TENSORS,
        "foreach_": 0.1 * FOREACH_TENSORS,
    },
    "cpu": {"add": 0.5},
}
TARGET_US_ANY_BACKING = {"x[0]": 0.2, "x.t()": 0.2, "sdpa q1": 2.0, "sdpa causal": 2.0}


def per_op_us(
    fn: Callable[[], object], calls: int, repeats: int, sync: Callable[[], None], evict: Callable[[], object] | None
) -> float:
    """Median over `repeats` loops of `calls` calls, in microseconds per call; with `evict`, each
    call is timed alone after an untimed `evict()`."""
    samples = []
    for _ in range(repeats):
        sync()
        if evict is None:
            start = time.perf_counter()
            for _ in range(calls):
                fn()
            sync()
            samples.append((time.perf_counter() - start) / calls * 1e6)
            continue
        spent = 0.0
        for _ in range(calls):
            evict()
            start = time.perf_counter()
            fn()
            spent += time.perf_counter() - start
        sync()
        samples.append(spent / calls * 1e6)
    return statistics.median(samples)


def cache_evictor(mib: int) -> Callable[[], object] | None:
    """A pass over `mib` MiB of host memory, or None for warm caches. It writes through libc's
    memset rather than a torch op, whose dispatch and kernel would warm the plain side's code."""
    if mib <= 0:
        return None
    size = mib << 20
    junk = ctypes.create_string_buffer(size)
    return lambda: ctypes.memset(junk, 1, size)


class PythonRoutedAdd:
    """A Python kernel for aten::add.Tensor on flagos for the duration of a `with` block."""

    def __enter__(self) -> PythonRoutedAdd:
        self.calls = 0
        self.library = torch.library.Library("aten", "IMPL")
        as_backing, as_flagos = torch_fl.as_backing, torch_fl.as_flagos

        def add(a: torch.Tensor, b: torch.Tensor, *, alpha: float = 1) -> torch.Tensor:
            self.calls += 1
            return as_flagos(torch.add(as_backing(a), as_backing(b), alpha=alpha))

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # replacing the kernel flagos has for add is the point
            self.library.impl("add.Tensor", add, "PrivateUse1")
        return self

    def __exit__(self, *exc: object) -> None:
        self.library._destroy()


def _host(result: object) -> object:
    return [t.cpu() for t in result] if isinstance(result, (list, tuple)) else result.cpu()  # type: ignore[attr-defined]


def operands(size: int) -> dict:
    """The ops' operands on the host (seeded): square `size` float32 matrices, a decode step's
    and a prefill's attention inputs and two foreach lists."""
    torch.manual_seed(0)
    return {
        "a": torch.randn(size, size),
        "b": torch.randn(size, size),
        # one decode step's attention: batch 1, 16 heads, 1 query against 256 cached keys, head_dim 64
        "q": torch.randn(1, 16, 1, 64),
        "k": torch.randn(1, 16, 256, 64),
        "v": torch.randn(1, 16, 256, 64),
        # a prompt's attention, in the dtype a fused kernel needs: 128 queries over their own keys
        "qkv": [torch.randn(1, 16, 128, 64, dtype=torch.bfloat16) for _ in range(3)],
        # an optimizer's foreach update over a few parameters and their gradients
        "params": [torch.randn(size, size) for _ in range(FOREACH_TENSORS)],
        "grads": [torch.randn(size, size) for _ in range(FOREACH_TENSORS)],
    }


# The ops measured, each on a dict of operands (see operands()) on one device.
OPS: dict[str, Callable[[dict], object]] = {
    "add": lambda t: torch.add(t["a"], t["b"]),
    # two adds of different geometries (2-D, then 4-D), as a model's consecutive ops have: the
    # route's pooled aliases take a new geometry on each call, which a loop over one op never shows
    "add 2+4d": lambda t: (torch.add(t["a"], t["b"]), torch.add(t["k"], t["v"])),
    "mm": lambda t: torch.mm(t["a"], t["b"]),
    "x[0]": lambda t: t["a"][0],
    "x.t()": lambda t: t["a"].t(),
    "cast": lambda t: t["a"].to(torch.bfloat16),  # what autocast adds before each matmul
    "sdpa q1": lambda t: F.scaled_dot_product_attention(t["q"], t["k"], t["v"]),
    "sdpa causal": lambda t: F.scaled_dot_product_attention(*t["qkv"], is_causal=True),
    "foreach": lambda t: torch._foreach_add(t["params"], t["params"], alpha=1e-3),
    "foreach_": lambda t: torch._foreach_add_(t["params"], t["grads"], alpha=1e-3),
}


def moved(operands: dict, device: str) -> dict:
    """`operands` (tensors and lists of tensors) copied to `device`."""
    return {k: [t.to(device) for t in v] if isinstance(v, list) else v.to(device) for k, v in operands.items()}


def run(calls: int, repeats: int, rounds: int, size: int, evict_mib: int = 0) -> dict:
    backing = current_backing()
    plain_sync = torch.cuda.synchronize if backing == "cuda" else (lambda: None)
    flagos_sync = torch.flagos.synchronize if backing == "cuda" else (lambda: None)
    host = operands(size)
    plain, flagos = moved(host, backing), moved(host, "flagos")
    # correctness first: the three ways agree
    for name, op in OPS.items():
        torch.testing.assert_close(_host(op(flagos)), _host(op(plain)), msg=name)
    with PythonRoutedAdd() as routed:
        torch.testing.assert_close(OPS["add"](flagos).cpu(), OPS["add"](plain).cpu())
        assert routed.calls == 1, "the Python kernel did not serve flagos add"

    evict = cache_evictor(evict_mib)
    # per op and way, one time per round (each the median of `repeats` loops)
    times: dict[str, dict[str, list[float]]] = {name: {"plain": [], "native": []} for name in OPS}
    times["add"]["python"] = []
    for _ in range(rounds):
        for name, op in OPS.items():
            candidates = {
                "plain": (lambda op=op: op(plain), plain_sync),
                "native": (lambda op=op: op(flagos), flagos_sync),
            }
            for way, (fn, sync) in candidates.items():
                for _ in range(max(1, calls // 10)):  # warm-up
                    fn()
                times[name][way].append(per_op_us(fn, calls, repeats, sync, evict))
        with PythonRoutedAdd():
            fn = lambda: OPS["add"](flagos)  # noqa: E731
            for _ in range(max(1, calls // 10)):
                fn()
            times["add"]["python"].append(per_op_us(fn, calls, repeats, flagos_sync, evict))
    return {
        "backing": backing,
        "platform": torch_fl.active_platform().name,
        "torch": torch.__version__,
        "size": size,
        "calls": calls,
        "repeats": repeats,
        "rounds": rounds,
        "evict_mib": evict_mib,
        "us_per_op": {name: {way: min(ts) for way, ts in ways.items()} for name, ways in times.items()},
        "us_per_op_rounds": times,
        "delta_us": {name: delta(ways["plain"], ways["native"]) for name, ways in times.items()},
        "python_delta_us": delta(times["add"]["plain"], times["add"]["python"]),
    }


def delta(plain: list[float], mine: list[float]) -> dict:
    """`mine` minus `plain` per round: the median, and its bootstrap interval (None under 3 rounds)."""
    per_round = [m - p for p, m in zip(plain, mine)]
    return {"median": statistics.median(per_round), "interval": median_interval(per_round)}


def target_us(backing: str, op: str) -> float | None:
    return TARGET_US.get(backing, {}).get(op, TARGET_US_ANY_BACKING.get(op))


def verdict(d: dict, target: float) -> str:
    """Met when the whole interval is within the target, missed when it is all beyond it."""
    low, high = d["interval"] or (d["median"], d["median"])
    return "met" if high <= target else "MISSED" if low > target else "undecided"


def report(result: dict) -> str:
    lines = [
        f"flagos dispatch overhead: platform {result['platform']}, backing {result['backing']}, "
        f"torch {result['torch']}, "
        f"{result['size']}x{result['size']} float32 operands"
        + (
            f", caches cold ({result['evict_mib']} MiB evicted before each call; host time only)"
            if result["evict_mib"]
            else ""
        ),
        f"({result['rounds']} rounds, each the median of {result['repeats']} loops of {result['calls']} calls per "
        "way; us columns: the best round; delta: native minus plain per round, median [95% interval])",
        "",
        f"{'op':10s}{'plain us':>10s}{'native us':>11s}  {'delta us':28s}{'python us':>10s}{'delta us':>10s}  target",
    ]
    for name, ways in result["us_per_op"].items():
        d = result["delta_us"][name]
        interval = f" [{d['interval'][0]:.2f}, {d['interval'][1]:.2f}]" if d["interval"] else ""
        target = target_us(result["backing"], name)
        judged = f"<= {target:g} us: {verdict(d, target)}" if target is not None else ""
        python = ways.get("python")
        py_cols = (
            f"{python:>10.2f}{result['python_delta_us']['median']:>10.2f}"
            if python is not None
            else f"{'-':>10s}{'-':>10s}"
        )
        delta_cell = f"{d['median']:+.2f}{interval}"
        lines.append(f"{name:10s}{ways['plain']:>10.2f}{ways['native']:>11.2f}  {delta_cell:28s}{py_cols}  {judged}")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", type=int, help="calls per timed loop (default 2000; 200 with --evict-mib)")
    parser.add_argument("--repeats", type=int, default=5, help="timed loops per round (their median counts)")
    parser.add_argument("--rounds", type=int, default=9, help="rounds (their deltas' median counts)")
    parser.add_argument("--size", type=int, default=64, help="square operand size")
    parser.add_argument(
        "--evict-mib", type=int, default=0, help="time each call alone after a pass over this much host memory"
    )
    parser.add_argument("--quick", action="store_true", help="a few calls only: checks that the bench runs")
    parser.add_argument("--json", help="also write the numbers to this file")
    args = parser.parse_args()
    if args.calls is None:
        args.calls = 200 if args.evict_mib else 2000
    if args.quick:
        args.calls, args.repeats, args.rounds = 50, 2, 1
    result = run(args.calls, args.repeats, args.rounds, args.size, args.evict_mib)
    print(report(result))
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
