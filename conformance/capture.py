"""The aten calls real models make, captured once as data: the cases of the `captured` suite.

The sweep suite varies sizes and layouts around kernel edges; what it cannot know is the exact
calls a transformer makes (a (batch, seq, hidden) norm, a logits cast of 2^27 elements, AdamW's
foreach lists). `capture()` runs each model of the zoo (torch_fl.workloads.zoo: every
architecture; a training step under bf16 autocast, a bf16 prefill and, where it generates, two
decoded tokens) at its board dimensions on plain CUDA (what a CUDA-backed board executes; the host
can, slowly), with batch 1 and one block of each repeated stack, and records every aten
call under a dispatch mode: the op, and each argument's shape, strides, offset and dtype (integer
tensors with their values, so indices stay in range, or their range when large), scalars and
flags as given. Calls that differ only in their integer values are one call.

`torch-fl conformance capture` regenerates the shipped list (CAPTURED); the suite judges each
captured call on every gated path against the native route, under the gate key it makes, and the
record's summary says what share of each model's calls was judged (`captured_coverage`).
"""

from __future__ import annotations

import gzip
import json
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from torch_fl.conformance.zoo_calls import CAPTURED

EXACT_VALUES = 4096
"""Integer and bool tensors up to this many elements keep their values; larger ones their range."""
DECODED_TOKENS = 2
_STACK_ATTRS = ("num_hidden_layers", "num_layers", "num_decoder_layers", "n_layer")
_SCALAR_TYPES = (bool, int, float, str, type(None))


class Unencodable(Exception):
    """An argument the captured form cannot hold (a generator, a custom object)."""


def encode(value: Any) -> Any:
    """The JSON form of one argument."""
    if isinstance(value, torch.Tensor):
        return _encode_tensor(value)
    if isinstance(value, _SCALAR_TYPES):
        if isinstance(value, float) and value != value:
            return {"float": "nan"}
        if isinstance(value, float) and value in (float("inf"), float("-inf")):
            return {"float": str(value)}
        return value
    if isinstance(value, (list, tuple)):
        return [encode(v) for v in value]
    if isinstance(value, torch.dtype):
        return {"dtype": str(value).removeprefix("torch.")}
    if isinstance(value, torch.device):
        return {"device": value.type}
    if isinstance(value, torch.memory_format):
        return {"memory_format": str(value).removeprefix("torch.")}
    if isinstance(value, torch.layout):
        return {"layout": str(value).removeprefix("torch.")}
    raise Unencodable(type(value).__name__)


def _encode_tensor(t: torch.Tensor) -> dict[str, Any]:
    if t.is_sparse or t.layout != torch.strided or t.is_quantized:
        raise Unencodable(f"a {t.layout} tensor")
    out: dict[str, Any] = {
        "shape": list(t.shape),
        "stride": list(t.stride()),
        "offset": t.storage_offset(),
        "dtype": str(t.dtype).removeprefix("torch."),
    }
    if not (t.dtype.is_floating_point or t.dtype.is_complex) and t.numel():
        flat = t.detach().reshape(-1)
        if t.numel() <= EXACT_VALUES:
            out["values"] = flat.tolist()
        else:
            out["range"] = [flat.min().item(), flat.max().item()]
    return out


def _identity(call: dict[str, Any]) -> str:
    """What makes two captured calls the same case: everything but integer values."""

    def strip(value: Any) -> Any:
        if isinstance(value, dict):
            return {k: strip(v) for k, v in value.items() if k not in ("values", "range")}
        if isinstance(value, list):
            return [strip(v) for v in value]
        return value

    return json.dumps(strip(call), sort_keys=True, separators=(",", ":"))


class _Recorder(TorchDispatchMode):
    def __init__(self, sink: dict[str, dict[str, Any]], label: str, skipped: Counter[str]) -> None:
        super().__init__()
        self.sink, self.label, self.skipped = sink, label, skipped

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        name = f"aten::{func._schema.name.split('::', 1)[1]}" + (
            f".{func._overloadname}" if func._overloadname != "default" else ""
        )
        if func._schema.name.startswith("aten::"):
            try:
                call = {"op": name, "args": encode(list(args)), "kwargs": {k: encode(v) for k, v in kwargs.items()}}
            except Unencodable:
                self.skipped[name] += 1
            else:
                entry = self.sink.setdefault(_identity(call), {**call, "models": {}})
                entry["models"][self.label] = entry["models"].get(self.label, 0) + 1
        return func(*args, **kwargs)


def _shallow(model: torch.nn.Module) -> torch.nn.Module:
    """Keep one block of each repeated stack (the layers of a transformer): the calls of one block
    are the calls of every block, at a fraction of the capture's time."""
    for module in model.modules():
        for name, child in list(module.named_children()):
            if (
                isinstance(child, torch.nn.ModuleList)
                and len(child) > 1
                and name in ("layers", "layer", "block", "h")
                and len({type(c) for c in child}) == 1  # a stack of one block class, not a block's parts
            ):
                setattr(module, name, torch.nn.ModuleList([child[0]]))
    config = getattr(model, "config", None)
    for attr in _STACK_ATTRS:
        if config is not None and isinstance(getattr(config, attr, None), int):
            setattr(config, attr, 1)
    return model


