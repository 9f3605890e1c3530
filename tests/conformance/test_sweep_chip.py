"""The sweep suite catches defects that only sizes, layouts, dtype mixes and special values show
(fixtures/sweep_chip).

One real `torch-fl conformance run sweep_chip --suite sweep` with thresholds drawn at random for
this run inside the swept range: a kernel that crashes above a size, one that hangs above an
extent, wrong values above a size, strides ignored for integers, wrong only for mixed dtypes, an
in-place kernel that allocates, a nondeterministic one, a wrong output dtype, a write past the
end, NaN turned into 0, argmax giving the last of equal values, a layer norm wrong only for 3-D
inputs with long rows, a kernel wrong only for small broadcast (stride-0) inputs, a reduction
wrong only with keepdim=True, one wrong only on device 1, a split-K matmul wrong above a K at
small M and N, one whose intermediate overflows, one that loses the sign of a zero; relu and tanh
are correct. The gate must refuse each defective route for the
dtypes it fails at every size (below the threshold too: trust does not widen past the evidence),
keep the good ones, and a program run afterwards, at sizes below and above the thresholds, must
get right results without aborting or hanging, with the good kernels served by `vendor`.
"""

from __future__ import annotations

import json
import random
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from conformance_helpers import FIXTURES, cases_by_id, conformance, run_env
from filelock import FileLock

from torch_fl.conformance.sizes import ELEMENTWISE_NUMELS, SIZES
from torch_fl.routing.gatekey import SIZE_CLASSES, size_class

pytestmark = pytest.mark.slow
ALL_CLASSES = {name for name, _ in SIZE_CLASSES}


def _draw() -> dict[str, int]:
    """Thresholds inside the swept range: above the layout and mix cases' small sizes, except
    expanded_numel, between the tiny layout cases (7x9) and the small ones (33x17); norm_hidden and
    split_k above every size case's extent, so that only the one-dimension sweeps reach them."""
    rng = random.Random()
    return {
        "crash_numel": rng.randint(600, 60000),
        "hang_k": rng.choice([k for _, _, k in SIZES["matmul"] if 100 <= k < 4096]) + rng.randint(0, 1),
        "wrong_numel": rng.randint(600, 1_000_000),
        "norm_hidden": rng.randint(2048, 16383),
        "expanded_numel": rng.randint(63, 560),
        "split_k": rng.randint(1024, 8191),
    }


@pytest.fixture(scope="module")
def sweep_run(tmp_path_factory: pytest.TempPathFactory, worker_id: str) -> dict[str, Any]:
    """The run, made once per pytest session: xdist workers share it (it takes minutes of both cores)."""
    if worker_id == "master":
        return _sweep_run(tmp_path_factory)
    shared = tmp_path_factory.getbasetemp().parent  # this session's folder, above every worker's own
    with FileLock(shared / "sweep_chip.lock", timeout=1800):
        made = shared / "sweep_chip.json"
        if made.exists():
            run = json.loads(made.read_text())
            return {**run, "plats": Path(run["plats"])}
        run = _sweep_run(tmp_path_factory)
        made.write_text(json.dumps({**run, "plats": str(run["plats"])}))
        return run


