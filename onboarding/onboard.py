"""`torch-fl onboard`: from a chip name to a platform folder, validated before anything is written.

Order of work: check the name and the options, build the descriptor model, render every file in
memory, validate each rendered file the way its consumer will read it (load_descriptor, the route
table parser, the Python compiler, a YAML parser), decide each file's action against the manifest,
and only then write. A refused request writes nothing.

A run (not a dry run) holds the platform's lock (writer.locked) from reading the manifest to
writing it, and first removes the temporary files an interrupted run left beside its files.
The vendor kernels `torch-fl kernel add` gave the platform (the manifest's `options.kernels`) are
added to what is rendered, so a re-run after `kernel add` is unchanged, whatever `--like` it takes.
"""

from __future__ import annotations

import os
import shlex
from contextlib import nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from torch_fl import env
from torch_fl.fileio import remove_orphans
from torch_fl.onboarding import render
from torch_fl.onboarding.descriptor import (
    EXAMPLE_FUNCTION,
    EXAMPLE_OP,
    backing_warning,
    like_backing_warning,
    load_text,
    machine_backing_warning,
    scaffold,
)
from torch_fl.onboarding.errors import OnboardError
from torch_fl.onboarding.layout import Layout, make_layout, same_dir
from torch_fl.onboarding.names import check_name
from torch_fl.onboarding.routes import initial_table, render_table
from torch_fl.onboarding.vendor import KernelFiles, kernel_entries, with_kernel
from torch_fl.onboarding.writer import (
    Manifest,
    Outcome,
    Planned,
    apply,
    decide,
    locked,
    manifest_outcome,
    with_hashes,
)
from torch_fl.platform.descriptor import PlatformDescriptor
from torch_fl.platform.discovery import PlatformSource, discover
from torch_fl.platform.errors import DescriptorError
from torch_fl.platform.loader import DESCRIPTOR_FILE, load_descriptor
from torch_fl.routing.table import RouteTableError
from torch_fl.routing.table import parse as parse_routes

BACKINGS = ("cpu", "cuda")


@dataclass(frozen=True)
class OnboardRequest:
    chip: str
    like: str | None = None
    backing: str | None = None
    root: Path | None = None
    platforms_dir: Path | None = None
    force: bool = False
    dry_run: bool = False


@dataclass
class OnboardReport:
    platform: str
    layout: Layout
    files: list[Outcome]
    next_steps: list[str]
    warnings: list[str] = field(default_factory=list)
    dry_run: bool = False

    @property
    def ok(self) -> bool:
        return all(f.action != "skipped-edited" for f in self.files)

    def as_dict(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "platform": self.platform,
            "directory": str(self.layout.platform_dir.resolve()),
            "dry_run": self.dry_run,
            "files": [f.as_dict(self.layout.root) for f in self.files],
            "warnings": self.warnings,
            "next_steps": self.next_steps,
        }


def _check_free(name: str, layout: Layout, sources: dict[str, PlatformSource], owned: bool, force: bool) -> None:
    """A name that is taken may only be reused by re-running onboard on its own folder, or with --force."""
    if owned or force:
        return
    if (layout.platform_dir / DESCRIPTOR_FILE).exists():
        raise OnboardError(
            f"{layout.platform_dir} already holds a platform.yaml that onboard did not write; "
            "choose another name, or pass --force to overwrite it"
        )
    if name in sources:
        raise OnboardError(
            f"platform {name!r} already exists ({sources[name].origin}: {sources[name].directory}); "
            "choose another name, or pass --force to create one that overrides it"
        )


def _load_like(like: str, name: str, sources: dict[str, PlatformSource]) -> PlatformDescriptor:
    if like == name:
        raise OnboardError(f"--like {like}: a platform cannot start from itself")
    if like not in sources:
        raise OnboardError(f"--like {like}: unknown platform; known platforms: {', '.join(sources) or 'none'}")
    try:
        return load_descriptor(sources[like].directory)
    except DescriptorError as exc:
        raise OnboardError(f"--like {like}: its descriptor is invalid: {exc}") from None


def _validate(files: dict[str, str], descriptor: PlatformDescriptor, where: Layout) -> None:
    """Read each rendered file as its consumer will; a failure here is a bug in a template."""
    loaded = load_text(files["platform.yaml"], descriptor.name, "the rendered platform.yaml")
    if loaded.model_dump() != descriptor.model_dump():
        raise OnboardError("the rendered platform.yaml does not say what the descriptor model says")
    try:
        parse_routes(files["routes.yaml"], str(where.platform_dir / "routes.yaml"))
    except RouteTableError as exc:
        raise OnboardError(f"the rendered routes.yaml is invalid: {exc}") from None
    try:
        compile(files["vendor_kernels.py"], "vendor_kernels.py", "exec")
    except SyntaxError as exc:
        raise OnboardError(f"the rendered vendor module does not compile: {exc}") from None
    workflow = yaml.safe_load(files["workflow"])
    if not isinstance(workflow, dict) or "jobs" not in workflow:
        raise OnboardError("the rendered workflow is not a GitHub Actions workflow")


