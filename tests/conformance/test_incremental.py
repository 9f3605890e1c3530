"""Incremental re-validation: an edited kernel file re-runs the vendor cases of its ops only.

fixtures/split_chip keeps relu and tanh in one kernel file and neg and abs (wrong) in another; its
vendor module only imports them.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch
from conformance_helpers import FIXTURES, cases_by_id, conformance, run_env

from torch_fl.conformance import journal, recordfile
from torch_fl.conformance.incremental import EVERY, costliest_first, plan, sources_decide
from torch_fl.conformance.recordfile import identity
from torch_fl.conformance.runner import RunOptions, incremental_plan, resume_selection
from torch_fl.platform.gating import Gate
from torch_fl.platform.loader import load_descriptor
from torch_fl.platform.record import Binding, current_status

SIGN = "split_chip_sign.py"
UNARY = "split_chip_unary.py"
KEY = "float32@small"
FIXED_ABS_BROKEN_NEG = '''"""Kernels of split_chip: neg (now wrong) and abs (now fixed)."""

import torch


def neg(self):
    return self.clone()


def abs_(self):
    return torch.abs(self)
'''


@pytest.fixture
def chip(tmp_path: Path) -> Path:
    folder = tmp_path / "split_chip"
    shutil.copytree(FIXTURES / "split_chip", folder)
    return folder


def _case(op: str, suite: str, item: str, status: str = "passed") -> dict[str, Any]:
    return {
        "id": f"{suite}/{op}/float32/vendor/{item}",
        "suite": suite,
        "op": op,
        "dtype": "float32",
        "path": "vendor",
        "keys": ["float32@small"],
        "status": status,
        "item": f"{suite}.py::{item}",
    }


def _record(chip: Path, cases: list[dict[str, Any]]) -> Path:
    """A complete record of `chip` as it is now, with these cases (no suite run)."""
    descriptor = load_descriptor(chip)
    header = {**identity(descriptor), "sources_decide": sources_decide(descriptor), "started": recordfile.now()}
    path = chip / "records" / f"torch-{header['binding']['torch']}.json"
    recordfile.write_cases(path, header, cases)
    return path


def _plan(chip: Path, record: Path) -> Any:
    descriptor = load_descriptor(chip)
    return plan(descriptor, record, Binding(**identity(descriptor)["binding"]))


CASES = [
    _case("aten::relu", "ops", "test_op[nn.functional.relu-float32]"),
    _case("aten::tanh", "sweep", "test_sweep[aten::tanh-float32]"),
    _case("aten::neg", "sweep", "test_sweep[aten::neg-float32]"),
    _case("aten::abs", "ops", "test_op[abs-float32]", "failed"),
    {"id": "rng/test_generator_object", "suite": "rng", "status": "passed", "item": "rng.py::test_generator_object"},
]


def test_each_kernel_file_decides_its_ops_and_the_vendor_module_every_case(chip: Path) -> None:
    assert sources_decide(load_descriptor(chip)) == {
        "kernels.py": [EVERY],
        SIGN: ["aten::abs", "aten::neg"],
        UNARY: ["aten::relu", "aten::tanh"],
    }


@pytest.mark.parametrize(
    "edit",
    [
        "import split_chip_unary\n",  # another kernel file imports it: a helper
        "print('side effect')\n",  # its import runs code
        "import a_vendor_library_that_is_not_installed\n",  # its import could fail
        "def broken(:\n",  # unreadable
    ],
)
def test_a_kernel_file_others_may_depend_on_decides_every_case(chip: Path, edit: str) -> None:
    sign = chip / SIGN
    sign.write_text(sign.read_text() + edit)
    decide = sources_decide(load_descriptor(chip))
    assert decide[SIGN] == [EVERY]
    if "split_chip_unary" in edit:
        assert decide[UNARY] == [EVERY]  # the file it imports is a helper now


@pytest.mark.parametrize(
    "addition",
    [
        "\n\ndef relu_twice(self):\n    return relu(relu(self))\n",  # a kernel function used as a helper
        "\nimport split_chip_unary  # noqa: E402\n",  # the whole module: any of its names may be used
    ],
)
def test_a_kernel_file_the_vendor_module_uses_otherwise_decides_every_case(chip: Path, addition: str) -> None:
    module = chip / "kernels.py"
    module.write_text(module.read_text() + addition)
    decide = sources_decide(load_descriptor(chip))
    assert decide[UNARY] == [EVERY] and decide[SIGN] == ["aten::abs", "aten::neg"]


def test_an_edited_kernel_file_plans_its_ops_vendor_items(chip: Path) -> None:
    record = _record(chip, CASES)
    assert _plan(chip, record) is None  # nothing changed: the record is valid
    (chip / SIGN).write_text(FIXED_ABS_BROKEN_NEG)
    planned = _plan(chip, record)
    assert planned is not None
    assert planned.as_dict() == {
        "changed": [SIGN],
        "ops": ["aten::abs", "aten::neg"],
        "suites": ["ops", "sweep"],
        "items": 2,
    }
    assert sorted(planned.items) == ["ops.py::test_op[abs-float32]", "sweep.py::test_sweep[aten::neg-float32]"]


def test_a_plan_lists_the_costliest_items_first() -> None:
    """Workers take pending items from the end of a busy worker's queue: cheap ones last."""
    from types import SimpleNamespace

    cases = [
        SimpleNamespace(item="ops.py::a", duration_s=0.5),
        SimpleNamespace(item="captured.py::b", duration_s=4.0),
        SimpleNamespace(item="ops.py::a", duration_s=4.0),
        SimpleNamespace(item="sweep.py::c", duration_s=None),
        SimpleNamespace(item="captured.py::d", duration_s=9.0),
    ]
    assert costliest_first(cases) == ["captured.py::d", "ops.py::a", "captured.py::b", "sweep.py::c"]