def _sweep_run(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    plats = tmp_path_factory.mktemp("plats")
    shutil.copytree(FIXTURES / "sweep_chip", plats / "sweep_chip")
    thresholds = _draw()
    env = run_env(FLAGOS_PLATFORM_PATH=str(plats), SWEEP_CHIP_THRESHOLDS=json.dumps(thresholds))
    out = conformance(
        [
            "sweep_chip",
            "--suite",
            "sweep",
            "--paths",
            "native,vendor",
            "-n",
            "2",
            "--timeout",
            "10",
            "--fail-on-failure",
            "--add",  # the record the gate reads, started by this subset
        ],
        env,
        timeout=1500,
    )
    record = json.loads(Path(out["record"]).read_text())
    return {"out": out, "env": env, "thresholds": thresholds, "gate": record["gate"], "plats": plats}


def _verdicts(run: dict[str, Any], op: str) -> dict[str, str]:
    return run["gate"].get(op, {}).get("vendor", {})


def _failed(run: dict[str, Any], op: str) -> set[str]:
    return {k for k, v in _verdicts(run, op).items() if v == "failed"}


def _passed(run: dict[str, Any], op: str) -> set[str]:
    return {k for k, v in _verdicts(run, op).items() if v == "passed"}


def _proven(run: dict[str, Any], op: str) -> frozenset[str]:
    """The keys the gate lets `op` run on vendor for, from the run's record."""
    from torch_fl.platform.gating import Gate
    from torch_fl.platform.loader import load_descriptor

    gate = Gate.for_platform(load_descriptor(run["plats"] / "sweep_chip"), torch.__version__, forced=False)
    return gate.proven_keys(op, "vendor")


def _cases(run: dict[str, Any], op: str, dtype: str) -> dict[str, dict[str, Any]]:
    """The vendor cases of `op` in `dtype`, by id."""
    if "cases" not in run:
        run["cases"] = cases_by_id(Path(run["out"]["record"]))
    prefix = f"sweep/{op}/{dtype}/vendor/"
    return {i: c for i, c in run["cases"].items() if i.startswith(prefix)}


def _statuses(run: dict[str, Any], op: str, dtype: str) -> dict[str, str]:
    """The vendor cases of `op` in `dtype`: case name (without the op, dtype, path and gate key) -> status."""
    prefix = f"sweep/{op}/{dtype}/vendor/"
    return {i.removeprefix(prefix).split("/")[0]: c["status"] for i, c in _cases(run, op, dtype).items()}


def _last_dim(name: str) -> int:
    """The last extent of a case's size: `vary=K,size=17x33x2049` -> 2049."""
    return int(name.split("size=")[1].split(",")[0].rsplit("x", 1)[1])


def _plain(statuses: dict[str, str]) -> dict[str, str]:
    """The size cases with every argument at its plain value, on the current device."""
    return {n: s for n, s in statuses.items() if n.startswith(("size=", "vary=")) and "=" not in n.split("size=")[1]}


def _special(cases: dict[str, dict[str, Any]], kind: str | None = None) -> dict[str, dict[str, Any]]:
    """The special-value cases among `cases` (of that kind, if given)."""
    return {i: c for i, c in cases.items() if f"/special={kind or ''}" in i}


def _classes_above(threshold: int) -> set[str]:
    """Size classes with an elementwise size case above `threshold`."""
    return {size_class(n) for n in ELEMENTWISE_NUMELS if n > threshold}


def test_the_run_completes_and_says_which_paths_failed(sweep_run):
    out = sweep_run["out"]
    assert out["complete"], out
    assert out["failures_by_path"]["vendor"] > 0 and not out["failures_by_path"].get("native"), out
    assert out["cli_exit"] == 2 and out["cases_per_s"], out  # --fail-on-failure: a vendor failure fails CI


def test_crash_above_a_size_refuses_the_dtypes_at_every_size(sweep_run):
    t = sweep_run["thresholds"]["crash_numel"]
    assert _failed(sweep_run, "aten::neg"), sweep_run["thresholds"]
    assert {k.rsplit("@", 1)[1] for k in _failed(sweep_run, "aten::neg")} <= _classes_above(t)
    assert "float32@tiny" in _passed(sweep_run, "aten::neg")  # the evidence below the threshold stays...
    assert not any(k.startswith("float32@") for k in _proven(sweep_run, "aten::neg"))  # ...and proves nothing


def test_hang_above_an_extent_refuses_its_dtypes(sweep_run):
    failed = _failed(sweep_run, "aten::mm")
    assert failed and all(k.startswith("float32,float32@") for k in failed), failed
    assert "float32,float32@tiny" in _passed(sweep_run, "aten::mm"), "below the extent it passed..."
    assert not any(k.startswith("float32,float32@") for k in _proven(sweep_run, "aten::mm")), "...and is not trusted"


def test_wrong_values_for_large_inputs(sweep_run):
    t = sweep_run["thresholds"]["wrong_numel"]
    failed = _failed(sweep_run, "aten::add.Tensor")
    assert failed and {k.rsplit("@", 1)[1] for k in failed} <= _classes_above(t), (t, failed)
    assert not any(k.startswith("float32,float32@") for k in _proven(sweep_run, "aten::add.Tensor"))


def test_strides_ignored_for_integers(sweep_run):
    assert "int32@small" in _failed(sweep_run, "aten::abs")  # the layout cases run at 33x17
    assert "float32@small" in _passed(sweep_run, "aten::abs")


def test_wrong_for_mixed_dtypes_only(sweep_run):
    failed = _failed(sweep_run, "aten::mul.Tensor")
    assert "float32,int64@tiny" in failed and "int32,bfloat16@tiny" in failed, failed
    assert "float32,float32@huge" in _passed(sweep_run, "aten::mul.Tensor")


def test_inplace_that_allocates(sweep_run):
    assert "float32,float32@tiny" in _failed(sweep_run, "aten::add_.Tensor")
    assert not _passed(sweep_run, "aten::add_.Tensor")


def test_nondeterministic(sweep_run):
    failed, passed = _failed(sweep_run, "aten::sum.dim_IntList"), _passed(sweep_run, "aten::sum.dim_IntList")
    assert any(k.startswith("float32") for k in failed), failed
    assert any(k.startswith("int32") for k in passed), passed  # integer sums are exact: no noise added


def test_wrong_output_dtype(sweep_run):
    assert any(k.startswith("int32") for k in _failed(sweep_run, "aten::exp"))
    assert any(k.startswith("float32") for k in _passed(sweep_run, "aten::exp"))


def test_write_past_the_end(sweep_run):
    assert any(k.startswith("float32->float32@") for k in _failed(sweep_run, "aten::sigmoid.out"))
    assert not any(k.startswith("float32->float32@") for k in _proven(sweep_run, "aten::sigmoid.out"))


def test_nan_turned_into_zero_is_refused_for_floats(sweep_run):
    cases = _cases(sweep_run, "aten::exp2", "float32")
    plain = {i: c["status"] for i, c in cases.items() if i not in _special(cases)}
    assert plain and set(plain.values()) == {"passed"}, plain  # random inputs never hold a NaN...
    nan = [
        c for c in _special(cases, "extremal").values() if c["status"] == "failed" and "expected nan" in c["message"]
    ]
    assert nan, _special(cases)  # ...the extremal case does
    assert not any(k.startswith("float32@") for k in _proven(sweep_run, "aten::exp2"))
    integers = {k: v for k, v in _verdicts(sweep_run, "aten::exp2").items() if k.startswith("int32")}
    assert integers and set(integers.values()) == {"passed"}, integers  # exp2 of an integer is never NaN


def test_argmax_giving_the_last_of_equal_values_is_refused(sweep_run):
    cases = _cases(sweep_run, "aten::argmax", "float32")
    plain = {i: c["status"] for i, c in cases.items() if i not in _special(cases)}
    assert plain and set(plain.values()) == {"passed"}, plain  # random floats never tie...
    assert any(c["status"] == "failed" for c in _special(cases, "ties").values()), _special(cases)  # ...ties do
    assert not any(k.startswith("float32@") for k in _proven(sweep_run, "aten::argmax"))
    assert "int32@small" in _failed(sweep_run, "aten::argmax")  # small random integers tie already
    assert not any(k.startswith("int32@") for k in _proven(sweep_run, "aten::argmax"))


def test_overflow_on_the_way_is_refused(sweep_run):
    cases = _cases(sweep_run, "aten::hypot", "float32")
    plain = {i: c["status"] for i, c in cases.items() if i not in _special(cases)}
    assert plain and set(plain.values()) == {"passed"}, plain  # random inputs never square past the max...
    assert any(c["status"] == "failed" and "inf" in c["message"] for c in _special(cases, "extremal").values())
    assert not any(k.startswith("float32,float32@") for k in _proven(sweep_run, "aten::hypot"))  # ...max/2 does


def test_the_sign_of_a_zero_is_compared(sweep_run):
    cases = _cases(sweep_run, "aten::trunc", "float32")
    plain = {i: c["status"] for i, c in cases.items() if i not in _special(cases)}
    assert plain and set(plain.values()) == {"passed"}, plain  # -0.0 == 0.0 for ordinary comparisons...
    assert any(c["status"] == "failed" for c in _special(cases, "extremal").values()), _special(cases)
    assert not any(k.startswith("float32@") for k in _proven(sweep_run, "aten::trunc"))  # ...not for special values
    integers = {k: v for k, v in _verdicts(sweep_run, "aten::trunc").items() if k.startswith("int32")}
    assert integers and set(integers.values()) == {"passed"}, integers  # an integer has no fraction


def test_layer_norm_wrong_for_long_3d_rows_only(sweep_run):
    t = sweep_run["thresholds"]["norm_hidden"]
    statuses = _statuses(sweep_run, "aten::native_layer_norm", "float32")
    hidden = {n: s for n, s in statuses.items() if n.startswith("vary=hidden,")}
    two_d = {n: s for n, s in hidden.items() if n.count("x") == 1}
    three_d = {n: s for n, s in hidden.items() if n.count("x") == 2}
    assert any(_last_dim(n) > t for n in two_d) and set(two_d.values()) == {"passed"}, (t, two_d)  # 2-D: right
    failed = {n for n, s in three_d.items() if s == "failed"}
    assert failed and all(_last_dim(n) > t for n in failed), (t, three_d)  # the 3-D sweep finds the threshold
    assert all(s == "passed" for n, s in three_d.items() if _last_dim(n) <= t), (t, three_d)
    sized = {n: s for n, s in statuses.items() if n.startswith("size=")}
    assert sized and set(sized.values()) == {"passed"}, sized  # no size case reaches the threshold...
    assert not any(k.startswith("float32,") for k in _proven(sweep_run, "aten::native_layer_norm"))  # ...refused


def test_small_broadcasts_wrong_are_refused_at_every_size(sweep_run):
    for dtype in ("float32", "int32"):
        statuses = _statuses(sweep_run, "aten::sin", dtype)
        assert statuses["layout=expanded"] == "passed", statuses  # 33x17: above the threshold
        assert statuses["layout=expanded,size=7x9"] == "failed", statuses  # the tiny layout case finds it
        assert set(_plain(statuses).values()) == {"passed"}, statuses  # contiguous inputs are right...
        assert not any(k.startswith(f"{dtype}@") for k in _proven(sweep_run, "aten::sin"))  # ...and refused too


def test_reduction_wrong_with_keepdim_only(sweep_run):
    statuses = _statuses(sweep_run, "aten::mean.dim", "float32")
    failed = {n for n, s in statuses.items() if s == "failed"}
    assert failed and all(n.endswith(",keepdim=True") for n in failed), failed
    others = {n: s for n, s in statuses.items() if n.startswith(("size=", "vary=")) and "keepdim" not in n}
    assert any(n.endswith(",dim=0") for n in others) and set(others.values()) == {"passed"}, others
    assert not any(k.startswith("float32") for k in _proven(sweep_run, "aten::mean.dim"))


def test_kernel_wrong_on_device_1_only(sweep_run):
    for dtype in ("float32", "int32"):
        statuses = _statuses(sweep_run, "aten::cos", dtype)
        assert set(_plain(statuses).values()) == {"passed"}, statuses  # right on device 0
        # the kernel sees its device as the current one: with flagos:0 current it is right on inputs on 1
        on_1 = {n: s for n, s in statuses.items() if n.startswith("device=1,")}
        assert {s for n, s in on_1.items() if n.startswith("device=1,current=0,")} == {"passed"}, on_1
        assert any(n.startswith("device=1,current=1,") and s == "failed" for n, s in on_1.items()), on_1
        assert not any(k.startswith(f"{dtype}@") for k in _proven(sweep_run, "aten::cos"))


def test_split_k_wrong_above_a_k_at_small_numel(sweep_run):
    t = sweep_run["thresholds"]["split_k"]
    statuses = _statuses(sweep_run, "aten::bmm", "float32")
    failed = {n for n, s in statuses.items() if s == "failed"}
    assert failed and all(n.startswith("vary=K,") and _last_dim(n) > t for n in failed), (t, failed)
    below = {
        n: s for n, s in statuses.items() if n.startswith("size=") or (n.startswith("vary=K,") and _last_dim(n) <= t)
    }
    assert set(below.values()) == {"passed"}, (t, below)  # every size case, K up to 4096 among them, passed
    assert not any(k.startswith("float32,") for k in _proven(sweep_run, "aten::bmm"))


def test_triage_proposes_the_limit_that_excludes_a_threshold(sweep_run):
    from torch_fl.platform.triage import read_record, triage

    record, cases = read_record(Path(sweep_run["out"]["record"]))
    report = triage(record, cases, sweep_run["out"]["record"])
    [hang] = [p for g in report["groups"] for p in g["constraints"] if p["op"] == "aten::mm"]
    # where the hang came first in a case that varied M, N and K together, M and K are equally
    # supported by the evidence; K is among the limits offered either way
    k_limits = [a["bound"] for a in [hang, *hang["alike"]] if (a["dim"], a["side"]) == ("K", "max")]
    assert k_limits and k_limits[0] >= sweep_run["thresholds"]["hang_k"], (sweep_run["thresholds"], hang)
    assert hang["keeps"] == hang["passing"] > 0, hang  # every passing mm call is below the hang


def test_good_kernels_pass_every_key(sweep_run):
    for op in ("aten::relu", "aten::tanh"):
        verdicts = _verdicts(sweep_run, op)
        assert verdicts and set(verdicts.values()) == {"passed"}, (op, verdicts)
        assert {k.rsplit("@", 1)[1] for k in verdicts} >= {"tiny", "small", "medium", "large", "huge"}
        for dtype in ("float32", "int32"):  # special values too, at two size classes
            for kind in ("extremal", "ties"):
                special = _special(_cases(sweep_run, op, dtype), kind)
                assert {c["status"] for c in special.values()} == {"passed"}, (op, dtype, kind, special)
                assert {k.rsplit("@", 1)[1] for c in special.values() for k in c["keys"]} == {"small", "medium"}
            cases = _cases(sweep_run, op, dtype)
            for layout in ("transposed", "expanded"):  # layouts at every size class
                laid = [c for i, c in cases.items() if f"/layout={layout}" in i]
                assert {c["status"] for c in laid} == {"passed"}, (op, dtype, layout)
                assert {k.rsplit("@", 1)[1] for c in laid for k in c["keys"]} == ALL_CLASSES, (op, dtype, layout)
            on_1 = {i: c["status"] for i, c in cases.items() if "/device=1," in i}
            assert len(on_1) == 6 and set(on_1.values()) == {"passed"}, (op, dtype, on_1)  # 2 currents x 3 cases


PROGRAM = r"""
import json, sys, torch, torch_fl
from torch_fl.routing import stats
t = json.loads(sys.argv[1])
sizes = [64, t["crash_numel"] + 1, t["wrong_numel"] + 1, 2**20 + 1]
for n in sizes:
    x = torch.randn(n)
    i = torch.randint(-5, 6, (n,), dtype=torch.int32)
    d = x.to("flagos")
    assert torch.equal(torch.neg(d).cpu(), torch.neg(x))
    assert torch.equal(torch.add(d, d).cpu(), torch.add(x, x))
    assert torch.equal(torch.relu(d).cpu(), torch.relu(x)) and torch.allclose(torch.tanh(d).cpu(), torch.tanh(x))
    assert torch.exp(i.to("flagos")).dtype == torch.float32
    mixed = torch.mul(i.to("flagos"), torch.ones(n, dtype=torch.bfloat16, device="flagos"))
    assert torch.equal(mixed.cpu(), i * torch.ones(n, dtype=torch.bfloat16))
    acc = d.clone(); assert acc.add_(d) is acc
    buf = torch.zeros(n + 1, device="flagos"); torch.sigmoid(d, out=buf[:n]); assert buf[n].item() == 0
# a size class is proven by the extents swept in it: above the threshold, call at a swept failing shape
for m, k, n in ((17, 65, 33), (64, 4096, 64)):
    a, b = torch.randn(m, k), torch.randn(k, n)
    assert torch.allclose(torch.mm(a.to("flagos"), b.to("flagos")).cpu(), a @ b, atol=1e-3)
s = torch.randint(-5, 6, (33, 17), dtype=torch.int32).t()
assert torch.equal(torch.abs(s.to("flagos")).cpu(), torch.abs(s))
print(json.dumps([[r.op, r.path, r.calls] for r in stats()]))
"""


def test_runtime_serves_good_keys_by_vendor_and_never_aborts_or_hangs(sweep_run):
    env = {**sweep_run["env"], "FLAGOS_PLATFORM": "sweep_chip"}
    proc = subprocess.run(
        [sys.executable, "-c", PROGRAM, json.dumps(sweep_run["thresholds"])],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, f"thresholds {sweep_run['thresholds']}:\n{proc.stderr[-3000:]}"
    served = {(op, path) for op, path, _ in json.loads(proc.stdout.strip().splitlines()[-1])}
    assert ("aten::relu", "vendor") in served and ("aten::tanh", "vendor") in served, served
    for op in ("aten::neg", "aten::mm"):  # refused at every size: native serves the float32 calls
        assert (op, "vendor") not in served and (op, "native") in served, (op, served)


def test_explain_names_the_failing_keys(sweep_run):
    code = (
        "import json, torch_fl; from torch_fl.routing import explain; print(json.dumps(explain('aten::neg').as_dict()))"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code],
        env={**sweep_run["env"], "FLAGOS_PLATFORM": "sweep_chip"},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    vendor = next(p for p in json.loads(proc.stdout.strip().splitlines()[-1])["paths"] if p["path"] == "vendor")
    assert not any(k.startswith("float32@") for k in vendor["validated_keys"]), vendor
