"""`torch-fl kernel add`: stub in the vendor module, vendor first in routes.yaml, the op in the descriptor."""

from __future__ import annotations

import shutil

import pytest
import torch
from onboard_helpers import cli, make, snapshot, vendor_module

from torch_fl.onboarding.vendor import function_name, normalize_op
from torch_fl.platform.discovery import discover
from torch_fl.platform.loader import load_descriptor
from torch_fl.routing import table as route_table


@pytest.fixture
def chip(repo):
    make(repo)
    return repo / "plats" / "demo_chip"


def test_add_writes_stub_route_and_descriptor(chip):
    data = cli("kernel", "add", "demo_chip", "--op", "aten::silu")
    assert data["ok"] and data["op"] == "aten::silu" and data["function"] == "silu" and data["stub_added"]
    assert {f["path"]: f["action"] for f in data["files"]} == {
        "vendor_kernels.py": "updated",
        "routes.yaml": "updated",
        "platform.yaml": "updated",
    }
    descriptor = load_descriptor(chip)
    assert descriptor.kernels.vendor.ops == {"aten::relu": "relu", "aten::silu": "silu"}
    assert route_table.load(chip / "routes.yaml").ops["aten::silu"].candidates == ["vendor", "native"]
    x = torch.randn(16)
    torch.testing.assert_close(vendor_module(chip).silu(x), torch.nn.functional.silu(x))  # the stub delegates
    text = (chip / "vendor_kernels.py").read_text()
    assert "# STUB(torch-fl kernel add)" in text and "aten::silu(Tensor self) -> Tensor" in text


def test_comments_and_layout_survive(chip):
    descriptor = chip / "platform.yaml"
    text = descriptor.read_text().replace("capabilities:\n", "capabilities:          # measured on rev B\n")
    descriptor.write_text(text)
    routes = chip / "routes.yaml"
    routes.write_text(routes.read_text().replace("ops:\n", "ops:\n  # tuned by hand, keep\n"))
    cli("kernel", "add", "demo_chip", "--op", "aten::silu")
    after = descriptor.read_text()
    assert "capabilities:          # measured on rev B\n" in after
    assert after.replace("      aten::silu: silu\n", "") == text  # the one new line is all that changed
    assert "  # tuned by hand, keep\n" in routes.read_text()


def test_add_is_idempotent(chip):
    cli("kernel", "add", "demo_chip", "--op", "aten::silu")
    before = snapshot(chip)
    again = cli("kernel", "add", "demo_chip", "--op", "silu")
    assert {f["action"] for f in again["files"]} == {"unchanged"} and not again["stub_added"]
    assert snapshot(chip) == before


def test_an_existing_function_is_mapped_not_stubbed(chip):
    data = cli("kernel", "add", "demo_chip", "--op", "aten::relu_", "--function", "relu")
    actions = {f["path"]: f["action"] for f in data["files"]}
    assert actions["vendor_kernels.py"] == "unchanged" and actions["platform.yaml"] == "updated"
    assert load_descriptor(chip).kernels.vendor.ops["aten::relu_"] == "relu"


def test_implemented_kernel_is_not_touched(chip):
    cli("kernel", "add", "demo_chip", "--op", "aten::silu")
    module = chip / "vendor_kernels.py"
    module.write_text(
        module.read_text().replace(
            "return torch.ops.aten.silu.default(*args, **kwargs)", "return args[0] * torch.sigmoid(args[0])"
        )
    )
    mine = module.read_text()
    cli("kernel", "add", "demo_chip", "--op", "aten::silu")
    assert module.read_text() == mine


def test_overloads_and_builtin_names():
    assert normalize_op("add.Tensor") == "aten::add.Tensor"
    assert normalize_op("aten::silu.default") == "aten::silu"
    assert function_name("aten::add.Tensor") == "add_tensor"
    assert function_name("aten::abs") == "abs_kernel"  # would shadow the builtin
    assert function_name("aten::pow.Tensor_Scalar") == "pow_tensor_scalar"


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (("--op", "aten::no_such_op"), "has no such operator"),
        (("--op", "aten::add.NoSuchOverload"), "has no such operator"),
        (("--op", "aten::softmax"), "nearest overloads that reach the device: aten::_softmax"),
        (("--op", "aten::sofmax"), "aten::_softmax"),
        (("--op", "aten::softmax.int"), "it decomposes into: aten::_softmax"),
        (("--op", "aten::rms_norm"), "it decomposes into"),
        (("--op", "aten::rms_norm"), "aten::rsqrt"),
        (("--op", "aten::silu;rm"), "bad op name"),
        (("--op", "aten::silu", "--function", "class"), "not a usable Python function name"),
        (("--op", "aten::relu", "--function", "other"), "already mapped to 'relu'"),
    ],
)
def test_refusals_change_nothing(chip, args, words):
    before = snapshot(chip)
    data = cli("kernel", "add", "demo_chip", *args, code=1)
    assert words in data["error"]
    assert snapshot(chip) == before


