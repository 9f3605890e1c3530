"""What flagos's CUDA-graph boundary costs per call, apart from the graph.

    python bench/graph_boundary.py                                   # host_ref (or FLAGOS_PLATFORM)
    FLAGOS_PLATFORM=nvidia_h200 python bench/graph_boundary.py --inputs 56 --calls 20000

A compiled graph under `mode="reduce-overhead"` on flagos is wrapped by
`torch_fl.runtime.inductor.over_backing`: each call hands the tree manager CUDA aliases of the
flagos inputs and takes flagos aliases of its outputs back. This times that boundary around a
stand-in for the tree manager that records once and then returns its static outputs (as a replay
does), with `--inputs` static inputs (a decode step's parameters and static cache) and a few
non-static ones, and the input conversion (`backing_inputs`) alone. Microseconds per call, the best
of `--rounds` loops of `--calls` calls. Warm loops: in a model the boundary's data comes from
farther away between calls, so the board's cost per call is a multiple of these numbers.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from typing import Any

import torch

import torch_fl  # noqa: F401 - activates flagos
from torch_fl.runtime.device.core import core
from torch_fl.runtime.inductor import over_backing

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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--inputs", type=int, default=52, help="static inputs (parameters, cache)")
    parser.add_argument("--calls", type=int, default=20000, help="calls per loop")
    parser.add_argument("--rounds", type=int, default=5, help="loops; the best is reported")
    args = parser.parse_args()
    static = [torch.randn(64, 64, device="flagos") for _ in range(args.inputs)]
    steps = [torch.zeros(1, 1, dtype=torch.long, device="flagos") for _ in range(NON_STATIC)]
    inputs = static + steps
    positions, keep = list(range(len(inputs))), [i < args.inputs for i in range(len(inputs))]
    kept, backing_inputs = core().KeptAliases(), core().backing_inputs  # looked up once, as over_backing does
    convert = best_us(lambda: backing_inputs(list(inputs), positions, keep, kept), args.calls, args.rounds)
    boundary = over_backing(stand_in, lambda a: (a[0] @ a[1],), list(range(args.inputs)))
    whole = best_us(lambda: boundary(list(inputs)), args.calls, args.rounds)
    print(
        f"graph boundary, {args.inputs} static + {NON_STATIC} other inputs, one output "
        f"({torch_fl.active_platform().name}, torch {torch.__version__}; best of {args.rounds} x {args.calls} calls):"
    )
    print(f"  input conversion (backing_inputs)  {convert:7.2f} us per call")
    print(f"  whole boundary, stand-in replay    {whole:7.2f} us per call")


if __name__ == "__main__":
    main()