def _runs(name: str, device: str, size: str) -> Iterator[tuple[str, Callable[[], Any]]]:
    """(mode, run) of one architecture at `size` ("board": its real dimensions), batch 1, one
    block per stack, on `device`."""
    import copy
    from dataclasses import replace

    from torch_fl.workloads import zoo

    arch = zoo.ARCHS[name]
    shape = replace(arch.shapes[size], batch=1)
    model = _shallow(zoo.build(name, size))
    inputs = {k: v.to(device) for k, v in zoo.batch(name, model, shape).items()}
    yield "train", zoo.train_step(name, copy.deepcopy(model).to(device).train(), inputs, device, bf16=True)
    net = copy.deepcopy(model).to(device, torch.bfloat16).eval()
    half = {k: v.to(torch.bfloat16) if v.is_floating_point() else v for k, v in inputs.items()}

    def prefill() -> Any:
        with torch.inference_mode():
            return arch.loss(net, half)

    yield "prefill", prefill
    if arch.generates:
        prompt = zoo.prompt(model, 1, shape.prompt).to(device)

        def decode() -> Any:
            with torch.inference_mode():
                return zoo.generate(net, prompt, DECODED_TOKENS)

        yield "decode", decode


def capture(
    models: list[str], device: str = "cpu", size: str = "board", progress: Callable[[str], None] = lambda _: None
) -> dict[str, Any]:
    """Run each model's modes under the recorder; the list of distinct calls with their counts.
    On a GPU it takes seconds; board sizes on a CPU take many minutes (bf16 matmuls)."""
    from torch_fl.workloads import zoo

    sink: dict[str, dict[str, Any]] = {}
    skipped: Counter[str] = Counter()
    totals: dict[str, int] = {}
    for name in models:
        for mode, run in _runs(name, device, size):
            label = f"{name}/{mode}"
            progress(label)
            with _Recorder(sink, label, skipped):
                run()
            totals[label] = sum(c["models"].get(label, 0) for c in sink.values())
    calls = sorted(sink.values(), key=lambda c: (c["op"], _identity(c)))
    return {
        "format": 1,
        "made_by": f"torch-fl conformance capture --device {device} --size {size}",
        "torch": torch.__version__,
        "device": torch.cuda.get_device_name() if device == "cuda" else device,
        "zoo": {n: zoo.ARCHS[n].what for n in models},
        "calls_by_model": totals,
        "not_captured": dict(sorted(skipped.items())),
        "calls": calls,
    }


def write(data: dict[str, Any], path: Path = CAPTURED) -> None:
    from torch_fl.fileio import write_atomically

    write_atomically(Path(path), gzip.compress(json.dumps(data, separators=(",", ":")).encode(), mtime=0))


# ---- replaying a captured call
def decode_scalar(value: Any) -> Any:
    """A captured non-tensor argument as the op takes it (devices become flagos)."""
    if isinstance(value, list):
        return [decode_scalar(v) for v in value]
    if isinstance(value, dict):
        if "float" in value:
            return float(value["float"])
        if "dtype" in value:
            return getattr(torch, value["dtype"])
        if "device" in value:
            return torch.device("flagos")
        if "memory_format" in value:
            return getattr(torch, value["memory_format"])
        if "layout" in value:
            return getattr(torch, value["layout"])
    return value


def is_tensor(value: Any) -> bool:
    return isinstance(value, dict) and "shape" in value and "dtype" in value


def tensor_values(spec: dict[str, Any], g: torch.Generator) -> tuple[torch.Tensor, Callable[..., torch.Tensor]]:
    """(storage, view) of a captured tensor: random values for floating dtypes, the captured
    values or range for the others; `view(t, at)` lays them out with the captured strides and
    offset in the storage `t`, from its element `at` on."""
    shape, stride, offset = tuple(spec["shape"]), tuple(spec["stride"]), int(spec["offset"])
    dtype = getattr(torch, spec["dtype"])
    extent = offset if any(n == 0 for n in shape) else offset + 1 + sum((n - 1) * s for n, s in zip(shape, stride))
    if dtype.is_floating_point or dtype.is_complex:
        # drawn as wide as the dtype needs and no wider: board-size storages hold 10^7-10^8 values
        wide = torch.float64 if dtype in (torch.float64, torch.complex128) else torch.float32
        storage = torch.randn(extent, generator=g, dtype=wide).to(dtype)
    else:
        low, high = spec.get("range", [0, 1])
        storage = torch.randint(int(low), int(high) + 1, (extent,), generator=g).to(dtype)
        values = torch.tensor(spec.get("values", []), dtype=dtype)
        if values.numel() and extent - offset >= values.numel():  # not an expanded (overlapping) view
            storage.as_strided(shape, stride, offset).copy_(values.reshape(shape))
        elif values.numel():
            storage = values[torch.randint(0, values.numel(), (extent,), generator=g)]

    def view(t: torch.Tensor, at: int = 0) -> torch.Tensor:
        return t.as_strided(shape, stride, t.storage_offset() + at + offset)

    return storage, view
