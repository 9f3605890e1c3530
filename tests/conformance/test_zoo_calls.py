"""The calls real models make, captured as data and replayed (conformance/capture.py)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from torch_fl.conformance import capture, zoo_calls
from torch_fl.conformance.suites.captured import _plan


def _record(fn, label: str = "m/train") -> list[dict]:
    sink: dict = {}
    from collections import Counter

    with capture._Recorder(sink, label, Counter()):
        fn()
    return list(sink.values())


def _program() -> None:
    ids = torch.tensor([[3, 1, 4], [1, 5, 9]])
    weight = torch.randn(10, 8)
    hidden = F.embedding(ids, weight)  # (2, 3, 8)
    norm = F.layer_norm(hidden, (8,))
    logits = norm @ weight.t()
    F.cross_entropy(logits.reshape(-1, 10), ids.reshape(-1))
    F.layer_norm(torch.randn(2, 3, 8), (8,))  # the same call again, other float values


def test_capture_keeps_shapes_strides_dtypes_and_integer_values() -> None:
    calls = _record(_program)
    ops = [c["op"] for c in calls]
    assert "aten::embedding" in ops and "aten::native_layer_norm" in ops
    embedding = next(c for c in calls if c["op"] == "aten::embedding")
    weight, ids = embedding["args"][:2]
    assert weight == {"shape": [10, 8], "stride": [8, 1], "offset": 0, "dtype": "float32"}
    assert ids["values"] == [3, 1, 4, 1, 5, 9] and ids["dtype"] == "int64"
    norm = next(c for c in calls if c["op"] == "aten::native_layer_norm")
    assert norm["args"][0]["shape"] == [2, 3, 8] and norm["args"][1] == [8]
    assert norm["models"] == {"m/train": 2}  # the same call twice is one case, counted twice
    transposed = [a for c in calls for a in c["args"] if isinstance(a, dict) and a.get("stride") == [1, 8]]
    assert transposed, "the transposed weight keeps its strides"


def test_replay_lays_out_the_captured_tensors() -> None:
    calls = _record(_program)
    embedding = next(c for c in calls if c["op"] == "aten::embedding")
    plan = _plan(torch.ops.aten.embedding.default, embedding, seed=0)
    args, _, _ = plan.place("cpu")
    weight, ids = args[:2]
    assert weight.shape == (10, 8) and weight.stride() == (8, 1)
    assert ids.tolist() == [[3, 1, 4], [1, 5, 9]]
    spec = {"shape": [4, 3], "stride": [1, 4], "offset": 2, "dtype": "float16"}
    storage, view = capture.tensor_values(spec, torch.Generator().manual_seed(0))
    t = view(storage)
    assert t.shape == (4, 3) and t.stride() == (1, 4) and t.storage_offset() == 2 and t.dtype == torch.float16
    large = {"shape": [5000], "stride": [1], "offset": 0, "dtype": "int64", "range": [-100, 7]}
    storage, view = capture.tensor_values(large, torch.Generator().manual_seed(0))
    assert int(view(storage).min()) >= -100 and int(view(storage).max()) <= 7


def test_tensor_lists_replay_as_lists() -> None:
    def step() -> None:
        params = [torch.randn(3, 2), torch.randn(5)]
        torch._foreach_add_(params, [torch.ones(3, 2), torch.ones(5)])

    call = next(c for c in _record(step) if c["op"] == "aten::_foreach_add_.List")
    plan = _plan(torch.ops.aten._foreach_add_.List, call, seed=0)
    args, _, _ = plan.place("cpu")
    assert [t.shape for t in args[0]] == [(3, 2), (5,)] and len(args[1]) == 2


def test_the_shipped_list_names_every_zoo_model() -> None:
    from torch_fl.workloads import zoo

    data = zoo_calls.load()
    assert data["calls"], "conformance/zoo_calls.json.gz is shipped (torch-fl conformance capture)"
    models = {label.split("/")[0] for label in data["calls_by_model"]}
    assert models == set(zoo.ARCHS)


def test_coverage_counts_each_models_calls_as_often_as_it_makes_them() -> None:
    calls = [{"op": "aten::mm", "models": {"m/train": 3}}, {"op": "aten::add.Tensor", "models": {"m/train": 1}}]
    cases = [
        {"id": "captured/aten::mm/flaggems/0/bfloat16,bfloat16@large", "status": "passed"},
        {"id": "captured/aten::add.Tensor/flaggems/1", "status": "skipped"},
        {"id": "sweep/aten::mm/bfloat16/flaggems/size=1", "status": "passed"},
    ]
    row = zoo_calls.coverage(cases, calls)["m/train"]
    assert row == {"calls": 4, "gated": 4, "judged": 3, "judged_share": 0.75}
