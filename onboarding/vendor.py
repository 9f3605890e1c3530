"""`torch-fl kernel add`: give a platform a vendor kernel for one aten op, in three coordinated edits.

1. the vendor module gets a stub function (delegating to the op's own aten kernel on the backing
   tensors, marked to be replaced), unless a function of that name is already there;
2. routes.yaml gets `vendor` first in the op's candidates (comments kept: the table's own saver);
3. platform.yaml maps the op to the function in kernels.vendor.ops (ruamel round trip: comments
   and layout kept).
Everything is computed and validated first; the files are then written atomically, descriptor last,
so the descriptor never names a function the module does not have. Re-running changes nothing.

On a platform made by `torch-fl onboard`, the edit is kept in its manifest too (`options.kernels`),
with the new hashes of the files that were still onboard's own: a later `onboard` renders the same
edits, so it reports those files unchanged, and still tells a person's edits apart. The command
holds the platform's onboard lock while it works.
"""

from __future__ import annotations

import ast
import builtins
import io
import keyword
import re
import tempfile
from contextlib import nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ruamel.yaml.comments import CommentedMap

from torch_fl.fileio import remove_orphans
from torch_fl.onboarding.descriptor import VENDOR_MODULE, load_text
from torch_fl.onboarding.errors import OnboardError
from torch_fl.onboarding.render import render_stub, render_vendor_module, yaml_dumper
from torch_fl.onboarding.routes import HEADER, vendor_first
from torch_fl.onboarding.writer import Manifest, Outcome, Planned, apply, digest, locked, write_atomically
from torch_fl.platform.descriptor import OP_NAME_PATTERN
from torch_fl.platform.discovery import discover
from torch_fl.platform.errors import DescriptorError
from torch_fl.platform.loader import DESCRIPTOR_FILE, load_descriptor
from torch_fl.routing import table as route_table
from torch_fl.routing.table import OpRoute, Provenance


@dataclass(frozen=True)
class KernelEntry:
    """One vendor kernel added by `kernel add`: what the onboard manifest keeps so onboard redoes it."""

    op: str
    function: str
    schema: str

    @classmethod
    def read(cls, data: Any) -> KernelEntry:
        try:
            return cls(str(data["op"]), str(data["function"]), str(data["schema"]))
        except (KeyError, TypeError):
            raise OnboardError(f"the onboard manifest has a malformed kernels entry {str(data)[:200]!r}") from None


def kernel_entries(manifest: Manifest) -> list[KernelEntry]:
    """The vendor kernels `kernel add` gave an onboarded platform, in the order they were added."""
    return [KernelEntry.read(k) for k in manifest.options.get("kernels") or []]


@dataclass(frozen=True)
class KernelFiles:
    """The three files a vendor kernel touches, as text (routes None: no table yet)."""

    module: str
    routes: str | None
    descriptor: str


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
        raise OnboardError(
            f"bad op name {op!r}: expected aten::name or aten::name.overload (e.g. aten::silu, aten::add.Tensor)"
        )
    return name


def op_schema(op: str, backing: str) -> str:
    """The op's schema from the installed torch. An op torch does not have is refused naming the
    nearest overloads that reach the device, and so is one torch decomposes before it reaches a
    device (naming what it decomposes into)."""
    import torch

    # imports torch: only this command needs it
    from torch_fl.kernels.base import resolve
    from torch_fl.onboarding.overloads import decomposes_into, nearest, reaches_device

    try:
        overload = resolve(op)
    except AttributeError:
        raise OnboardError(
            f"{op}: torch {torch.__version__} has no such operator or overload"
            + _suggest("nearest overloads that reach the device", nearest(op, backing))
        ) from None
    if not reaches_device(op, backing):
        parts = decomposes_into(overload)
        raise OnboardError(
            f"{op} is decomposed by torch above the device (CompositeImplicitAutograd), so a flagos kernel for it "
            "would never run; add kernels for the overloads it reaches instead (`torch-fl routes stats NAME` lists "
            "those a program sends to the device)"
            + (
                _suggest("for one traced call it decomposes into", parts)
                if parts
                else _suggest("nearest overloads that reach the device", nearest(op, backing))
            )
        )
    return str(overload._schema)


def _suggest(what: str, names: list[str]) -> str:
    return f"; {what}: {', '.join(names)}" if names else ""


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
    imports_torch = any(
        isinstance(n, ast.Import) and any(a.name == "torch" and a.asname is None for a in n.names) for n in tree.body
    )
    return functions, imports_torch


def _edit_descriptor(text: str, op: str, function: str) -> str | None:
    """platform.yaml with `op: function` in kernels.vendor.ops; None when it is there already."""
    yaml = yaml_dumper()
    document = yaml.load(text)
    kernels = document.setdefault("kernels", CommentedMap())
    if kernels.get("vendor") is None:
        kernels["vendor"] = CommentedMap([("module", VENDOR_MODULE), ("ops", CommentedMap())])
    vendor = kernels["vendor"]
    if vendor.get("ops") is None:
        vendor["ops"] = CommentedMap()
    if vendor["ops"].get(op) == function:
        return None
    vendor["ops"][op] = function
    buffer = io.StringIO()
    yaml.dump(document, buffer)
    return buffer.getvalue()


def _routes_text(text: str | None, path: Path, op: str, platform: str) -> str | None:
    """routes.yaml (`text`, None when there is none) with `vendor` first for `op`, rendered by the
    table's own comment-keeping saver; None when it is so already."""
    table = route_table.parse(text, str(path)) if text is not None else route_table.RouteTable()
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
        if text is not None:
            scratch.write_text(text, encoding="utf-8")
        route_table.save(table, scratch, header=HEADER.format(name=platform))
        return scratch.read_text(encoding="utf-8")


