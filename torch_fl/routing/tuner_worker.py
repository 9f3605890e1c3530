"""The tuner's measurements in worker processes, so that a candidate kernel that crashes cannot end
the tuning with it.

A kernel that faults on the device (an illegal memory access on CUDA) poisons the whole process: the
error is sticky, and every later call, native ones included, fails too. Measured on the H200, where
FlagGems backward kernels validated on conformance's small samples faulted at a transformer's
shapes. So the parent saves the recorded samples and a worker measures them one by one, journaling
each result; a worker that dies, or whose device stops answering after a candidate failed, is
replaced by a fresh one that continues after the sample it was on, and that sample keeps native.

    python -m torch_fl.routing.tuner_worker SAMPLES JOURNAL START [DEADLINE]

DEADLINE (seconds since the epoch) ends the measuring before the next sample once passed.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch
from torch.utils._pytree import tree_map

from torch_fl import jsonl
from torch_fl.routing.tuner import Measurement, Sample, measure

# The worker exits with this status when its device stopped answering after a failed candidate.
POISONED = 3


def _resolve(name: str) -> Any:
    """aten::add.Tensor -> torch.ops.aten.add.Tensor"""
    namespace, _, rest = name.partition("::")
    op, _, overload = rest.partition(".")
    return getattr(getattr(getattr(torch.ops, namespace), op), overload or "default")


# torch.save cannot pickle torch.memory_format (recorded `zeros_like`, `clone`... carry one): it
# travels to the worker as a tagged string (plain str: the worker runs as __main__, so a class of
# this module would not be the one it unpickles).
_FORMAT_TAG = "\x00torch.memory_format:"
_MEMORY_FORMATS = {
    str(f): f for f in (torch.preserve_format, torch.contiguous_format, torch.channels_last, torch.channels_last_3d)
}


def _portable(value: Any) -> Any:
    return tree_map(lambda x: _FORMAT_TAG + str(x) if isinstance(x, torch.memory_format) else x, value)


def _restored(value: Any) -> Any:
    def restore(x: Any) -> Any:
        return _MEMORY_FORMATS[x[len(_FORMAT_TAG) :]] if isinstance(x, str) and x.startswith(_FORMAT_TAG) else x

    return tree_map(restore, value)


def device_answers() -> bool:
    try:
        torch.accelerator.synchronize()
        return torch.ones(1, device="flagos").add_(1).item() == 2.0
    except Exception:  # noqa: BLE001 - any failure means the device is gone for this process
        return False


def work(samples_file: Path, journal_file: Path, start: int, deadline: float | None = None) -> int:
    """Measure samples[start:], journaling each, until `deadline`; the exit status."""
    payload = torch.load(samples_file, weights_only=False)
    for i in range(start, len(payload)):
        if deadline is not None and time.time() > deadline:
            break
        item = payload[i]
        jsonl.append(journal_file, {"index": i, "started": True})
        args, kwargs = _restored((item["args"], item["kwargs"]))
        sample = Sample(
            item["op"], _resolve(item["op"]), item["bound"], item["dtype"], item["key"], args, kwargs, item["calls"]
        )
        m = measure(sample, item["paths"])
        jsonl.append(journal_file, {"index": i, "measurement": asdict(m)})
        if m.errors and not device_answers():
            return POISONED
    return 0


def measure_isolated(
    samples: list[tuple[Sample, list[str]]],
    platform: str,
    progress: Callable[[str], None] = lambda message: None,
    deadline: float | None = None,
) -> list[Measurement]:
    """Each (sample, candidate paths) measured in worker processes of platform `platform`, as many
    as fit before `deadline` (time.time())."""
    payload = [
        {
            "op": s.op,
            "bound": s.bound,
            "dtype": s.dtype,
            "key": s.key,
            "args": _portable(s.args),
            "kwargs": _portable(s.kwargs),
            "calls": s.calls,
            "paths": paths,
        }
        for s, paths in samples
    ]
    done: dict[int, Measurement] = {}
    with tempfile.TemporaryDirectory(prefix="torch-fl-tune-") as scratch:
        samples_file, journal_file = Path(scratch) / "samples.pt", Path(scratch) / "journal.jsonl"
        torch.save(payload, samples_file)
        env = {**os.environ, "FLAGOS_PLATFORM": platform}
        reader = jsonl.Reader(journal_file)
        start = 0
        while start < len(payload) and (deadline is None or time.time() < deadline):
            command = [
                sys.executable,
                "-m",
                "torch_fl.routing.tuner_worker",
                str(samples_file),
                str(journal_file),
                str(start),
                *([] if deadline is None else [repr(deadline)]),
            ]
            log = Path(scratch) / f"worker-{start}.log"  # a file, not a pipe: a chatty worker never blocks
            with open(log, "w") as stderr_file:
                worker = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=stderr_file)
            started: int | None = None

            def collect() -> None:
                nonlocal started
                for entry in reader.new():
                    if "measurement" in entry:
                        done[entry["index"]] = Measurement(**entry["measurement"])
                        progress(
                            f"measured {len(done)}/{len(payload)} {payload[entry['index']]['op']} <= {payload[entry['index']]['bound']}"
                        )
                    else:
                        started = entry["index"]

            measured_before = len(done)
            while worker.poll() is None:
                time.sleep(0.2)
                collect()
            collect()
            stderr = log.read_text(errors="replace")
            if worker.returncode not in (0, POISONED) and started is not None and started not in done:
                item = payload[started]
                tail = " | ".join(stderr.strip().splitlines()[-3:])[-300:]
                done[started] = Measurement(
                    item["op"],
                    item["bound"],
                    str(item["dtype"]).replace("torch.", ""),
                    item["calls"],
                    errors={"worker": f"the measuring process died (exit {worker.returncode}): {tail}"},
                )
                progress(f"sample {started} ({item['op']}) ended its worker: kept on native")
            elif len(done) == measured_before and worker.returncode == 0:  # the deadline passed
                break
            elif len(done) == measured_before:  # died before its first sample: a new one would too
                raise RuntimeError(
                    f"the tuning worker failed before measuring anything (exit {worker.returncode}): {stderr[-2000:]}"
                )
            start = max(done, default=-1) + 1
    return [done[i] for i in sorted(done)]


if __name__ == "__main__":  # importing torch (with FLAGOS_PLATFORM set) activated the platform
    sys.exit(work(Path(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4]) if sys.argv[4:] else None))