def test_an_edited_vendor_module_or_a_new_file_re_runs_every_vendor_op(chip: Path) -> None:
    record = _record(chip, CASES)
    (chip / "helpers.py").write_text("SCALE = 2\n")
    planned = _plan(chip, record)
    assert planned is not None and planned.changed == ["helpers.py"]
    assert planned.ops == ["aten::abs", "aten::neg", "aten::relu", "aten::tanh"] and len(planned.items) == 4


def test_only_a_source_change_is_incremental(chip: Path) -> None:
    record = _record(chip, CASES)
    (chip / SIGN).write_text(FIXED_ABS_BROKEN_NEG)
    descriptor = chip / "platform.yaml"
    descriptor.write_text(descriptor.read_text().replace("virtual_devices: 1", "virtual_devices: 2"))
    assert _plan(chip, record) is None  # the descriptor decides every case: a full run


def test_a_record_without_items_or_incomplete_needs_a_full_run(chip: Path) -> None:
    record = _record(chip, [{**c, "item": None} for c in CASES])
    (chip / SIGN).write_text(FIXED_ABS_BROKEN_NEG)
    assert _plan(chip, record) is None
    (chip / SIGN).write_text((FIXTURES / "split_chip" / SIGN).read_text())
    record = _record(chip, CASES)
    data = json.loads(record.read_text())
    (chip / SIGN).write_text(FIXED_ABS_BROKEN_NEG)
    record.write_text(json.dumps({**data, "complete": False}))  # the checksum no longer matches either
    assert _plan(chip, record) is None