def test_every_suggested_overload_is_accepted(chip):
    """What a refusal suggests reaches the device, so following the advice never meets a second refusal."""
    from torch_fl.onboarding.overloads import reaches_device

    error = cli("kernel", "add", "demo_chip", "--op", "aten::softmax", code=1)["error"]
    suggested = error.rpartition(": ")[2].split(", ")
    assert suggested and all(reaches_device(name, "cpu") for name in suggested)
    assert cli("kernel", "add", "demo_chip", "--op", suggested[0], "--dry-run")["ok"]


def test_a_composite_the_backing_implements_reaches_the_device():
    """silu_backward is CompositeImplicitAutograd, but the backing's own kernel is claimed for flagos."""
    from torch_fl.onboarding.overloads import reaches_device

    assert reaches_device("aten::silu_backward", "cpu")
    assert not reaches_device("aten::rms_norm", "cpu")
    assert reaches_device("aten::add.Tensor", "cpu")


def test_the_stub_states_the_vendor_contract(chip):
    """What a kernel receives is stated where it is written, and on the one docs page."""
    from pathlib import Path

    cli("kernel", "add", "demo_chip", "--op", "aten::add.Tensor")
    stub = (chip / "vendor_kernels.py").read_text().split("def add_tensor", 1)[1]
    for words in ("conjugate/negative views arrive", "may arrive as a Python number", "torch.result_type"):
        assert words in stub
    docs = (Path(__file__).parents[2] / "docs" / "onboarding.md").read_text()
    assert "### The vendor contract" in docs and "wrapped number" in docs


def test_unknown_platform(repo):
    assert "unknown platform" in cli("kernel", "add", "nope", "--op", "aten::silu", code=1)["error"]


def test_platform_without_vendor_kernels_gets_them(repo):
    """A descriptor with no kernels.vendor (here a copy of host_ref) gets the section and the module."""
    folder = repo / "plats" / "ref_copy"
    shutil.copytree(discover()["host_ref"].directory, folder, ignore=shutil.ignore_patterns("records"))
    descriptor = folder / "platform.yaml"
    descriptor.write_text(descriptor.read_text().replace("name: host_ref", "name: ref_copy"))
    data = cli("kernel", "add", "ref_copy", "--op", "aten::silu")
    actions = {f["path"]: f["action"] for f in data["files"]}
    assert actions == {"vendor_kernels.py": "created", "routes.yaml": "updated", "platform.yaml": "updated"}
    loaded = load_descriptor(folder)
    assert loaded.kernels.vendor.module == "vendor_kernels.py" and loaded.kernels.vendor.ops == {"aten::silu": "silu"}
    assert "# Kernel sets" not in descriptor.read_text()  # host_ref's own comments are kept, none invented
    assert "# No flaggems: FlagGems needs Triton on a GPU" in descriptor.read_text()
    assert callable(vendor_module(folder).silu)


def test_dry_run_writes_nothing(chip):
    before = snapshot(chip)
    data = cli("kernel", "add", "demo_chip", "--op", "aten::silu", "--dry-run")
    assert data["dry_run"] and {f["action"] for f in data["files"]} == {"updated"}
    assert snapshot(chip) == before


def test_onboard_rerun_keeps_added_kernels(chip, repo):
    """kernel add's edits are onboard's own (its manifest keeps them); the kernel a person then writes is theirs."""
    cli("kernel", "add", "demo_chip", "--op", "aten::silu")
    assert {f.action for f in make(repo).files} == {"unchanged"}
    module = chip / "vendor_kernels.py"
    stub = "return torch.ops.aten.silu.default(*args, **kwargs)"
    module.write_text(module.read_text().replace(stub, "return args[0]"))
    report = make(repo)
    actions = {f.path.name: f.action for f in report.files}
    assert actions.pop("vendor_kernels.py") == "skipped-edited" and set(actions.values()) == {"unchanged"}
    assert load_descriptor(chip).kernels.vendor.ops["aten::silu"] == "silu"