def _path_prefix(layout: Layout) -> str:
    """`FLAGOS_PLATFORM_PATH=... ` when discovery would not find the platform without it."""
    if layout.in_checkout:
        return ""
    entries = [Path(e).expanduser() for e in (env.get("FLAGOS_PLATFORM_PATH") or "").split(os.pathsep) if e]
    if any(same_dir(e, layout.platforms_dir) or same_dir(e, layout.platform_dir) for e in entries if e.exists()):
        return ""
    return f"FLAGOS_PLATFORM_PATH={shlex.quote(str(layout.platforms_dir.resolve()))} "


def next_steps(name: str, layout: Layout) -> list[str]:
    prefix = _path_prefix(layout)
    return [
        f"{prefix}torch-fl platforms show {name} --json",
        f"{prefix}torch-fl preflight {name} --json",
        f"{prefix}torch-fl kernel add {name} --op aten::silu --json",
        f"{prefix}torch-fl conformance run {name} --json",
        f"{prefix}torch-fl triage {name} --json",
        f"FLAGOS_PLATFORM={name} {prefix}python examples/train_demo.py --steps 5",
    ]


def onboard(request: OnboardRequest) -> OnboardReport:
    """Create or refresh the platform folder of `request.chip`; raises OnboardError before writing on a bad request."""
    name = check_name(request.chip, discover())
    if request.backing is not None and request.backing not in BACKINGS:
        raise OnboardError(f"--backing {request.backing}: expected one of {', '.join(BACKINGS)}")
    layout = make_layout(name, request.root, request.platforms_dir)
    if layout.platform_dir.exists() and not layout.platform_dir.is_dir():
        raise OnboardError(f"{layout.platform_dir} exists and is not a folder")
    with nullcontext() if request.dry_run else locked(layout.platform_dir):
        return _onboard(name, request, layout)


def _with_kernels(
    files: dict[str, str], descriptor: PlatformDescriptor, manifest: Manifest | None, folder: Path
) -> None:
    """Add the vendor kernels of `kernel add` (kept in the manifest) to the rendered files, as it did."""
    vendor = descriptor.kernels.vendor
    entries = kernel_entries(manifest) if manifest is not None else []
    if not entries or vendor is None:
        return
    texts = KernelFiles(files["vendor_kernels.py"], files["routes.yaml"], files["platform.yaml"])
    for entry in entries:
        texts = with_kernel(texts, entry, descriptor.name, folder, vendor.module, descriptor.routes.file)
    files.update({"vendor_kernels.py": texts.module, "platform.yaml": texts.descriptor})
    files["routes.yaml"] = texts.routes or files["routes.yaml"]


def _onboard(name: str, request: OnboardRequest, layout: Layout) -> OnboardReport:
    manifest = Manifest.read(layout.platform_dir)
    owned = manifest is not None and manifest.platform == name
    sources = discover()
    _check_free(name, layout, sources, owned, request.force)

    # A re-run without options repeats the first run's choices, so it is idempotent as typed.
    recorded = manifest.options if owned and manifest is not None else {}
    like_name = request.like if request.like is not None else recorded.get("like")
    # a new --like brings its own backing unless --backing is given: the first run's is not kept
    like_changed = request.like is not None and request.like != recorded.get("like")
    backing = request.backing if request.backing is not None else None if like_changed else recorded.get("backing")
    like = _load_like(like_name, name, sources) if like_name else None
    descriptor = scaffold(name, like, backing)
    table = initial_table(descriptor, like)

    files = {
        "platform.yaml": render.render_descriptor(descriptor, like_name),
        "vendor_kernels.py": render.render_vendor_module(descriptor, EXAMPLE_OP, EXAMPLE_FUNCTION),
        "routes.yaml": render_table(descriptor, table),
        "README.md": render.render_readme(descriptor, table, layout, like_name, EXAMPLE_OP),
        "workflow": render.render_workflow(descriptor, layout),
    }
    _validate(files, descriptor, layout)
    folder = layout.platform_dir
    _with_kernels(files, descriptor, manifest if owned else None, folder)
    planned = [
        Planned(folder / "platform.yaml", files["platform.yaml"]),
        Planned(folder / descriptor.kernels.vendor.module, files["vendor_kernels.py"]),
        Planned(folder / descriptor.routes.file, files["routes.yaml"]),
        Planned(folder / "README.md", files["README.md"]),
        Planned(layout.workflow_path, files["workflow"]),
    ]
    options = {"like": like_name, "backing": descriptor.backing.device}
    if "kernels" in recorded:
        options["kernels"] = recorded["kernels"]
    base = manifest if owned and manifest is not None else Manifest(folder, name)
    base.options = options
    outcomes = decide(planned, base, request.force)
    updated = with_hashes(base, planned, outcomes)
    outcomes.append(manifest_outcome(updated))  # decided before writing, like every other file
    if not request.dry_run:
        remove_orphans([item.path for item in planned] + [updated.path])
        apply(planned, outcomes, updated)
    checks = (backing_warning(descriptor), machine_backing_warning(descriptor), like_backing_warning(descriptor, like))
    warnings = [w for w in checks if w]
    return OnboardReport(name, layout, outcomes, next_steps(name, layout), warnings, request.dry_run)
