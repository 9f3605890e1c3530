"""`torch-fl kernel add`: give a platform a vendor kernel for one aten op, in three coordinated edits.

1. the vendor module gets a stub function (delegating to the op's own aten kernel on the backing
   tensors, marked to be replaced), unless a function of that name is already there;
2. routes.yaml gets `vendor` first in the op's candidates (comments kept: the table's own saver);
3. platform.yaml maps the op to the function in kernels.vendor.ops (ruamel round trip: comments
   and layout kept).
Everything is computed and validated first; the files are then written atomically, descriptor last,
so the descriptor never names a function the module does not have. Re-running changes nothing.
"""
from __future__ import annotations

import ast
import builtins
import io
import keyword
import re
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ruamel.yaml.comments import CommentedMap

from torch_fl.onboarding.descriptor import VENDOR_MODULE, load_text
from torch_fl.onboarding.errors import OnboardError
from torch_fl.onboarding.render import render_stub, render_vendor_module, yaml_dumper
from torch_fl.onboarding.routes import HEADER, vendor_first
from torch_fl.onboarding.writer import Outcome, write_atomically
from torch_fl.platform.descriptor import OP_NAME_PATTERN
from torch_fl.platform.discovery import discover
from torch_fl.platform.errors import DescriptorError
from torch_fl.platform.loader import DESCRIPTOR_FILE, load_descriptor
from torch_fl.routing import table as route_table
from torch_fl.routing.table import OpRoute, Provenance


@dataclass(frozen=True)
class KernelAddRequest:
    platform: str
    op: str
    function: str | None = None
    dry_run: bool = False


@dataclass
class KernelAddReport:
    platform: str
    directory: Path
    op: str
    function: str
    stub: bool
    files: list[Outcome]
    next_steps: list[str] = field(default_factory=list)
    dry_run: bool = False

    def as_dict(self) -> dict[str, Any]:
        return {
            "ok": True,
            "platform": self.platform,
            "directory": str(self.directory),
            "op": self.op,
            "function": self.function,
            "stub_added": self.stub,
            "dry_run": self.dry_run,
            "files": [f.as_dict(self.directory) for f in self.files],
            "next_steps": self.next_steps,
        }


def normalize_op(op: str) -> str:
    """`silu` / `aten::silu.default` -> `aten::silu`: the spelling routes and kernels.vendor.ops use."""
    name = op.strip()
    name = name if "::" in name else f"aten::{name}"
    name = name.removesuffix(".default")
    if not re.fullmatch(OP_NAME_PATTERN, name):
        raise OnboardError(f"bad op name {op!r}: expected aten::name or aten::name.overload (e.g. aten::silu, aten::add.Tensor)")
    return name


def op_schema(op: str) -> str:
    """The op's schema from the installed torch; an op torch does not have is refused."""
    from torch_fl.kernels.base import resolve  # imports torch: only this command needs it

    try:
        return str(resolve(op)._schema)
    except AttributeError:
        import torch

        raise OnboardError(f"{op}: torch {torch.__version__} has no such operator or overload") from None


def function_name(op: str) -> str:
    """`aten::add.Tensor` -> `add_tensor`; a name that would shadow a builtin or a keyword gets `_kernel`."""
    packet, _, overload = op.partition("::")[2].partition(".")
    name = f"{packet}_{overload.lower()}" if overload else packet
    if keyword.iskeyword(name) or hasattr(builtins, name):
        name += "_kernel"
    return name


def _check_function(name: str) -> str:
    if not name.isidentifier() or keyword.iskeyword(name):
        raise OnboardError(f"--function {name!r} is not a usable Python function name")
    return name


def _module_functions(text: str, path: Path) -> tuple[set[str], bool]:
    """Top-level function names of the module, and whether it imports torch (the stub needs it)."""
    try:
        tree = ast.parse(text, str(path))
    except SyntaxError as exc:
        raise OnboardError(f"{path} does not parse ({exc}); fix it before adding kernels") from None
    functions = {n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}
    imports_torch = any(isinstance(n, ast.Import) and any(a.name == "torch" and a.asname is None for a in n.names) for n in tree.body)
    return functions, imports_torch


