"""`import torch` with flagos autoloaded costs less than a second more than `import torch` alone.

A loose functional bound, measured in fresh interpreters with the core already built: the median
of 3 each, interleaved. The bound is checked on the child's CPU time (user + system), which a busy
machine inflates far less than wall time; both are printed. bench/ has the precise numbers."""
from __future__ import annotations

import os
import resource
import statistics
import subprocess
import sys
import time

import torch_fl

ROUNDS = 3
BOUND_S = 1.0


def import_seconds(autoload: bool) -> tuple[float, float]:
    """(wall, cpu) seconds of one `python -c "import torch"`."""
    env = dict(os.environ)
    env["TORCH_DEVICE_BACKEND_AUTOLOAD"] = "1" if autoload else "0"
    env["FLAGOS_PLATFORM"] = torch_fl.active_platform().name  # needed on CUDA machines (containment)
    check = "assert hasattr(torch, 'flagos')" if autoload else "assert not hasattr(torch, 'flagos')"
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    subprocess.run([sys.executable, "-c", f"import torch; {check}"], env=env, check=True, capture_output=True)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu


def test_autoload_import_overhead():
    import_seconds(True)  # warm the file cache (and build the core if this torch is new)
    plain, with_flagos = [], []
    for _ in range(ROUNDS):  # interleaved, so machine load affects both alike
        plain.append(import_seconds(False))
        with_flagos.append(import_seconds(True))
    wall = [statistics.median(w for w, _ in runs) for runs in (plain, with_flagos)]
    cpu = [statistics.median(c for _, c in runs) for runs in (plain, with_flagos)]
    print(
        f"\nimport torch without autoload: {wall[0]:.3f} s wall, {cpu[0]:.3f} s CPU"
        f"\nimport torch with flagos:      {wall[1]:.3f} s wall, {cpu[1]:.3f} s CPU"
        f"\nflagos adds {wall[1] - wall[0]:+.3f} s wall, {cpu[1] - cpu[0]:+.3f} s CPU (medians of {ROUNDS})"
    )
    assert cpu[1] - cpu[0] < BOUND_S
