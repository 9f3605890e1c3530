"""The published JSON Schema is generated from the models, committed, and agrees with them."""

from __future__ import annotations

import json

import jsonschema
import pytest
import yaml

from torch_fl.platform.discovery import discover
from torch_fl.platform.schema import SCHEMA_FILE, descriptor_json_schema, schema_text, write_schema


def test_committed_schema_equals_generated():
    assert SCHEMA_FILE.read_text() == schema_text(), "run torch_fl.platform.schema.write_schema() and commit"


def test_write_schema_writes_the_generated_text(tmp_path):
    path = write_schema(tmp_path / "s.json")
    assert json.loads(path.read_text()) == descriptor_json_schema()


def test_schema_is_valid_draft_2020_12():
    schema = descriptor_json_schema()
    assert schema["$schema"].endswith("2020-12/schema")
    jsonschema.Draft202012Validator.check_schema(schema)


def test_schema_closes_every_object():
    schema = descriptor_json_schema()
    assert schema["additionalProperties"] is False
    for name, definition in schema["$defs"].items():
        if definition.get("type") == "object":
            assert definition.get("additionalProperties") is False, name


@pytest.mark.parametrize("name", sorted(discover()))
def test_shipped_descriptors_validate_against_the_schema(name):
    data = yaml.safe_load((discover()[name].descriptor_path).read_text())
    jsonschema.Draft202012Validator(descriptor_json_schema()).validate(data)


def test_schema_rejects_what_the_model_rejects():
    validator = jsonschema.Draft202012Validator(descriptor_json_schema())
    data = yaml.safe_load(discover()["host_ref"].descriptor_path.read_text())
    data["backing"]["device"] = "gpu"
    assert not validator.is_valid(data)
    data["backing"]["device"] = "cpu"
    data["routes"]["overrides"] = {"torch.add": ["cpu"]}
    assert not validator.is_valid(data)
