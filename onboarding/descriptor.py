"""The descriptor of a new platform, built as a PlatformDescriptor before any file is rendered.

With `--like`, the new chip starts from a known platform's claims (vendor, boards, kernel sets,
capabilities, CI setup): they are a starting point for conformance to confirm or refute, not facts
about the new chip, so the result is always `status: unvalidated` and has no detection rules (it
must never be picked on a machine by accident; FLAGOS_PLATFORM selects it). Without `--like` the
claims are the conservative defaults of the backing device.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

from torch_fl.onboarding.errors import OnboardError
from torch_fl.platform.descriptor import RUNTIME_BACKINGS, PlatformDescriptor
from torch_fl.platform.errors import DescriptorError
from torch_fl.platform.loader import DESCRIPTOR_FILE, load_descriptor
from torch_fl.platform.preflight import torch_cuda_version
from torch_fl.platform.record import installed_version

VENDOR_MODULE = "vendor_kernels.py"
EXAMPLE_OP = "aten::relu"
EXAMPLE_FUNCTION = "relu"
"""The one working example kernel every onboarded platform starts with (a simple elementwise op)."""

# What a chip claims before anything is measured: the common float and integer dtypes, bfloat16
# autocast, and no distributed/compile/profiler claims (each one is a conformance suite to pass).
_DEFAULT_DTYPES = ["float64", "float32", "float16", "bfloat16", "int64", "int32", "int16", "int8", "uint8", "bool"]


def display_name_of(name: str) -> str:
    """`acme_x1` -> `Acme X1`: a readable default, edited by the person who knows the product name."""
    return " ".join(
        part.upper() if part[:1].isdigit() or len(part) <= 2 else part.capitalize() for part in name.split("_")
    )


def runner_labels(name: str, backing: str) -> list[str]:
    """CI runner labels: GitHub's hosted runners serve a host-backed chip; a board needs its own runner."""
    return ["ubuntu-latest"] if backing == "cpu" else ["self-hosted", name.replace("_", "-")]


def _defaults(name: str, backing: str) -> dict[str, Any]:
    return {
        "schema_version": 1,
        "name": name,
        "display_name": display_name_of(name),
        "vendor": "unknown",
        "boards": [name],
        "status": "unvalidated",
        "backing": {"device": backing},
        "detect": {"priority": 0, "rules": []},
        "kernels": {"native": {"enabled": True}},
        "capabilities": {"dtypes": list(_DEFAULT_DTYPES), "amp_dtypes": ["bfloat16"], "rng": {"generator": "backing"}},
        "routes": {"file": "routes.yaml", "defaults": ["native", "cpu"]},
        "ci": {"runner_labels": runner_labels(name, backing), "setup": [], "timeout_minutes": 60},
        "requirements": {"torch": ">=2.11"},
        "notes": (
            f"Onboarded with `torch-fl onboard` on a {backing} backing. Every claim below is a default to be "
            "confirmed by `torch-fl conformance run`; set vendor, boards and detection rules for the real chip."
        ),
        "sources": ["torch-fl onboard defaults"],
    }


def _from_like(name: str, like: PlatformDescriptor, backing: str | None) -> dict[str, Any]:
    data = like.model_dump(mode="json", exclude_none=True)
    backing_device = backing or like.backing.device
    data.update(
        name=name,
        display_name=display_name_of(name),
        status="unvalidated",
        detect={"priority": like.detect.priority, "rules": []},
        notes=(
            f"Onboarded with `torch-fl onboard --like {like.name}`: vendor, boards, kernel sets and capabilities "
            f"are {like.name}'s until `torch-fl conformance run` on this chip says otherwise."
        ),
        sources=[f"platforms/{like.name}/platform.yaml (starting point, via torch-fl onboard --like)"],
    )
    if backing_device != like.backing.device:
        data["backing"] = {"device": backing_device}
    data["ci"] = {**data["ci"], "runner_labels": runner_labels(name, backing_device)}
    kernels = data.setdefault("kernels", {})
    if backing_device == "cpu":
        # FlagGems needs Triton on a GPU: on a host backing it can never run, so it is not claimed.
        kernels.pop("flaggems", None)
    declared = {"native", "cpu", "vendor"} | set(kernels)
    routes = data.setdefault("routes", {})
    routes["defaults"] = [s for s in routes.get("defaults", ["native", "cpu"]) if s in declared] or ["native", "cpu"]
    routes["overrides"] = {
        op: kept for op, sets in routes.get("overrides", {}).items() if (kept := [s for s in sets if s in declared])
    }
    if not routes["overrides"]:
        del routes["overrides"]
    return data