def with_kernel(
    files: KernelFiles, entry: KernelEntry, platform: str, folder: Path, module_name: str, routes_name: str
) -> KernelFiles:
    """`files` with the vendor kernel `entry` added: the stub (unless the module has the function),
    `vendor` first in the op's route, the op mapped in the descriptor; each result validated."""
    module_path = folder / module_name
    functions, imports_torch = _module_functions(files.module, module_path)
    module = files.module
    if entry.function not in functions:
        if not imports_torch:
            raise OnboardError(f"{module_path} does not `import torch`, which the stub needs; add it and re-run")
        module = files.module.rstrip("\n") + "\n" + render_stub(entry.op, entry.function, entry.schema)
        compile(module, str(module_path), "exec")
    descriptor = _edit_descriptor(files.descriptor, entry.op, entry.function)
    if descriptor is not None:
        load_text(descriptor, platform, "platform.yaml after the edit")
    routes = _routes_text(files.routes, folder / routes_name, entry.op, platform)
    return KernelFiles(
        module, files.routes if routes is None else routes, files.descriptor if descriptor is None else descriptor
    )


def _read(path: Path) -> str | None:
    return path.read_text(encoding="utf-8") if path.exists() else None


def _write(
    folder: Path,
    platform: str,
    entry: KernelEntry,
    changes: list[tuple[Path, str | None, str]],
    planned: list[Planned],
    outcomes: list[Outcome],
) -> None:
    """Write the changed files; on an onboarded platform through the manifest (see the module docstring)."""
    manifest = Manifest.read(folder)
    remove_orphans([item.path for item in planned] + [folder / ".onboard.json"])
    if manifest is None or manifest.platform != platform:
        for item, outcome in zip(planned, outcomes):
            if outcome.action != "unchanged":
                write_atomically(item.path, item.text)
        return
    files = dict(manifest.files)
    for path, old, new in changes:
        if old is None or manifest.wrote(path, old):  # still onboard's own: the edit keeps it so
            files[manifest.key(path)] = digest(new)
    kernels = [k for k in kernel_entries(manifest) if k.op != entry.op] + [entry]
    options = {**manifest.options, "kernels": [vars(k) for k in kernels]}
    apply(planned, outcomes, Manifest(folder, platform, options, files))


def _outcome(path: Path, new: str | None) -> Outcome:
    if new is None:
        return Outcome(path, "unchanged")
    return Outcome(path, "updated" if path.exists() else "created")


def add_vendor_kernel(request: KernelAddRequest) -> KernelAddReport:
    """Add (or confirm) the vendor kernel of `request.op` on `request.platform`."""
    sources = discover()
    if request.platform not in sources:
        raise OnboardError(f"unknown platform {request.platform!r}; known platforms: {', '.join(sources) or 'none'}")
    folder = Path(sources[request.platform].directory)
    with nullcontext() if request.dry_run else locked(folder):
        return _add(request, folder)


def _add(request: KernelAddRequest, folder: Path) -> KernelAddReport:
    try:
        descriptor = load_descriptor(folder)
    except DescriptorError as exc:
        raise OnboardError(f"fix the descriptor first: {exc}") from None
    op = normalize_op(request.op)
    schema = op_schema(op, descriptor.backing.device)
    vendor = descriptor.kernels.vendor
    mapped = vendor.ops.get(op) if vendor is not None else None
    if request.function is not None:
        function = _check_function(request.function)
        if mapped is not None and mapped != function:
            raise OnboardError(
                f"{op} is already mapped to {mapped!r} in kernels.vendor.ops; edit platform.yaml to rename it"
            )
    else:
        function = mapped or function_name(op)

    module_name = vendor.module if vendor is not None else VENDOR_MODULE
    if not module_name.endswith(".py"):
        raise OnboardError(
            f"the vendor module of {request.platform} is the package module {module_name!r}: add {function}() there and "
            f"map it in platform.yaml (kernels.vendor.ops) yourself; kernel add edits module files next to the descriptor"
        )
    module_path = folder / module_name
    module_text = (
        module_path.read_text(encoding="utf-8")
        if module_path.exists()
        else render_vendor_module(descriptor, None, None)
    )
    descriptor_path = folder / DESCRIPTOR_FILE
    routes_path = folder / descriptor.routes.file
    before = KernelFiles(module_text, _read(routes_path), descriptor_path.read_text(encoding="utf-8"))
    entry = KernelEntry(op, function, schema)
    after = with_kernel(before, entry, request.platform, folder, module_name, descriptor.routes.file)
    functions, _ = _module_functions(module_text, module_path)

    # module, routes, then the descriptor that names them
    changes = [
        (module_path, module_text if module_path.exists() else None, after.module),
        (routes_path, before.routes, after.routes),
        (descriptor_path, before.descriptor, after.descriptor),
    ]
    planned = [Planned(path, new) for path, _, new in changes]
    outcomes = [_outcome(path, None if old == new else new) for path, old, new in changes]
    if not request.dry_run:
        _write(folder, request.platform, entry, changes, planned, outcomes)
    steps = [
        f"implement {function}() in {module_path} (it receives and returns {descriptor.backing.device} tensors)",
        f"torch-fl conformance run {request.platform} --json",
        f"torch-fl routes explain {request.platform} {op} --json",
    ]
    return KernelAddReport(
        request.platform, folder, op, function, function not in functions, outcomes, steps, request.dry_run
    )
