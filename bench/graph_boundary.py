"""What flagos's CUDA-graph boundary costs per call, apart from the graph.

    python bench/graph_boundary.py                                   # host_ref (or FLAGOS_PLATFORM)
    FLAGOS_PLATFORM=nvidia_h200 python bench/graph_boundary.py --inputs 56 --calls 20000

A compiled graph under `mode="reduce-overhead"` on flagos is wrapped by
`torch_fl.runtime.inductor.over_backing`: each call hands the tree manager the static flagos
inputs as they are and CUDA aliases of the others, and takes flagos aliases of its outputs back.
This times that boundary around a stand-in for the tree manager that records once and then returns
its static outputs (as a replay does), with `--inputs` static inputs (a decode step's parameters
and static cache) and a few non-static ones, and the input conversion (`GraphInputs.to_backing`)
alone. Microseconds per call, the best
of `--rounds` loops of `--calls` calls. Warm loops: in a model the boundary's data comes from
farther away between calls, so the board's cost per call is a multiple of these numbers;
`--evict-mib N` times each call alone after a pass over N MiB of host memory instead (the median
of `--rounds` loops), as a model's Python and driver work leave the caches between two graph calls.
Beside them, the tree manager's own check of the static inputs' addresses
(`torch._C._tensors_data_ptrs_at_indices_equal`, which every replay makes), on the flagos tensors
it gets and on backing tensors as plain CUDA gives it (CUDA builds of torch have it).
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

import torch_fl  # noqa: F401 - activates flagos
from torch_fl.runtime.device.core import core
from torch_fl.runtime.inductor import over_backing

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))  # the helpers beside this script, however it is started
from dispatch_overhead import cache_evictor, per_op_us  # noqa: E402

NON_STATIC = 4  # the step's own inputs: token ids, positions, cache position, mask


def stand_in(model: Callable[[list[Any]], Any], static_input_idxs: Any = (), **_: Any) -> Callable[[list[Any]], Any]:
    """A tree manager that records on the first call and replays its static outputs after."""
    outputs: list[Any] = []

    def run(inputs: list[Any]) -> Any:
        if not outputs:
            outputs.append(model(list(inputs)))
        inputs.clear()
        return outputs[0]

    return run


def best_us(fn: Callable[[], object], calls: int, rounds: int) -> float:
    for _ in range(min(calls, 1000)):
        fn()
    best = float("inf")
    for _ in range(rounds):
        started = time.perf_counter()
        for _ in range(calls):
            fn()
        best = min(best, (time.perf_counter() - started) / calls * 1e6)
    return best


def timer(calls: int, rounds: int, evict_mib: int) -> Callable[[Callable[[], object]], float]:
    """us per call: the best warm loop, or with `evict_mib` the median loop of calls timed alone
    after an eviction."""
    evict = cache_evictor(evict_mib)
    if evict is None:
        return lambda fn: best_us(fn, calls, rounds)

    def evicted_us(fn: Callable[[], object]) -> float:
        fn()  # the first call makes what later calls keep (aliases, Python objects)
        return per_op_us(fn, calls, rounds, lambda: None, evict)

    return evicted_us


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--inputs", type=int, default=52, help="static inputs (parameters, cache)")
    parser.add_argument("--calls", type=int, help="calls per loop (default 20000; 500 with --evict-mib)")
    parser.add_argument("--rounds", type=int, default=5, help="loops; the best is reported (the median if evicting)")
    parser.add_argument("--evict-mib", type=int, default=0, help="pass over this many MiB before each call")
    args = parser.parse_args()
    calls = args.calls or (500 if args.evict_mib else 20000)
    timed = timer(calls, args.rounds, args.evict_mib)
    static = [torch.randn(64, 64, device="flagos") for _ in range(args.inputs)]
    steps = [torch.zeros(1, 1, dtype=torch.long, device="flagos") for _ in range(NON_STATIC)]
    inputs = static + steps
    graph_inputs = core().GraphInputs(list(range(args.inputs, len(inputs))))  # the non-static ones
    to_backing = graph_inputs.to_backing  # looked up once, as over_backing does
    convert = timed(lambda: to_backing(inputs))
    boundary = over_backing(stand_in, lambda a: (a[0] @ a[1],), list(range(args.inputs)))
    whole = timed(lambda: boundary(list(inputs)))
    same_pointers = getattr(torch._C, "_tensors_data_ptrs_at_indices_equal", None)  # CUDA builds only
    if same_pointers is not None:
        backing = [torch_fl.as_backing(t) for t in inputs]
        indices = list(range(args.inputs))
        pointers = [inputs[i].data_ptr() for i in indices]
        check = {
            side: timed(lambda given=given: same_pointers(given, pointers, indices))
            for side, given in (("flagos", inputs), ("plain", backing))
        }
    warmth = f"each call after a {args.evict_mib} MiB eviction, median" if args.evict_mib else "best"
    print(
        f"graph boundary, {args.inputs} static + {NON_STATIC} other inputs, one output "
        f"({torch_fl.active_platform().name}, torch {torch.__version__}; {warmth} of {args.rounds} x {calls} calls):"
    )
    print(f"  input conversion (GraphInputs)     {convert:7.2f} us per call")
    print(f"  whole boundary, stand-in replay    {whole:7.2f} us per call")
    if same_pointers is not None:
        print(
            f"  the tree manager's static check    {check['flagos']:7.2f} us per call "
            f"(on backing tensors, as plain: {check['plain']:.2f})"
        )


if __name__ == "__main__":
    main()