def test_full_and_explicit_selections_are_never_incremental(chip: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FLAGOS_PLATFORM_PATH", str(chip.parent))
    record = _record(chip, CASES)
    (chip / SIGN).write_text(FIXED_ABS_BROKEN_NEG)
    assert incremental_plan(RunOptions("split_chip"), record) is not None
    for options in (
        RunOptions("split_chip", full=True),
        RunOptions("split_chip", suites=["sweep"]),
        RunOptions("split_chip", k="neg"),
        RunOptions("split_chip", add=True),
    ):
        assert incremental_plan(options, record) is None


def test_an_interrupted_incremental_run_is_run_again_not_resumed(tmp_path: Path) -> None:
    record = tmp_path / "torch-2.13.json"
    selection = {"suites": ["sweep"], "paths": ["vendor"], "k": "test_sweep[aten::neg-float32]"}
    journal.start(journal.journal_path(record), {"selection": {**selection, "replace_ops": ["aten::neg"]}})
    with pytest.raises(ValueError, match="run without --resume"):
        resume_selection(RunOptions("split_chip", resume=True), record)


@pytest.mark.slow  # runs the conformance command in subprocesses
def test_an_edited_kernel_is_revalidated_alone(chip: Path) -> None:
    env = run_env(FLAGOS_PLATFORM_PATH=str(chip.parent))
    selection = ["--suite", "ops,sweep", "-k", "sweep or relu or tanh or neg or abs", "-n", "2"]
    first = conformance(["split_chip", *selection, "--add"], env)  # --add: this subset starts the record
    assert first["complete"] and not first["partial"] and first["incremental"] is None, first
    record_file = Path(first["record"])
    before = cases_by_id(record_file)
    descriptor = load_descriptor(chip)
    gate = Gate.for_platform(descriptor, torch.__version__)
    assert gate.state == "valid" and not gate.allows("aten::abs", KEY, "vendor")
    assert gate.allows("aten::neg", KEY, "vendor") and gate.allows("aten::relu", KEY, "vendor")

    (chip / SIGN).write_text(FIXED_ABS_BROKEN_NEG)
    assert current_status(descriptor).state == "stale"
    again = conformance(["split_chip", "-n", "2"], env)
    assert again["complete"] and not again["partial"], again
    assert again["incremental"]["changed"] == [SIGN] and again["incremental"]["ops"] == ["aten::abs", "aten::neg"]
    after = cases_by_id(record_file)
    rerun = {i for i, c in after.items() if c["path"] == "vendor" and c["op"] in ("aten::abs", "aten::neg")}
    # the re-run cases carry the edited kernels' verdicts: abs fixed, neg broken (durations of
    # millisecond cases may repeat to the 4th decimal, so they prove nothing)
    abs_ids = {i for i in rerun if after[i]["op"] == "aten::abs"}
    neg_ids = rerun - abs_ids
    assert any(before[i]["status"] == "failed" for i in abs_ids & before.keys())
    assert not any(after[i]["status"] == "failed" for i in abs_ids)
    assert not any(before[i]["status"] == "failed" for i in neg_ids & before.keys())
    assert any(after[i]["status"] == "failed" for i in neg_ids)
    items_run = {after[i]["item"] for i in rerun}
    kept = {i for i, c in before.items() if c["item"] not in items_run}
    assert all(after[i] == before[i] for i in kept)  # the items of relu and tanh did not run
    assert {c["op"] for i, c in before.items() if i in kept and c["path"] == "vendor"} >= {"aten::relu", "aten::tanh"}

    status = current_status(descriptor)
    assert status.state == "valid" and status.record is not None and status.record.complete
    gate = Gate.for_platform(descriptor, torch.__version__)
    assert gate.allows("aten::abs", KEY, "vendor") and not gate.allows("aten::neg", KEY, "vendor")
    assert gate.allows("aten::relu", KEY, "vendor")


def test_a_plan_of_a_thousand_items_selects_them_exactly(tmp_path: Path) -> None:
    """An edit of the vendor module decides the items of every vendor op: over a thousand on a
    host_ref-like chip. As a -k expression pytest cannot compile them (recursion), and -k matches
    substrings; the run passes the node ids in a file the plugin selects by."""
    from _pytest.mark.expression import Expression

    from conformance.runner import RunOptions, items_file, pytest_command

    ids = [f"ops.py::test_op[op{i}-float32]" for i in range(1500)]
    with pytest.raises(RecursionError):
        Expression.compile(" or ".join(i.split("::")[1] for i in ids))
    options = RunOptions(platform="host_ref", add=True, paths=["vendor"], items=ids)
    argv = pytest_command(options, tmp_path / "torch-2.13.json", tmp_path / "pytest.ini", tmp_path / "out.json")
    assert "-k" not in argv and argv[argv.index("--fl-items") + 1] == str(items_file(tmp_path))
