"""Shared set-up for the flagos runtime tests (one file per feature, as in PyTorch's torch_openreg).

Every test compares flagos with plain PyTorch: numerics against the CPU, and where a fact holds only
for one backing device the test carries a marker and is skipped elsewhere with the reason:

    backing_cpu    a fact of the host reference platform (backing "cpu"), e.g. two virtual devices
    backing_cuda   a fact of CUDA-backed flagos, e.g. dropout masks equal to CUDA's
    two_devices    needs flagos:0 and flagos:1
    own_process    starts its own Python processes; runs even where flagos is not active here

The same files run on the host reference platform and on a CUDA board (FLAGOS_PLATFORM=nvidia_h200).
On a machine with a real CUDA device and no FLAGOS_PLATFORM, flagos is deliberately not registered in
this process (the containment rule, torch_fl.activation); then only `own_process` tests run.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import torch

import torch_fl
from torch_fl.runtime.device import core as device_core

ACTIVE = torch_fl.is_active()
BACKING = device_core.backing() if ACTIVE else None

# flagos runs the backing's own kernels: on the host, CPU results within assert_close's default
# (dtype-aware) tolerances; on CUDA, close ones (TF32 convolutions, other reduction orders), so
# there at least this much is allowed on top of the dtype's default.
_TOLERANCE: dict[str, dict[str, float]] = {"cpu": {}, "cuda": {"rtol": 2e-3, "atol": 2e-3}}
# assert_close's defaults, per floating dtype (integers and bool compare exactly everywhere)
_DTYPE_DEFAULTS = {
    torch.float16: (1e-3, 1e-5),
    torch.bfloat16: (1.6e-2, 1e-5),
    torch.float32: (1.3e-6, 1e-5),
    torch.float64: (1e-7, 1e-7),
    torch.complex64: (1.3e-6, 1e-5),
    torch.complex128: (1e-7, 1e-7),
}


def tolerance(dtype: torch.dtype, **override: float) -> dict[str, float]:
    """rtol/atol for comparing a flagos result of `dtype` with the CPU here: the dtype's default, or
    `override`, widened on a device backing by that backing's allowance."""
    if dtype not in _DTYPE_DEFAULTS:
        return {"rtol": 0.0, "atol": 0.0}
    rtol, atol = _DTYPE_DEFAULTS[dtype]
    rtol, atol = override.get("rtol", rtol), override.get("atol", atol)
    extra = _TOLERANCE.get(BACKING or "cpu", _TOLERANCE["cuda"])
    return {"rtol": max(rtol, extra.get("rtol", 0.0)), "atol": max(atol, extra.get("atol", 0.0))}


_MARKERS = {
    "backing_cpu": "a fact of the host reference backing",
    "backing_cuda": "a fact of CUDA-backed flagos",
    "two_devices": "needs at least two flagos devices",
    "own_process": "starts its own Python processes; flagos need not be active in the test process",
}


def pytest_configure(config: pytest.Config) -> None:
    for name, doc in _MARKERS.items():
        config.addinivalue_line("markers", f"{name}: {doc}")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    here = Path(__file__).parent
    for item in items:
        if here not in Path(item.path).parents:
            continue
        if item.get_closest_marker("own_process") is None and not ACTIVE:
            reason = "flagos is not active in this process (a CUDA machine without FLAGOS_PLATFORM: containment rule)"
            item.add_marker(pytest.mark.skip(reason=reason))
        elif item.get_closest_marker("backing_cpu") and BACKING != "cpu":
            item.add_marker(pytest.mark.skip(reason=f"{_MARKERS['backing_cpu']}; the backing here is {BACKING}"))
        elif item.get_closest_marker("backing_cuda") and BACKING != "cuda":
            item.add_marker(pytest.mark.skip(reason=f"{_MARKERS['backing_cuda']}; the backing here is {BACKING}"))
        elif item.get_closest_marker("two_devices") and (not ACTIVE or torch.flagos.device_count() < 2):
            item.add_marker(pytest.mark.skip(reason=_MARKERS["two_devices"]))


@pytest.fixture(scope="session")
def backing() -> str | None:
    """The backing device type of the active flagos platform: "cpu" or "cuda"."""
    return BACKING


@pytest.fixture(scope="session")
def tol() -> dict[str, float]:
    """assert_close tolerances for float32 flagos results against the CPU on this backing."""
    return tolerance(torch.float32)


@pytest.fixture(scope="session")
def same() -> Callable[..., None]:
    """same(flagos_result, cpu_reference, rtol=..., atol=...): equal device kind, dtype, shape, and
    values within the tolerance of `tolerance()` (the optional rtol/atol replace the dtype default)."""

    def check(result: torch.Tensor, reference: torch.Tensor, **override: float) -> None:
        assert result.device.type == "flagos", f"result is on {result.device}, not flagos"
        assert reference.device.type == "cpu", f"reference is on {reference.device}, not cpu"
        assert result.dtype == reference.dtype, (result.dtype, reference.dtype)
        torch.testing.assert_close(result.cpu(), reference, **tolerance(reference.dtype, **override))

    return check


@pytest.fixture(autouse=True)
def _restore_flagos_state():
    """Every test starts on flagos:0 with its default stream and no forced CPU routes."""
    if not ACTIVE:
        yield
        return
    core = torch_fl.runtime.core()
    torch.flagos.set_device(0)
    stream = torch.flagos.current_stream(0)
    yield
    torch.flagos.set_device(0)
    torch.flagos.set_stream(stream)
    for op in list(_forced):
        core.set_cpu_route(op, False)
    _forced.clear()
    core.set_log_cpu_fallback(False)


_forced: set[str] = set()


@pytest.fixture
def force_cpu_route() -> Callable[[str], None]:
    """force_cpu_route("aten::add.out"): the explicit CPU route serves that op until the test ends."""

    def force(op: str) -> None:
        _forced.add(op)
        torch_fl.runtime.core().set_cpu_route(op, True)

    return force
