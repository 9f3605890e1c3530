"""Rendering: every generated file is valid for the code that reads it, for defaults and every --like."""

from __future__ import annotations

import io

import jinja2
import pytest
import torch
import yaml
from onboard_helpers import make, vendor_module

from torch_fl.onboarding import render
from torch_fl.onboarding.descriptor import EXAMPLE_OP, scaffold
from torch_fl.platform.discovery import discover
from torch_fl.platform.loader import load_descriptor
from torch_fl.routing import table as route_table

SHIPPED = sorted(discover())


def test_default_platform_files(repo):
    report = make(repo)
    folder = repo / "plats" / "demo_chip"
    assert [f.action for f in report.files] == ["created"] * 6
    descriptor = load_descriptor(folder)
    assert descriptor.status == "unvalidated" and descriptor.backing.device == "cpu"
    assert descriptor.detect.rules == []  # never detected by accident
    assert descriptor.kernels.vendor.ops == {EXAMPLE_OP: "relu"}
    table = route_table.load(folder / "routes.yaml")
    assert table.ops[EXAMPLE_OP].candidates == ["vendor", "native"]
    readme = (folder / "README.md").read_text()
    assert "torch-fl conformance run demo_chip" in readme and "| `aten::relu` | vendor, native |" in readme
    assert (repo / ".github" / "workflows" / "flagos-demo_chip.yml").is_file()


def test_example_kernel_computes_on_backing_tensors(repo):
    make(repo)
    relu = vendor_module(repo / "plats/demo_chip").relu
    x = torch.tensor([-2.0, -0.0, 0.5, 3.0])
    torch.testing.assert_close(relu(x), torch.relu(x))
    assert relu(torch.tensor([-3, 4])).tolist() == [0, 4]


@pytest.mark.parametrize("like", SHIPPED)
def test_like_every_shipped_platform(repo, like):
    make(repo, "new_chip", like=like)
    source = load_descriptor(discover()[like].directory)
    made = load_descriptor(repo / "plats" / "new_chip")
    assert made.vendor == source.vendor and made.boards == source.boards
    assert made.status == "unvalidated" and made.detect.rules == []
    assert made.backing.device == source.backing.device
    assert made.capabilities == source.capabilities
    assert made.kernels.vendor.module == "vendor_kernels.py"
    route_table.load(repo / "plats" / "new_chip" / "routes.yaml")


def test_like_keeps_routes_of_declared_sets_and_drops_tuned_buckets(repo):
    make(repo, "gpu_chip", like="nvidia_h200")
    h200 = route_table.load(discover()["nvidia_h200"].directory / "routes.yaml")
    made = route_table.load(repo / "plats" / "gpu_chip" / "routes.yaml")
    # the default order comes along; an entry whose order agrees with it (_to_copy, kept in
    # nvidia_h200 for its tuned buckets) does not
    assert made.default == h200.default
    assert h200.ops["aten::_to_copy"].buckets and set(made.ops) == {"aten::native_layer_norm_backward", EXAMPLE_OP}
    assert made.ops[EXAMPLE_OP].candidates[0] == "vendor"
    assert all(not r.buckets for r in made.ops.values())
    # a person's entry (FlagGems' layer-norm backward defect) comes along with its reason
    kept = made.ops["aten::native_layer_norm_backward"]
    assert kept.candidates == ["native"] and kept.provenance.source == "person" and "FlagGems" in kept.provenance.note


def test_host_backing_drops_flaggems(repo):
    make(repo, "host_chip", like="nvidia_h200", backing="cpu")
    made = load_descriptor(repo / "plats" / "host_chip")
    assert made.backing.device == "cpu" and made.kernels.flaggems is None
    table = route_table.load(repo / "plats" / "host_chip" / "routes.yaml")
    assert all("flaggems" not in r.candidates for r in table.ops.values())
    assert made.ci.runner_labels == ["ubuntu-latest"]


def test_rendered_descriptor_survives_a_round_trip_unchanged(repo):
    """kernel add edits platform.yaml with ruamel: the generated layout must be ruamel's own."""
    make(repo, "gpu_chip", like="nvidia_h200")
    text = (repo / "plats" / "gpu_chip" / "platform.yaml").read_text()
    dumper = render.yaml_dumper()
    buffer = io.StringIO()
    dumper.dump(dumper.load(text), buffer)
    assert buffer.getvalue() == text


def test_unvalidated_and_unrunnable_backing_warns(repo):
    report = make(repo, "npu_chip", like="ascend_910c")
    assert report.ok and any("not one the runtime drives" in w for w in report.warnings)


def test_templates_are_strict():
    template = render.environment().from_string("{{ missing }}")
    with pytest.raises(jinja2.UndefinedError):
        template.render()


def test_descriptor_model_is_the_source():
    descriptor = scaffold("acme_x1")
    text = render.render_descriptor(descriptor, None)
    data = yaml.safe_load(text)
    assert data["name"] == "acme_x1" and data["display_name"] == "Acme X1"
    assert data["kernels"]["vendor"] == {"module": "vendor_kernels.py", "ops": {EXAMPLE_OP: "relu"}}
