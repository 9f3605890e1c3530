"""The suite's building blocks, without running it: comparison, journal, record, crash reports."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
import torch

from torch_fl.conformance import compare, crash, journal, recordfile, summary
from torch_fl.conformance.fingerprint import fingerprint
from torch_fl.conformance.recorder import inflight_path
from torch_fl.numerics import tolerances
from torch_fl.platform.record import Record, load_evidence


# ---- comparison
def test_tolerances_follow_flaggems() -> None:
    assert tolerances(torch.float16) == (1e-3, 1e-4)
    assert tolerances(torch.bfloat16, reduce=10) == (1.6e-2, 1e-3)
    assert tolerances(torch.float32)[0] == 1.3e-6
    assert tolerances(torch.int32) is None


def test_compare_tensor_values_nan_and_integers() -> None:
    ref = torch.tensor([1.0, 2.0, float("nan"), float("inf")], dtype=torch.float64)
    assert compare.compare_tensor(ref.to(torch.float16), ref, torch.float16) is None
    off = ref.clone()
    off[1] = 2.01
    assert "1/4 elements differ" in compare.compare_tensor(off.to(torch.float16), ref, torch.float16)
    moved_nan = torch.tensor([1.0, float("nan"), 3.0, float("inf")])
    assert compare.compare_tensor(moved_nan, ref, torch.float32) is not None
    assert compare.compare_tensor(torch.tensor([1, 2]), torch.tensor([1, 3]), torch.int64).startswith("1/2")


def test_compare_tensor_special_values_and_signed_zeros() -> None:
    inf, nan = float("inf"), float("nan")
    ref = torch.tensor([0.0, -0.0, inf, -inf, nan, 1.0])
    assert compare.compare_tensor(ref.clone(), ref, torch.float32, signed_zeros=True) is None
    flipped = torch.tensor([-0.0, -0.0, inf, -inf, nan, 1.0])
    assert compare.compare_tensor(flipped, ref, torch.float32) is None  # by value, -0.0 == 0.0...
    assert compare.compare_tensor(flipped, ref, torch.float32, signed_zeros=True).startswith("1/6 elements differ")
    near = torch.tensor([1e-30, -0.0, inf, -inf, nan, 1.0])  # ...and a nonzero result keeps its tolerance
    assert compare.compare_tensor(near, ref, torch.float32, signed_zeros=True) is None
    for wrong in (
        [0.0, -0.0, -inf, -inf, nan, 1.0],
        [0.0, -0.0, inf, -inf, 0.0, 1.0],
        [0.0, -0.0, inf, -inf, nan, nan],
    ):
        assert compare.compare_tensor(torch.tensor(wrong), ref, torch.float32) is not None, wrong  # exact, always
    z = torch.complex(torch.tensor([0.0]), torch.tensor([-0.0]))
    assert compare.compare_tensor(z.conj(), z, torch.complex64, signed_zeros=True) is not None
    assert compare.compare_tensor(z.conj(), z, torch.complex64) is None
    indices = torch.tensor([0, 3])  # argmax: exact, whatever the tolerance of its input's dtype
    assert compare.compare_value(torch.tensor([0, 2]), indices, torch.float32).startswith("1/2 elements differ")


def test_compare_tensor_sparse_results_by_value_and_layout() -> None:
    ref = torch.tensor([[0.0, 1.5], [2.0, 0.0]])
    assert compare.compare_tensor(ref.to_sparse_csr(), ref.double().to_sparse_csr(), torch.float32) is None
    assert compare.compare_tensor(ref.to_sparse(), ref.to_sparse(), torch.float32) is None
    doubled = compare.compare_tensor((ref * 2).to_sparse(), ref.to_sparse(), torch.float32)
    assert doubled.startswith("2/4 elements differ")
    assert compare.compare_tensor(ref.to_sparse(), ref.to_sparse_csr(), torch.float32) == (
        "layout torch.sparse_coo, expected torch.sparse_csr"
    )


def test_metadata_checks_strides_of_dense_results_only() -> None:
    row = torch.zeros(3, 4)
    col = torch.zeros(4, 3).t()
    assert compare.compare_metadata(col, row) == [f"strides {col.stride()}, expected {row.stride()}"]
    assert compare.compare_metadata(row, row.expand(3, 4)) == []  # an expanded result has no defined layout to match
    assert "dtype" in compare.compare_metadata(row.double(), row)[0]


def test_alias_patterns() -> None:
    x = torch.zeros(4)
    assert compare.alias_pattern([x[1:], torch.zeros(2)], [x]) == {(0, 0)}
    assert compare.compare_alias_patterns({(0, 0)}, set()) == [
        "output 0 shares storage with input 0, which PyTorch's kernel does not"
    ]
    assert "copy" in compare.compare_alias_patterns(set(), {(0, 0)})[0]


# ---- fingerprints
def test_fingerprint_ignores_numbers_and_dtypes_but_not_the_op() -> None:
    a = fingerprint("failed", "aten::mul.Tensor", "sample 0: 3/20 elements differ: got 1.5 float16")
    b = fingerprint("failed", "aten::mul.Tensor", "sample 1: 7/40 elements differ: got -2.25 bfloat16")
    assert a == b and len(a) == 12
    assert a != fingerprint("failed", "aten::add.Tensor", "sample 0: 3/20 elements differ: got 1.5 float16")
    assert a != fingerprint("crashed", "aten::mul.Tensor", "sample 0: 3/20 elements differ: got 1.5 float16")


# ---- journal
def test_journal_reader_is_incremental_and_skips_a_torn_line(tmp_path: Path) -> None:
    path = tmp_path / "j.jsonl"
    journal.start(path, {"platform": "p"})
    reader = journal.Reader(path)
    assert [e["kind"] for e in reader.new()] == ["run"]
    journal.append(path, {"kind": "case", "id": "a"})
    with open(path, "a") as f:
        f.write('{"kind": "case", "id": "torn')  # a crash mid-write
    assert [e["id"] for e in reader.new()] == ["a"]
    assert reader.new() == []
    assert journal.header(path)["platform"] == "p"


# ---- record
def _entry(case_id: str, status: str, suite: str = "ops", path: str | None = "native", message: str = "") -> dict:
    return {
        "kind": "case",
        "id": case_id,
        "suite": suite,
        "op": "aten::mm",
        "dtype": "float32",
        "path": path,
        "status": status,
        "message": message,
        "fingerprint": None if status == "passed" else "abc",
        "duration_s": 0.1,
    }


def test_record_has_the_loader_fields_and_keeps_the_last_entry_of_a_case(tmp_path: Path) -> None:
    collector = recordfile.Collector()
    binding = {"descriptor_hash": "sha256:x", "torch": "2.13", "torch_version": "2.13.0"}
    header = {
        "kind": "run",
        "platform": "p",
        "binding": binding,
        "started": "now",
        "machine": {"workers": 2},
        "selection": {"k": "mm"},
    }
    collector.feed(
        [
            header,
            _entry("ops/a", "crashed"),
            _entry("ops/a", "passed"),
            _entry("ops/b", "failed", message="bad"),
            _entry("ops/c", "unjudged", message="not every part was compared"),
            _entry("amp/d", "passed", "amp", None),
            _entry("ops/e", "skipped", message="no sample applies"),
        ]
    )
    record, cases = recordfile.build(collector, complete=True, finished="later")
    assert [c["id"] for c in cases] == ["amp/d", "ops/a", "ops/b", "ops/c", "ops/e"]
    assert [c["id"] for c in record["failures"]] == ["ops/b"]
    s = record["summary"]
    assert s["by_status"] == {"passed": 2, "failed": 1, "unjudged": 1, "skipped": 1}
    assert (
        s["ops_criterion"]["judged"] == 2 and s["ops_criterion"]["rate"] == 0.5 and s["ops_criterion"]["unjudged"] == 1
    )
    assert record["machine"]["selection"] == {"k": "mm"}
    target = tmp_path / "records" / "torch-2.13.json"
    recordfile.write(target, record, cases)
    written = Record.model_validate_json(target.read_text())
    assert written.failures[0].id == "ops/b" and written.evidence.cases == 5 and written.checksum.startswith("sha256:")
    assert [c.id for c in load_evidence(target)] == [c["id"] for c in cases]
    text = summary.render(record)
    assert "| ops | 1 | 1 |" in text and "## Failures" in text and "`ops/b`" in text


# ---- crash reports
def _marker(run_dir: Path, worker: str, trace: str, started_ago: float, timeout: float) -> None:
    (run_dir / "inflight").mkdir(parents=True)
    trace_file = run_dir / "inflight" / f"{worker}.trace"
    trace_file.write_text(trace)
    inflight_path(run_dir, worker).write_text(
        json.dumps(
            {
                "item": "ops.py::test_op[x]",
                "case": {
                    "id": "ops/x/float32/vendor/aten::x",
                    "suite": "ops",
                    "op": "aten::x",
                    "dtype": "float32",
                    "path": "vendor",
                    "keys": ["float32@large"],
                },
                "item_level": False,
                "started": time.time() - started_ago,
                "timeout": timeout,
                "trace": str(trace_file),
                "trace_offset": 0,
            }
        )
    )


def test_crash_report_names_the_fault_and_the_kernel(tmp_path: Path) -> None:
    trace = (
        "Fatal Python error: Segmentation fault\n\nThread 0x01 (most recent call first):\n"
        '  File "/usr/lib/python3.11/threading.py", line 331 in wait\n\n'
        "Current thread 0x02 (most recent call first):\n"
        '  File "/usr/lib/python3.11/ctypes/__init__.py", line 519 in string_at\n'
        '  File "/chips/acme/kernels.py", line 12 in abs_kernel\n'
    )
    _marker(tmp_path, "gw0", trace, started_ago=0.5, timeout=60)
    entry = crash.diagnose(tmp_path, "gw0", "ops.py::test_op[x]")
    assert entry["status"] == "crashed" and entry["op"] == "aten::x"
    assert entry["keys"] == ["float32@large"]  # the key in flight when it died: only that key is vetoed
    assert "Segmentation fault" in entry["message"] and "kernels.py:12 in abs_kernel" in entry["message"]
    assert crash.diagnose(tmp_path, "gw0", "ops.py::test_op[x]") is None  # the marker is consumed


def test_timeout_report(tmp_path: Path) -> None:
    trace = (
        "Timeout (0:00:05)!\nThread 0x01 (most recent call first):\n"
        '  File "/chips/acme/kernels.py", line 3 in hang\n  File "/x/_pytest/runner.py", line 1 in call\n'
    )
    _marker(tmp_path, "gw1", trace, started_ago=6, timeout=5)
    entry = crash.diagnose(tmp_path, "gw1", "ops.py::test_op[x]")
    assert entry["status"] == "timeout" and "5 s" in entry["message"] and "kernels.py:3 in hang" in entry["message"]


# ---- command line
def test_bad_selection_is_refused_before_anything_runs() -> None:
    from torch_fl.conformance.runner import RunOptions, validate

    with pytest.raises(ValueError, match="unknown suite"):
        validate(RunOptions("host_ref", suites=["opz"]))
    with pytest.raises(ValueError, match="paths"):
        validate(RunOptions("host_ref", paths=["gpu"]))
    with pytest.raises(ValueError, match=">= 1"):
        validate(RunOptions("host_ref", workers="0"))


def test_model_reference_script_takes_the_launchers_arguments() -> None:
    """The model case's reference for a device backing runs decoder.py through run_script (which
    appends the output path); on the host the same script must give the in-process losses."""
    from torch_fl.conformance.launch import run_script
    from torch_fl.workloads import decoder

    env = {"FLAGOS_PLATFORM": None, "TORCH_DEVICE_BACKEND_AUTOLOAD": "0"}
    result = run_script(Path(decoder.__file__), ["cpu", "2", "tiny"], env, timeout=300)
    assert result["losses"] == pytest.approx(decoder.train(decoder.CONFIGS["tiny"], "cpu", 2), rel=1e-6)


# ---- out= overloads
class _OutOp:
    """An OpInfo stand-in whose out= overload returns `out` without writing it when `writes` is off."""

    supports_out = True
    inplace_variant = None

    def __init__(self, writes: bool) -> None:
        self.writes = writes

    def __call__(self, x: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        result = x.sum().to(torch.int64)
        if out is None:
            return result
        if self.writes:
            out.copy_(result)
        return out


@pytest.mark.parametrize("writes", [True, False])
def test_an_out_overload_that_leaves_out_unwritten_is_an_error_of_that_part(writes: bool) -> None:
    from torch_fl.conformance.opcheck import Variant, run_sample

    class Sample:
        input = torch.ones(3)
        args: tuple = ()
        kwargs: dict = {}
        output_process_fn_grad = None

    variant = Variant("cpu", "cpu", home="cpu")
    run = run_sample(_OutOp(writes), Sample(), variant, torch.float32, 0, None, backward=False)
    assert run.out is not None
    if writes:
        assert run.out.error is None and run.out.values[0].item() == 3
    else:
        assert run.out.error is not None and "left unwritten" in run.out.error


def test_the_cpu_path_refuses_privateuse1_hooks() -> None:
    from torch_fl.routing.constraints import refusal

    assert "PrivateUse1 hook" in refusal("aten::_scaled_dot_product_fused_attention_overrideable", "cpu")
    assert refusal("aten::_scaled_dot_product_fused_attention_overrideable", "native") is None
    assert refusal("aten::add.Tensor", "cpu") is None
