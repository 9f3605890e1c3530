"""A broken descriptor fails with `file:line: field.path: expected ...; got ...`, and nothing half-loads."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import pytest
from pydantic import ValidationError

from torch_fl.platform import DescriptorError, PlatformDescriptor, load_descriptor, validate_op_names
from torch_fl.platform.discovery import shipped_root

BASE = (shipped_root() / "host_ref" / "platform.yaml").read_text()


def write(tmp_path: Path, text: str, name: str = "host_ref") -> Path:
    folder = tmp_path / "platforms" / name
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "platform.yaml"
    path.write_text(text)
    return path


def line_of(text: str, needle: str) -> int:
    return next(i for i, line in enumerate(text.splitlines(), 1) if needle in line)


def error_for(tmp_path: Path, text: str, name: str = "host_ref") -> DescriptorError:
    path = write(tmp_path, text, name)
    with pytest.raises(DescriptorError) as info:
        load_descriptor(path)
    return info.value


def test_base_descriptor_loads(tmp_path):
    descriptor = load_descriptor(write(tmp_path, BASE).parent)
    assert isinstance(descriptor, PlatformDescriptor)
    assert descriptor.source_path == tmp_path / "platforms" / "host_ref" / "platform.yaml"


def test_wrong_enum_value_names_file_line_field_and_choices(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    text = BASE.replace("device: cpu", "device: gpu")
    err = error_for(tmp_path, text)
    assert err.line == line_of(text, "device: gpu")
    assert err.field == "backing.device"
    assert str(err).startswith(
        f"platforms/host_ref/platform.yaml:{err.line}: backing.device: expected one of 'cpu', 'cuda'"
    )
    assert str(err).endswith("got 'gpu'")


def test_wrong_type_is_not_coerced(tmp_path):
    text = BASE.replace("virtual_devices: 2", 'virtual_devices: "2"')
    err = error_for(tmp_path, text)
    assert (err.line, err.field) == (line_of(text, "virtual_devices"), "backing.virtual_devices")
    assert "expected an integer; got '2'" in err.message


def test_unquoted_version_number_gets_a_hint(tmp_path):
    text = BASE.replace('python: ">=3.10"', "python: 3.10")
    err = error_for(tmp_path, text)
    assert err.field == "requirements.python"
    assert "got 3.1" in err.message and "quote it" in err.message


def test_unknown_field_is_named(tmp_path):
    text = BASE.replace("  virtual_devices: 2\n", "  virtual_devices: 2\n  colour: red\n")
    err = error_for(tmp_path, text)
    assert (err.line, err.field) == (line_of(text, "colour"), "backing.colour")
    assert err.message == "unknown field 'colour'"


def test_missing_field_points_at_the_parent_mapping(tmp_path):
    text = BASE.replace("  device: cpu\n", "")
    err = error_for(tmp_path, text)
    assert (err.line, err.field) == (line_of(text, "backing:"), "backing.device")
    assert err.message == "missing required field 'device'"


def test_missing_top_level_field(tmp_path):
    err = error_for(tmp_path, BASE.replace("vendor: torch-fl\n", ""))
    assert err.field == "vendor" and "missing required field" in err.message


def test_bad_yaml_syntax_names_the_parser_line(tmp_path):
    text = BASE.replace("  rules:\n", "  rules: [\n")
    err = error_for(tmp_path, text)
    assert "invalid YAML" in err.message
    assert err.line is not None and err.line > line_of(text, "rules: [")


def test_duplicate_key_is_a_syntax_error(tmp_path):
    err = error_for(tmp_path, BASE.replace("vendor: torch-fl\n", "vendor: torch-fl\nvendor: other\n"))
    assert "duplicate key" in err.message


def test_unknown_kernel_set_in_routes(tmp_path):
    text = BASE.replace("defaults: [native, cpu]", "defaults: [native, flaggems, cpu]")
    err = error_for(tmp_path, text)
    assert err.field == "routes.defaults[1]"
    assert err.line == line_of(text, "defaults: [native, flaggems")
    assert err.message.startswith("unknown kernel set 'flaggems'")


def test_unknown_kernel_set_in_an_override(tmp_path):
    text = BASE.replace("defaults: [native, cpu]", "defaults: [native, cpu]\n  overrides:\n    aten::mm: [vendor, cpu]")
    err = error_for(tmp_path, text)
    assert err.field == 'routes.overrides["aten::mm"][0]'
    assert err.line == line_of(text, "aten::mm")


def test_kernel_set_name_that_does_not_exist(tmp_path):
    err = error_for(tmp_path, BASE.replace("defaults: [native, cpu]", "defaults: [native, fastest]"))
    assert err.field == "routes.defaults[1]" and "got 'fastest'" in err.message


def test_bad_op_name(tmp_path):
    text = BASE.replace("defaults: [native, cpu]", "defaults: [native, cpu]\n  overrides:\n    torch.add: [cpu]")
    err = error_for(tmp_path, text)
    assert err.field == 'routes.overrides["torch.add"]'
    assert err.line == line_of(text, "torch.add")
    assert "bad op name 'torch.add'" in err.message


@pytest.mark.parametrize("rule", ["{always: true, env: X}", "{colour: red}"])
def test_a_rule_has_exactly_one_kind(tmp_path, rule):
    err = error_for(tmp_path, BASE.replace("- always: true", f"- {rule}"))
    assert err.field == "detect.rules[0]" and "exactly one of" in err.message


def test_rule_value_errors_name_the_rule_field(tmp_path):
    err = error_for(tmp_path, BASE.replace("- always: true", "- cuda_device_name: '(['"))
    assert err.field == "detect.rules[0].cuda_device_name" and "regular expression" in err.message


def test_amp_dtype_must_be_a_dtype(tmp_path):
    text = BASE.replace("float64, float32, float16, bfloat16,", "float64, float32, bfloat16,")
    err = error_for(tmp_path, text)
    assert err.field == "capabilities.amp_dtypes[1]" and "'float16' is not in capabilities.dtypes" in err.message


def test_virtual_devices_only_on_cpu(tmp_path):
    err = error_for(tmp_path, BASE.replace("device: cpu", "device: cuda"))
    assert err.field == "backing.virtual_devices"


def test_cpu_backing_defaults_to_two_virtual_devices(tmp_path):
    descriptor = load_descriptor(write(tmp_path, BASE.replace("  virtual_devices: 2\n", "")))
    assert descriptor.backing.virtual_devices == 2


def test_name_must_equal_the_folder(tmp_path):
    err = error_for(tmp_path, BASE, name="other_chip")
    assert err.field == "name" and "'other_chip'" in err.message and "got 'host_ref'" in err.message


def test_every_problem_is_reported_one_per_line(tmp_path):
    err = error_for(tmp_path, BASE.replace("device: cpu", "device: gpu").replace("vendor: torch-fl", "vendor: 3"))
    assert len(err.issues) == 2
    assert [i.loc for i in err.issues] == [("vendor",), ("backing", "device")]
    assert len(str(err).splitlines()) == 2


def test_top_level_must_be_a_mapping(tmp_path):
    err = error_for(tmp_path, "- just\n- a list\n")
    assert err.line == 1


def test_missing_file(tmp_path):
    with pytest.raises(DescriptorError, match="cannot read"):
        load_descriptor(tmp_path / "nowhere" / "platform.yaml")


def test_loaded_model_is_immutable(tmp_path):
    descriptor = load_descriptor(write(tmp_path, BASE))
    with pytest.raises(ValidationError):
        descriptor.name = "x"  # type: ignore[misc]


def test_validate_op_names_against_torch(tmp_path, monkeypatch):
    if importlib.util.find_spec("torch") is None:
        pytest.skip("torch is not installed")
    monkeypatch.setenv("TORCH_DEVICE_BACKEND_AUTOLOAD", os.environ.get("TORCH_DEVICE_BACKEND_AUTOLOAD", "0"))
    text = BASE.replace(
        "defaults: [native, cpu]",
        "defaults: [native, cpu]\n  overrides:\n    aten::add.Tensor: [cpu]\n    aten::mm: [cpu]\n    aten::add.NoSuch: [cpu]\n    aten::not_an_op: [cpu]",
    )
    descriptor = load_descriptor(write(tmp_path, text))
    with pytest.raises(DescriptorError) as info:
        validate_op_names(descriptor)
    err = info.value
    assert [i.loc for i in err.issues] == [
        ("routes", "overrides", "aten::add.NoSuch"),
        ("routes", "overrides", "aten::not_an_op"),
    ]
    assert err.line == line_of(text, "aten::add.NoSuch")
    assert "unknown op 'aten::add.NoSuch'" in err.message


def test_validate_op_names_accepts_real_ops(tmp_path, monkeypatch):
    if importlib.util.find_spec("torch") is None:
        pytest.skip("torch is not installed")
    monkeypatch.setenv("TORCH_DEVICE_BACKEND_AUTOLOAD", os.environ.get("TORCH_DEVICE_BACKEND_AUTOLOAD", "0"))
    text = BASE.replace(
        "defaults: [native, cpu]",
        "defaults: [native, cpu]\n  overrides:\n    aten::add.Tensor: [cpu]\n    aten::mm: [cpu]",
    )
    validate_op_names(load_descriptor(write(tmp_path, text)))
