"""What flagos adds to `import torch`: fresh interpreters with and without the autoload entry point,
side by side in one run.

    python bench/import_time.py [--rounds 7] [--json out.json]

Each round runs `python -c "import torch"` once with TORCH_DEVICE_BACKEND_AUTOLOAD=0 and once with
it on (the platform of this process, so that a CUDA machine activates the same one), interleaved so
that load on the machine hits both alike; medians of wall and CPU (user + system) seconds. The core
is built (or found) first, outside the timing. Design target: under 1 s of CPU added.
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

TARGET_S = 1.0


def import_seconds(autoload: bool, platform: str) -> tuple[float, float]:
    """(wall, cpu) seconds of one `python -c "import torch"`; checks that flagos did (not) activate."""
    env = dict(os.environ, TORCH_DEVICE_BACKEND_AUTOLOAD="1" if autoload else "0", FLAGOS_PLATFORM=platform)
    check = "assert hasattr(torch, 'flagos')" if autoload else "assert not hasattr(torch, 'flagos')"
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    subprocess.run([sys.executable, "-c", f"import torch; {check}"], env=env, check=True, capture_output=True)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--json", help="write the medians here")
    args = parser.parse_args()
    platform = torch_fl.activate().name  # the platform autoload would choose here
    import_seconds(True, platform)  # warm the file cache
    runs: dict[str, list[tuple[float, float]]] = {"plain": [], "flagos": []}
    for _ in range(args.rounds):
        runs["plain"].append(import_seconds(False, platform))
        runs["flagos"].append(import_seconds(True, platform))
    medians = {
        side: {"wall_s": statistics.median(w for w, _ in r), "cpu_s": statistics.median(c for _, c in r)}
        for side, r in runs.items()
    }
    added = {k: medians["flagos"][k] - medians["plain"][k] for k in ("wall_s", "cpu_s")}
    print(f"platform {platform}, medians of {args.rounds} interleaved rounds")
    for side, m in medians.items():
        print(f"  import torch ({side:6}) {m['wall_s']:.3f} s wall  {m['cpu_s']:.3f} s CPU")
    verdict = "within" if added["cpu_s"] < TARGET_S else "OVER"
    print(
        f"  flagos adds {added['wall_s']:+.3f} s wall, {added['cpu_s']:+.3f} s CPU ({verdict} the {TARGET_S} s target)"
    )
    if args.json:
        Path(args.json).write_text(json.dumps({"platform": platform, "medians": medians, "added": added}, indent=1))


if __name__ == "__main__":
    main()
