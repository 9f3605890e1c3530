"""Which FlagGems kernel breaks the training workload, and whether flagos or FlagGems is to blame.

    FLAGOS_PLATFORM=nvidia_h200 python bench/flaggems_bisect.py --config small
    FLAGOS_PLATFORM=nvidia_h200 python bench/flaggems_bisect.py --config large --json out.json

The aten overloads FlagGems implements that one training step of the workload
(torch_fl/workloads/decoder.py, bf16, AdamW) calls are found on plain CUDA. Then, one overload at a
time, a few training steps run from the same weights with only that overload on FlagGems, twice:

    plain    plain CUDA (torch_fl never imported), the FlagGems kernel registered for the CUDA key
             alone, as `flag_gems.enable()` would register it
    flagos   flagos with that overload forced onto its flaggems route (the conformance gate
             bypassed), every other op native

and the per-step losses are compared with plain CUDA without FlagGems. A kernel that is wrong in
both is FlagGems' (at these shapes, on this torch and Triton); one wrong only on flagos is flagos'.
A kernel that faults the device ends its process: the overload is reported as such and a fresh
process goes on with the next. GEMMs autotune for about 30 s per shape on their first call: they
are left out unless --include-gemm.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import os
import subprocess
import sys
import tempfile
import warnings
from pathlib import Path

import torch
from torch.utils._python_dispatch import TorchDispatchMode

sys.path.insert(0, str(Path(__file__).resolve().parent))
from side_processes import MARK  # noqa: E402
from train_step import LOSS_RTOL, ROOT, workload  # noqa: E402

GEMMS = {"aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm"}


def flaggems_ops() -> dict:
    """FlagGems' aten overloads and callables, from torch_fl's table module loaded by path (a plain
    process must not import torch_fl)."""
    path = ROOT / "torch_fl" / "kernels" / "flaggems_table.py"
    spec = importlib.util.spec_from_file_location("flagos_bisect_flaggems_table", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.registered_ops()


def op_name(func: torch._ops.OpOverload) -> str:
    """aten::add.Tensor, aten::gelu: the names routes use (torch_fl's own helper is not importable here)."""
    name = func.name()
    return name if func._overloadname != "default" else name.removesuffix(".default")


class _Calls(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.names: set[str] = set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.names.add(op_name(func))
        return func(*args, **(kwargs or {}))


def train(config: str, device: str, steps: int) -> list[float]:
    decoder = workload()
    return decoder.train(decoder.CONFIGS[config], device, steps, torch.bfloat16)


def listing(args: argparse.Namespace) -> dict:
    """The overloads to bisect and the reference losses (plain device, no FlagGems)."""
    decoder = workload()
    _, _, step = decoder.build(decoder.CONFIGS[args.config], args.device, torch.bfloat16)
    calls = _Calls()
    with calls:
        step()
    available = flaggems_ops()
    ops = sorted(n for n in calls.names if n in available and (args.include_gemm or n.split(".")[0] not in GEMMS))
    return {"ops": ops, "reference": train(args.config, args.device, args.steps)}


def verdict(losses: list[float], reference: list[float]) -> str:
    if not all(math.isfinite(x) for x in losses):
        return "NaN"
    worst = max(abs(a - b) / max(abs(b), 1e-12) for a, b in zip(losses, reference))
    return "agree" if worst <= LOSS_RTOL["cuda"] else f"differ ({worst:.1e})"


def bisect(args: argparse.Namespace, ops: list[str], reference: list[float]) -> None:
    """Child: ops[start:] one by one, a reply line each."""
    if args.mode == "plain":
        table = flaggems_ops()
        device = args.device
    else:
        import torch_fl
        from torch_fl.routing.runtime import forced

        torch_fl.activate()

        device = "flagos"
    # registering over the CUDA kernel is the point here; torch warns about it on every overload
    warnings.filterwarnings("ignore", message="(?s).*Overriding a previously registered kernel")
    for i in range(args.start, len(ops)):
        op = ops[i]
        print(MARK + json.dumps({"index": i, "started": True}), flush=True)
        try:
            if args.mode == "plain":
                library = torch.library.Library("aten", "IMPL")
                try:
                    library.impl(op.removeprefix("aten::"), table[op], device.upper())
                    losses = train(args.config, device, args.steps)
                finally:
                    library._destroy()
            else:
                with forced(op, "flaggems"):
                    losses = train(args.config, device, args.steps)
            reply = {"index": i, "losses": losses, "verdict": verdict(losses, reference)}
        except Exception as exc:  # noqa: BLE001 - reported per overload
            reply = {"index": i, "verdict": f"error: {type(exc).__name__}: {str(exc)[:160]}"}
        print(MARK + json.dumps(reply), flush=True)
        if "losses" not in reply and not device_answers(device):
            sys.exit(3)  # a device error is sticky: a fresh process goes on with the next overload


def device_answers(device: str) -> bool:
    try:
        return torch.ones(1, device=device).add_(1).item() == 2.0
    except Exception:  # noqa: BLE001 - any failure means the device is gone for this process
        return False


def child(args: argparse.Namespace, mode: str, extra: list[str], scratch: Path) -> tuple[list[dict], str]:
    """Run a child; its replies and, if it died, the tail of its stderr."""
    command = [
        sys.executable,
        __file__,
        "--config",
        args.config,
        "--steps",
        str(args.steps),
        "--device",
        args.device,
        "--mode",
        mode,
        *extra,
    ]
    command += ["--include-gemm"] if args.include_gemm else []
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    if mode != "flagos":
        env["TORCH_DEVICE_BACKEND_AUTOLOAD"] = "0"
        env.pop("FLAGOS_PLATFORM", None)
    log = scratch / "child.log"
    with open(log, "w") as stderr:
        done = subprocess.run(command, env=env, stdout=subprocess.PIPE, stderr=stderr, text=True)
    replies = [json.loads(line[len(MARK) :]) for line in done.stdout.splitlines() if line.startswith(MARK)]
    died = "" if done.returncode == 0 else " | ".join(log.read_text(errors="replace").strip().splitlines()[-3:])[-300:]
    return replies, died


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default="small", help="a config of torch_fl/workloads/decoder.py")
    parser.add_argument("--steps", type=int, default=3, help="training steps per overload")
    parser.add_argument("--include-gemm", action="store_true", help="bisect the GEMMs too (autotuning: slow)")
    parser.add_argument("--modes", default="plain,flagos", help="which of plain, flagos to run")
    parser.add_argument("--device", default="cuda", help="the plain device (where FlagGems' kernels are registered)")
    parser.add_argument("--json", help="write the verdicts here")
    parser.add_argument("--mode", help="(internal) list, plain or flagos")
    parser.add_argument("--work", help="(internal) the listing file")
    parser.add_argument("--start", type=int, default=0, help="(internal) first overload")
    args = parser.parse_args()
    if args.mode == "list":
        print(MARK + json.dumps(listing(args)), flush=True)
        return
    if args.mode:
        work = json.loads(Path(args.work).read_text())
        bisect(args, work["ops"], work["reference"])
        return

    with tempfile.TemporaryDirectory() as folder:
        scratch = Path(folder)
        replies, died = child(args, "list", [], scratch)
        if not replies:
            sys.exit(f"listing the workload's FlagGems overloads failed: {died}")
        work = replies[0]
        (scratch / "work.json").write_text(json.dumps(work))
        ops = work["ops"]
        print(
            f"config {args.config}: {len(ops)} FlagGems overloads in one step; reference losses "
            + " ".join(f"{x:.4f}" for x in work["reference"]),
            flush=True,
        )
        verdicts: dict[str, dict[str, str]] = {op: {} for op in ops}
        for mode in args.modes.split(","):
            start = 0
            while start < len(ops):
                replies, died = child(
                    args, mode, ["--work", str(scratch / "work.json"), "--start", str(start)], scratch
                )
                running = None
                for r in replies:
                    if "verdict" in r:
                        verdicts[ops[r["index"]]][mode] = r["verdict"]
                        print(f"{mode:7s}{ops[r['index']]:40s}{r['verdict']}", flush=True)
                    running = r["index"]
                if running is None:  # a process that cannot even start would fail every overload
                    sys.exit(f"the {mode} process ended before its first overload: {died}")
                if mode not in verdicts[ops[running]]:
                    verdicts[ops[running]][mode] = f"process died: {died}"
                    print(f"{mode:7s}{ops[running]:40s}process died: {died}", flush=True)
                start = running + 1
    broken = {op: v for op, v in verdicts.items() if any(x != "agree" for x in v.values())}
    print(f"\n{len(broken)} of {len(ops)} overloads break the workload on FlagGems:")
    for op, v in broken.items():
        blame = (
            "FlagGems"
            if v.get("plain", "agree") != "agree"
            else "flagos"
            if v.get("flagos", "agree") != "agree"
            else "?"
        )
        print(f"  {op:40s}" + "  ".join(f"{m}: {x}" for m, x in v.items()) + f"  -> {blame}")
    if args.json:
        Path(args.json).write_text(
            json.dumps({"config": args.config, "reference": work["reference"], "verdicts": verdicts}, indent=1) + "\n"
        )


if __name__ == "__main__":
    main()
