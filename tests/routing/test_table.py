"""routes.yaml: parsing, errors that name the entry, and rewriting that keeps a person's comments."""

from __future__ import annotations

from pathlib import Path

import pytest

from torch_fl.routing.table import Bucket, OpRoute, RouteTable, RouteTableError, dumps, load, parse, save

TEXT = """\
# my routes: keep this comment
format: 1
ops:
  aten::mm:
    candidates: [native, flaggems]   # flaggems only where tuned
"""


def test_parse_and_bucket_lookup():
    table = parse(TEXT, "routes.yaml")
    route = table.ops["aten::mm"]
    assert route.candidates == ["native", "flaggems"]
    route = route.model_copy(
        update={"buckets": [Bucket(max_numel=16, choice="flaggems"), Bucket(max_numel=256, choice="native")]}
    )
    assert route.bucket_for(10).choice == "flaggems"
    assert route.bucket_for(200).choice == "native"
    assert route.bucket_for(1000) is None
    typed = route.model_copy(update={"buckets": [Bucket(max_numel=16, dtype="bfloat16", choice="flaggems")]})
    assert typed.bucket_for(10, "bfloat16").choice == "flaggems" and typed.bucket_for(10, "float32") is None


@pytest.mark.parametrize(
    "text, message",
    [
        (
            "format: 1\nops:\n  aten::mm:\n    candidates: [native, gpu]\n",
            "routes.yaml:4: ops[\"aten::mm\"].candidates[1]: unknown path 'gpu'",
        ),
        ("format: 1\nops:\n  aten::mm:\n    candidates: []\n", 'routes.yaml:4: ops["aten::mm"].candidates: '),
        (
            "format: 1\nops:\n  aten::mm:\n    candidate: [native]\n",
            'routes.yaml:4: ops["aten::mm"].candidate: unknown field',
        ),
        ("format: 1\nops: [\n", "routes.yaml:3: invalid YAML"),
    ],
)
def test_errors_name_the_file_and_entry(text, message):
    with pytest.raises(RouteTableError, match="routes.yaml") as info:
        parse(text, "routes.yaml")
    assert message in str(info.value)


def test_missing_file_is_an_empty_table(tmp_path: Path):
    assert load(tmp_path / "routes.yaml").ops == {}


def test_save_keeps_comments_and_adds_buckets(tmp_path: Path):
    path = tmp_path / "routes.yaml"
    path.write_text(TEXT)
    table = load(path)
    table.ops["aten::mm"] = table.ops["aten::mm"].model_copy(
        update={"buckets": [Bucket(max_numel=4096, choice="flaggems", measured_us={"native": 9.0, "flaggems": 5.0})]}
    )
    table.ops["aten::add.Tensor"] = OpRoute(candidates=["native"])
    save(table, path)
    text = path.read_text()
    assert "# my routes: keep this comment" in text and "# flaggems only where tuned" in text
    again = load(path)
    assert again.ops["aten::mm"].buckets[0].choice == "flaggems"
    assert again.ops["aten::add.Tensor"].candidates == ["native"]


def test_new_file_gets_the_header_and_compact_lists(tmp_path: Path):
    path = tmp_path / "routes.yaml"
    save(RouteTable(ops={"aten::mm": OpRoute(candidates=["native", "cpu"])}), path, header="# header\n")
    text = path.read_text()
    assert text.startswith("# header\n") and "candidates: [native, cpu]" in text
    assert dumps(load(path)).count("candidates") == 1
