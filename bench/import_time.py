"""What flagos adds to `import torch`, and what its first use costs: fresh interpreters side by side.

    python bench/import_time.py [--rounds 9] [--json out.json]

Each round runs, interleaved so that load on the machine hits them alike:
    plain      `import torch` with TORCH_DEVICE_BACKEND_AUTOLOAD=0 (the baseline)
    flagos     `import torch` with the autoload on (the platform of this process, so that a CUDA
               machine activates the same one): what every process pays that never uses flagos
    first use  `import torch` and one flagos tensor: what a process that uses flagos pays
Each side's cost over plain is the median of the per-round differences, with their interquartile
range as the spread, in wall and CPU (user + system) seconds. The core is built (or found) first,
outside the timing. Target: the autoload adds at most 0.05 s of wall time.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch_fl

TARGET_S = 0.05
SIDES = {
    "plain": ("0", "import torch; assert not hasattr(torch, 'flagos')"),
    "flagos": ("1", "import torch; assert hasattr(torch, 'flagos')"),
    "first use": ("1", "import torch; torch.ones(1, device='flagos')"),
}


def run_seconds(side: str, platform: str) -> tuple[float, float]:
    """(wall, cpu) seconds of one fresh interpreter running `side`'s program."""
    autoload, program = SIDES[side]
    env = dict(os.environ, TORCH_DEVICE_BACKEND_AUTOLOAD=autoload, FLAGOS_PLATFORM=platform)
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    subprocess.run([sys.executable, "-c", program], env=env, check=True, capture_output=True)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def added(side: list[float], plain: list[float]) -> dict[str, float]:
    """Median and interquartile range of the per-round differences `side - plain`."""
    deltas = sorted(s - p for s, p in zip(side, plain))
    low, _, high = statistics.quantiles(deltas, n=4, method="inclusive") if len(deltas) > 1 else deltas * 3
    return {"median": statistics.median(deltas), "q1": low, "q3": high}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--json", help="write the medians and differences here")
    args = parser.parse_args()
    platform = torch_fl.activate().name  # the platform autoload would choose here
    for side in SIDES:
        run_seconds(side, platform)  # warm the file cache
    runs: dict[str, list[tuple[float, float]]] = {side: [] for side in SIDES}
    for _ in range(args.rounds):
        for side in SIDES:
            runs[side].append(run_seconds(side, platform))
    medians = {
        side: {"wall_s": statistics.median(w for w, _ in r), "cpu_s": statistics.median(c for _, c in r)}
        for side, r in runs.items()
    }
    deltas = {
        side: {
            kind: added([t[i] for t in runs[side]], [t[i] for t in runs["plain"]])
            for i, kind in enumerate(("wall_s", "cpu_s"))
        }
        for side in SIDES
        if side != "plain"
    }
    print(f"platform {platform}, {args.rounds} interleaved rounds")
    for side, m in medians.items():
        print(f"  {side:9}  {m['wall_s']:.3f} s wall  {m['cpu_s']:.3f} s CPU (medians)")
    for side, d in deltas.items():
        wall, cpu = d["wall_s"], d["cpu_s"]
        print(
            f"  {side:9} adds {wall['median']:+.3f} s wall (IQR {wall['q1']:+.3f} .. {wall['q3']:+.3f}), "
            f"{cpu['median']:+.3f} s CPU (IQR {cpu['q1']:+.3f} .. {cpu['q3']:+.3f})"
        )
    verdict = "within" if deltas["flagos"]["wall_s"]["median"] <= TARGET_S else "OVER"
    print(f"  the autoload is {verdict} the {TARGET_S} s wall target")
    if args.json:
        summary = {"platform": platform, "rounds": args.rounds, "medians": medians, "added": deltas}
        Path(args.json).write_text(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
