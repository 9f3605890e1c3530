"""Rendering a platform's files from the descriptor model and the jinja2 templates in templates/.

StrictUndefined everywhere: a template that names a value the code did not pass is an error at
render time, never an empty string in a generated file. Rendering is pure (no file is touched)
and deterministic (same inputs, same bytes), which is what makes re-running onboard idempotent.
"""

from __future__ import annotations

import importlib.metadata
import io
import json
import os
import textwrap
from functools import lru_cache
from typing import Any

import jinja2
from ruamel.yaml import YAML
from ruamel.yaml.comments import CommentedMap, CommentedSeq

from torch_fl.onboarding.layout import Layout
from torch_fl.platform.descriptor import PlatformDescriptor
from torch_fl.platform.versions import minor_line
from torch_fl.routing.table import RouteTable

README_ROUTE_ROWS = 40
"""Routes listed on the README page; a FlagGems-sized table is summarised, `routes show` has it all."""
CPU_TORCH_INDEX = "https://download.pytorch.org/whl/cpu"
DEFAULT_PYTHON = "3.12"


@lru_cache(maxsize=1)
def environment() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.PackageLoader("torch_fl.onboarding", "templates"),
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
        trim_blocks=True,
        lstrip_blocks=True,
        autoescape=False,
    )
    env.filters["yaml_flow"] = yaml_flow
    env.filters["wrap"] = lambda text, width=96: textwrap.wrap(
        text, width, break_long_words=False, break_on_hyphens=False
    )
    env.filters["runs_on"] = lambda labels: labels[0] if len(labels) == 1 else yaml_flow(list(labels))
    # GitHub expressions use jinja's own braces; gh("always()") writes ${{ always() }}.
    env.globals["gh"] = lambda expression: "${{ " + expression + " }}"
    return env


def yaml_flow(value: Any) -> str:
    """A scalar or a list as one line of YAML (JSON is YAML, and quotes every string safely)."""
    return json.dumps(value, ensure_ascii=False)


def yaml_dumper() -> YAML:
    """The layout torch-fl's YAML files use (that of routes.yaml), so round-trip edits change only what they must."""
    yaml = YAML()
    yaml.indent(mapping=2, sequence=4, offset=2)
    # No re-wrapping: ruamel would re-flow every long line of a hand-written file it round-trips.
    yaml.width = 4096
    yaml.preserve_quotes = True
    return yaml


def _prune(value: Any) -> Any:
    """Drop empty mappings (every one is an optional field at its default) so the file shows only what is said."""
    if isinstance(value, dict):
        pruned = {k: _prune(v) for k, v in value.items()}
        return {k: v for k, v in pruned.items() if v != {}}
    return value


def _node(value: Any) -> Any:
    """Plain data -> ruamel nodes: lists of words on one line (`dtypes: [float32, ...]`), the rest in blocks."""
    if isinstance(value, dict):
        node = CommentedMap((k, _node(v)) for k, v in value.items())
        if not value:
            node.fa.set_flow_style()
        return node
    if isinstance(value, list):
        node = CommentedSeq(_node(v) for v in value)
        if all(not isinstance(v, (dict, list)) and " " not in str(v) for v in value):
            node.fa.set_flow_style()
        return node
    return value


def yaml_block(data: dict[str, Any]) -> str:
    buffer = io.StringIO()
    yaml_dumper().dump(_node(data), buffer)
    return buffer.getvalue().rstrip("\n")


def render_descriptor(descriptor: PlatformDescriptor, like: str | None) -> str:
    data = _prune(descriptor.model_dump(mode="json", exclude_none=True))

    def section(*keys: str) -> str:
        return yaml_block({k: data[k] for k in keys if k in data})

    return (
        environment()
        .get_template("platform.yaml.j2")
        .render(d=descriptor, like=like, section=section, has=lambda key: key in data)
    )


def render_vendor_module(descriptor: PlatformDescriptor, example_op: str | None, example_function: str | None) -> str:
    """The vendor module; without an example it is the header alone (where `kernel add` creates it)."""
    return (
        environment()
        .get_template("vendor_kernels.py.j2")
        .render(d=descriptor, example_op=example_op, example_function=example_function)
    )


def render_stub(op: str, function: str, schema: str) -> str:
    """The stub `torch-fl kernel add` appends: delegates to the op's own aten kernel on backing tensors."""
    namespace, _, rest = op.partition("::")
    packet, _, overload = rest.partition(".")
    return (
        environment()
        .get_template("vendor_stub.py.j2")
        .render(
            op=op, function=function, schema=schema, namespace=namespace, packet=packet, overload=overload or "default"
        )
    )


def torch_install(descriptor: PlatformDescriptor) -> str:
    """The pip arguments installing torch in CI: a pinned CPU wheel on a host backing, the spec otherwise."""
    if descriptor.backing.device != "cpu":
        return json.dumps("torch" + descriptor.requirements.torch.replace(" ", ""))
    try:
        line = minor_line(importlib.metadata.version("torch"))
    except importlib.metadata.PackageNotFoundError:
        # No torch here: pin the oldest line the descriptor accepts (">=2.11" -> 2.11).
        line = minor_line(descriptor.requirements.torch.lstrip("=<>~! "))
    return f'"torch=={line}.*" --index-url {CPU_TORCH_INDEX}'


def render_workflow(descriptor: PlatformDescriptor, layout: Layout) -> str:
    platform_rel = layout.relative(layout.platform_dir)
    watch = (
        [f"{platform_rel}/**", layout.relative(layout.workflow_path)] if layout.inside_root(layout.platform_dir) else []
    )
    python = descriptor.environment.python or DEFAULT_PYTHON
    return (
        environment()
        .get_template("workflow.yml.j2")
        .render(
            d=descriptor,
            platform_rel=platform_rel,
            watch_paths=watch,
            platform_path_env=layout.platform_path_env(),
            hosted="self-hosted" not in descriptor.ci.runner_labels,
            python=python,
            torch_install=torch_install(descriptor),
            torch_fl_install=layout.torch_fl_install(),
        )
    )


def render_readme(
    descriptor: PlatformDescriptor, table: RouteTable, layout: Layout, like: str | None, example_op: str
) -> str:
    routes = sorted(table.ops.items())
    # A path relative to the repository root where possible: the page is committed with the platform.
    path_export = None
    if not layout.in_checkout:
        relative = layout.relative(layout.platforms_dir)
        path_export = (
            f'"$PWD/{relative}"    # from the repository root' if layout.inside_root(layout.platforms_dir) else relative
        )
    workflow_rel = os.path.relpath(layout.workflow_path, layout.platform_dir)
    return (
        environment()
        .get_template("README.md.j2")
        .render(
            d=descriptor,
            like=like,
            kernel_sets=list(descriptor.kernels.declared()),
            routes=routes[:README_ROUTE_ROWS],
            more_routes=max(0, len(routes) - README_ROUTE_ROWS),
            workflow_rel=workflow_rel,
            path_export=path_export,
            example_op=example_op,
        )
    )
