"""Train a small decoder-only transformer on device="flagos", the main job of torch-fl.

    python examples/train_demo.py [--steps 20]

On a machine without an accelerator this runs on host_ref, the host-emulated reference chip; set
FLAGOS_PLATFORM (e.g. nvidia_h200) to pick another platform. The script prints the loss of every
step, then which execution paths (routes) served the aten ops of the run.
"""

from __future__ import annotations

import argparse
from collections import Counter

import torch
import torch.nn.functional as F

import torch_fl
from torch_fl.workloads.decoder import CONFIGS, DecoderLM, batch


def route_summary() -> list[tuple[str, str, int]]:
    """(op, path, calls) for every op this process ran on flagos, most calls first."""
    try:
        return [(r.op, r.path, r.calls) for r in torch_fl.routing.stats()]
    except (AttributeError, RuntimeError):  # the C++ core's counters alone
        rows = []
        for op, (native, cpu) in torch_fl.runtime.core().route_counts().items():
            rows += [(op, "native", native)] * bool(native) + [(op, "cpu", cpu)] * bool(cpu)
        return sorted(rows, key=lambda r: -r[2])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=20)
    args = parser.parse_args()

    platform = torch_fl.active_platform()
    print(f"platform {platform.name} ({platform.selection.reason}); {torch.flagos.device_count()} flagos device(s)")

    config = CONFIGS["tiny"]
    torch.manual_seed(0)
    model = DecoderLM(config).to("flagos")
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    inputs, targets = (t.to("flagos") for t in batch(config))

    for step in range(args.steps):
        optimizer.zero_grad()
        logits = model(inputs)
        loss = F.cross_entropy(logits.view(-1, config.vocab), targets.view(-1))
        loss.backward()
        optimizer.step()
        print(f"step {step:3d}  loss {loss.item():.4f}")

    rows = route_summary()
    by_path = Counter()
    for _, path, calls in rows:
        by_path[path] += calls
    print("\nroutes: " + ", ".join(f"{path} {calls} calls" for path, calls in by_path.most_common()))
    for op, path, calls in rows[:10]:
        print(f"  {op:40s} {path:8s} {calls:6d}")
    print(f"peak flagos memory {torch.flagos.max_memory_allocated() / 2**20:.1f} MiB")


if __name__ == "__main__":
    main()