def scaffold(name: str, like: PlatformDescriptor | None = None, backing: str | None = None) -> PlatformDescriptor:
    """The validated descriptor of the new platform `name` (one vendor kernel: the relu example).

    The vendor module of `--like` is not inherited: the new chip gets its own `vendor_kernels.py`.
    """
    data = _from_like(name, like, backing) if like is not None else _defaults(name, backing or "cpu")
    data["kernels"]["vendor"] = {"module": VENDOR_MODULE, "ops": {EXAMPLE_OP: EXAMPLE_FUNCTION}}
    try:
        return PlatformDescriptor.model_validate(data)
    except (DescriptorError, ValueError) as exc:
        # Only a --like descriptor that is itself inconsistent can get here; say which.
        raise OnboardError(f"cannot build a descriptor for {name!r}: {exc}") from None


def backing_warning(descriptor: PlatformDescriptor) -> str | None:
    """A warning when the runtime cannot drive the backing (the platform then loads as data only)."""
    if descriptor.backing.device in RUNTIME_BACKINGS:
        return None
    return (
        f"backing {descriptor.backing.device!r} is not one the runtime drives ({', '.join(sorted(RUNTIME_BACKINGS))}): "
        "the platform is data only until it is; pass --backing cpu or --backing cuda to run it"
    )


def machine_backing_warning(descriptor: PlatformDescriptor) -> str | None:
    """A warning when the torch installed here cannot drive a cuda backing: conformance, loading and
    training of the platform would all fail on this machine (read without importing torch)."""
    if descriptor.backing.device != "cuda" or installed_version("torch") is None:
        return None
    if torch_cuda_version() is not None:
        return None
    return (
        "--backing cuda, but the torch installed here is a CPU-only build: the platform cannot be validated, "
        "loaded or trained on this machine; pass --backing cpu to work here, or run the next steps where "
        "CUDA is (torch-fl preflight NAME --json says what is missing)"
    )


def like_backing_warning(descriptor: PlatformDescriptor, like: PlatformDescriptor | None) -> str | None:
    """A warning when --backing differs from the --like platform's: the capabilities copied from it
    (distributed backend, compile path, profiler tracer) describe a chip of the other backing."""
    if like is None or like.backing.device == descriptor.backing.device:
        return None
    caps = like.capabilities
    return (
        f"--backing {descriptor.backing.device} differs from --like {like.name}'s backing {like.backing.device!r}: "
        f"the capabilities copied from it (distributed {caps.distributed.backend}, compile {caps.compile.path}, "
        f"profiler {caps.profiler.tracer}) describe a {like.backing.device}-backed chip; review them, or start "
        f"--like a {descriptor.backing.device}-backed platform"
    )


def load_text(text: str, name: str, what: str) -> PlatformDescriptor:
    """Validate platform.yaml `text` exactly as the loader will read it (in a scratch folder `name`)."""
    with tempfile.TemporaryDirectory(prefix="torch-fl-onboard-") as tmp:
        folder = Path(tmp) / name
        folder.mkdir()
        (folder / DESCRIPTOR_FILE).write_text(text, encoding="utf-8")
        try:
            return load_descriptor(folder)
        except DescriptorError as exc:
            raise OnboardError(f"{what} does not validate: {exc}") from None