def _edit_descriptor(text: str, op: str, function: str) -> str:
    yaml = yaml_dumper()
    document = yaml.load(text)
    kernels = document.setdefault("kernels", CommentedMap())
    if kernels.get("vendor") is None:
        kernels["vendor"] = CommentedMap([("module", VENDOR_MODULE), ("ops", CommentedMap())])
    vendor = kernels["vendor"]
    if vendor.get("ops") is None:
        vendor["ops"] = CommentedMap()
    vendor["ops"][op] = function
    buffer = io.StringIO()
    yaml.dump(document, buffer)
    return buffer.getvalue()


def _routes_text(path: Path, op: str, platform: str) -> str | None:
    """routes.yaml with `vendor` first for `op`, rendered by the table's own comment-keeping saver."""
    table = route_table.load(path)
    current = table.ops.get(op)
    candidates = vendor_first(list(current.candidates) if current else ["native"])
    if current is not None and current.candidates == candidates:
        return None
    provenance = Provenance(source="onboard", note="torch-fl kernel add")
    table.ops[op] = OpRoute(candidates=candidates, provenance=provenance, buckets=current.buckets if current else [])
    # route_table.save writes a file; run it on a private copy so nothing real changes before every
    # edit is validated (and never in a dry run).
    with tempfile.TemporaryDirectory(prefix="torch-fl-kernel-add-") as tmp:
        scratch = Path(tmp) / path.name
        if path.exists():
            shutil.copyfile(path, scratch)
        route_table.save(table, scratch, header=HEADER.format(name=platform))
        return scratch.read_text(encoding="utf-8")


def _outcome(path: Path, new: str | None) -> Outcome:
    if new is None:
        return Outcome(path, "unchanged")
    return Outcome(path, "updated" if path.exists() else "created")


def add_vendor_kernel(request: KernelAddRequest) -> KernelAddReport:
    """Add (or confirm) the vendor kernel of `request.op` on `request.platform`."""
    sources = discover()
    if request.platform not in sources:
        raise OnboardError(f"unknown platform {request.platform!r}; known platforms: {', '.join(sources) or 'none'}")
    folder = sources[request.platform].directory
    try:
        descriptor = load_descriptor(folder)
    except DescriptorError as exc:
        raise OnboardError(f"fix the descriptor first: {exc}") from None
    op = normalize_op(request.op)
    schema = op_schema(op)
    vendor = descriptor.kernels.vendor
    mapped = vendor.ops.get(op) if vendor is not None else None
    if request.function is not None:
        function = _check_function(request.function)
        if mapped is not None and mapped != function:
            raise OnboardError(f"{op} is already mapped to {mapped!r} in kernels.vendor.ops; edit platform.yaml to rename it")
    else:
        function = mapped or function_name(op)

    module_name = vendor.module if vendor is not None else VENDOR_MODULE
    if not module_name.endswith(".py"):
        raise OnboardError(
            f"the vendor module of {request.platform} is the package module {module_name!r}: add {function}() there and "
            f"map it in platform.yaml (kernels.vendor.ops) yourself; kernel add edits module files next to the descriptor"
        )
    module_path = folder / module_name
    module_text = module_path.read_text(encoding="utf-8") if module_path.exists() else render_vendor_module(descriptor, None, None)
    functions, imports_torch = _module_functions(module_text, module_path)
    new_module: str | None = None
    if function not in functions:
        if not imports_torch:
            raise OnboardError(f"{module_path} does not `import torch`, which the stub needs; add it and re-run")
        new_module = module_text.rstrip("\n") + "\n" + render_stub(op, function, schema)
        compile(new_module, str(module_path), "exec")

    descriptor_path = folder / DESCRIPTOR_FILE
    new_descriptor: str | None = None
    if mapped != function:
        new_descriptor = _edit_descriptor(descriptor_path.read_text(encoding="utf-8"), op, function)
        load_text(new_descriptor, request.platform, "platform.yaml after the edit")
    routes_path = folder / descriptor.routes.file
    new_routes = _routes_text(routes_path, op, request.platform)

    planned = [(module_path, new_module), (routes_path, new_routes), (descriptor_path, new_descriptor)]
    outcomes = [_outcome(path, text) for path, text in planned]
    if not request.dry_run:
        for path, text in planned:  # module, routes, then the descriptor that names them
            if text is not None:
                write_atomically(path, text)
    steps = [
        f"implement {function}() in {module_path} (it receives and returns {descriptor.backing.device} tensors)",
        f"torch-fl conformance run {request.platform} --json",
        f"torch-fl routes explain {request.platform} {op} --json",
    ]
    return KernelAddReport(request.platform, folder, op, function, function not in functions, outcomes, steps, request.dry_run)
