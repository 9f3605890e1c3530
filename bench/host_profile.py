"""Where does the flagos host path spend its time? Profiles a training step's CPU side, per aten op,
on flagos and on the plain backing device, and prints them side by side (largest extra cost first).

    python bench/host_profile.py --config small --steps 5            # host_ref or FLAGOS_PLATFORM
    FLAGOS_PLATFORM=nvidia_h200 python bench/host_profile.py --config large

The plain-CUDA reference runs in a subprocess that never imports torch_fl (a process with flagos
registered cannot run autograd over plain CUDA tensors; see torch_fl.activation).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def measure(device: str, config: str, steps: int) -> dict:
    from torch.profiler import ProfilerActivity, profile

    from torch_fl.workloads.decoder import CONFIGS, build

    dtype = torch.bfloat16 if device in ("cuda", "flagos") and _backing(device) == "cuda" else torch.float32
    _, _, step = build(CONFIGS[config], device, dtype)
    sync = (
        torch.cuda.synchronize
        if device == "cuda"
        else (lambda: torch.flagos.synchronize() if device == "flagos" else None)
    )
    for _ in range(3):
        step()
    sync()
    host, wall = [], []
    for _ in range(steps):
        sync()
        start = time.perf_counter()
        loss = step()
        enqueued = time.perf_counter()
        float(loss)
        wall.append((time.perf_counter() - start) * 1e3)
        host.append((enqueued - start) * 1e3)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        step()
        sync()
    ops: dict[str, list[float]] = defaultdict(lambda: [0, 0.0])
    for event in prof.key_averages():
        if event.key.startswith("aten::") or event.key.startswith("flagos"):
            ops[event.key][0] += event.count
            ops[event.key][1] += event.self_cpu_time_total
    return {
        "device": device,
        "ms_per_step": sorted(wall)[len(wall) // 2],
        "host_ms_per_step": sorted(host)[len(host) // 2],
        "ops": {k: v for k, v in ops.items()},
    }


def _backing(device: str) -> str:
    if device == "flagos":
        from torch_fl.runtime.device.core import backing

        return backing()
    return device


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default="small")
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--reference", action="store_true", help="(internal) profile the plain backing device")
    parser.add_argument("--json", help="write both profiles here")
    args = parser.parse_args()
    if args.reference:
        device = "cuda" if torch.cuda.is_available() else "cpu"
        print(json.dumps(measure(device, args.config, args.steps)))
        return
    import torch_fl

    torch_fl.activate()

    backing = _backing("flagos")
    env = {**os.environ, "TORCH_DEVICE_BACKEND_AUTOLOAD": "0"}
    env.pop("FLAGOS_PLATFORM", None)
    out = subprocess.run(
        [sys.executable, __file__, "--reference", "--config", args.config, "--steps", str(args.steps)],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    reference = json.loads(out.stdout.strip().splitlines()[-1])
    flagos = measure("flagos", args.config, args.steps)
    rows = []
    for name in set(reference["ops"]) | set(flagos["ops"]):
        rc, rt = reference["ops"].get(name, (0, 0.0))
        fc, ft = flagos["ops"].get(name, (0, 0.0))
        rows.append((ft - rt, name, rc, rt, fc, ft))
    rows.sort(reverse=True)
    print(f"config {args.config}, backing {backing}")
    print(f"{'':44s}{'plain':>22s}{'flagos':>22s}")
    print(f"ms/step {reference['ms_per_step']:>58.3f}{flagos['ms_per_step']:>22.3f}")
    print(f"host enqueue ms/step {reference['host_ms_per_step']:>45.3f}{flagos['host_ms_per_step']:>22.3f}")
    print(f"throughput ratio flagos/plain: {reference['ms_per_step'] / flagos['ms_per_step']:.3f}")
    print(f"{'op (self CPU us, one step)':44s}{'calls':>8s}{'us':>14s}{'calls':>8s}{'us':>14s}{'extra us':>12s}")
    for extra, name, rc, rt, fc, ft in rows[:40]:
        print(f"{name[:44]:44s}{rc:>8d}{rt:>14.1f}{fc:>8d}{ft:>14.1f}{extra:>12.1f}")
    if args.json:
        Path(args.json).write_text(json.dumps({"reference": reference, "flagos": flagos}, indent=1))


if __name__ == "__main__":
    main()
