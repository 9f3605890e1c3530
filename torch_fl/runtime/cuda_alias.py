"""Run programs written for CUDA unchanged on flagos, where the machine has no real CUDA device.

Opt-in: `FLAGOS_ALIAS_CUDA=1` (read when the runtime starts, see `enable_from_env`) or
`torch_fl.runtime.cuda_alias.enable()`. Where a real CUDA device exists nothing is ever aliased:
`enable()` raises and the variable is ignored with a warning, so plain CUDA code stays CUDA.

What is covered, once enabled:

1. Device arguments, through a TorchFunctionMode pushed on the enabling thread's mode stack:
   - any torch function or Tensor method called with a `device=` keyword of "cuda", "cuda:N" or
     `torch.device("cuda"[, N])` gets "flagos" / "flagos:N" instead (factories such as
     torch.empty/zeros/ones/full/rand/randn/randint/arange/tensor/as_tensor, the *_like
     functions, Tensor.new_*, Tensor.to(device=...));
   - `Tensor.to("cuda"...)` / `Tensor.to(torch.device("cuda"), ...)` with a positional device;
   - `Tensor.cuda(device=None, non_blocking=False, memory_format=...)`, which becomes a move to
     flagos (the current flagos device when no device is given); `nn.Module.to("cuda")` and
     `nn.Module.cuda()` follow, since they call these;
   - `torch.set_default_device("cuda"[:N])`, replaced by a version that sets flagos[:N].
   "cuda" without an index means the current flagos device, as it means the current CUDA device.
2. These torch.cuda functions, replaced by their torch.flagos equivalents (device arguments
   "cuda[:N]", torch.device("cuda"[, N]) and plain indices accepted):
   is_available, is_initialized, init, device_count, current_device, set_device, synchronize,
   device (context object), device_of, get_device_name, manual_seed, manual_seed_all, seed,
   seed_all, initial_seed, get_rng_state, set_rng_state, get_rng_state_all, set_rng_state_all,
   empty_cache, memory_allocated, max_memory_allocated, memory_reserved, max_memory_reserved,
   reset_peak_memory_stats, memory_stats, is_bf16_supported.

What is not covered (behaves as on a machine without CUDA, or differs):
   - tensors report `device.type == "flagos"` and `is_cuda == False`; `torch.device("cuda")` is
     still a CUDA device object (comparisons with it are False);
   - every other torch.cuda function and class: Stream, Event, stream/current_stream, graphs,
     get_device_properties/capability, torch.cuda.amp and `torch.autocast("cuda")` (autocast
     stays off for flagos tensors; use `torch.autocast("flagos")`), the legacy
     torch.cuda.FloatTensor types, `torch.Generator(device="cuda")`;
   - threads other than the one that enabled the alias (a TorchFunctionMode is per thread);
   - C++ code asking for CUDA directly (extensions, `.to("cuda")` inside TorchScript).
Each call of a torch function pays the mode's Python check (a few microseconds).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

import torch
from torch.overrides import TorchFunctionMode

from torch_fl import env

env.register(
    "FLAGOS_ALIAS_CUDA",
    "0",
    "Set to 1 to run programs written for CUDA on flagos where the machine has no real CUDA device: "
    "device='cuda', .cuda() and a listed set of torch.cuda functions map onto flagos "
    "(see torch_fl.runtime.cuda_alias). Ignored, with a warning, where real CUDA exists.",
)

FLAGOS = "flagos"

# The real answers, taken before anything is replaced.
_cuda_is_compiled: Callable[[], bool] = torch.cuda._is_compiled
_cuda_device_count: Callable[[], int] = torch.cuda.device_count

_mode: CudaToFlagosMode | None = None
_saved: dict[str, Any] = {}


class RealCudaPresent(RuntimeError):
    """The machine has a real CUDA device: "cuda" stays CUDA."""


def real_cuda_present() -> bool:
    """Whether this process sees a real CUDA device (asked of PyTorch's own CUDA functions)."""
    return bool(_cuda_is_compiled() and _cuda_device_count() > 0)


def enabled() -> bool:
    return _mode is not None


def enable() -> None:
    """Maps CUDA device requests onto flagos (see the module documentation). Idempotent."""
    global _mode
    if _mode is not None:
        return
    if real_cuda_present():
        raise RealCudaPresent(
            "torch_fl: this machine has a real CUDA device, so 'cuda' is not aliased to flagos; "
            "use device='flagos' explicitly (CUDA aliasing is only for machines without CUDA)"
        )
    from torch_fl import runtime

    if not runtime.started():
        raise RuntimeError("torch_fl: the flagos device is not active in this process (see torch_fl.activate)")
    _patch_torch_cuda()
    mode = CudaToFlagosMode()
    mode.__enter__()
    _mode = mode


def disable() -> None:
    """Undoes `enable()` (from the thread that enabled it)."""
    global _mode
    if _mode is None:
        return
    _mode.__exit__(None, None, None)
    _mode = None
    for name, value in _saved.items():
        setattr(torch.cuda, name, value)
    _saved.clear()
    torch.set_default_device = _set_default_device


def requested() -> bool:
    return env.flag("FLAGOS_ALIAS_CUDA")


def enable_from_env() -> bool:
    """Enables the alias when FLAGOS_ALIAS_CUDA asks for it; returns whether it is enabled."""
    if not requested():
        return enabled()
    if real_cuda_present():
        warnings.warn(
            "torch_fl: FLAGOS_ALIAS_CUDA is set but this machine has a real CUDA device; 'cuda' stays CUDA",
            stacklevel=2,
        )
        return False
    enable()
    return True


# ---------------------------------------------------------------------------------------------
# device arguments


def _flagos_device(device: Any) -> Any:
    """flagos's name for a CUDA device argument; anything else unchanged."""
    if isinstance(device, str):
        text = device.strip()
        if text == "cuda" or text.startswith("cuda:"):
            return FLAGOS + text[4:]
        return device
    if isinstance(device, torch.device) and device.type == "cuda":
        return torch.device(FLAGOS) if device.index is None else torch.device(FLAGOS, device.index)
    return device


def _flagos_index(device: Any) -> int:
    """The flagos index of a torch.cuda-style device argument (None: the current device)."""
    if device is None:
        return torch.flagos.current_device()
    if isinstance(device, int):
        return device
    device = torch.device(_flagos_device(device))
    if device.type != FLAGOS:
        raise ValueError(f"expected a CUDA device, got {device}")
    return torch.flagos.current_device() if device.index is None else device.index


class CudaToFlagosMode(TorchFunctionMode):
    """Rewrites CUDA device arguments to flagos on their way into torch functions."""

    def __torch_function__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        if func is _TENSOR_CUDA:
            return _tensor_cuda(*args, **kwargs)
        if "device" in kwargs:
            kwargs["device"] = _flagos_device(kwargs["device"])
        if func is _TENSOR_TO and len(args) > 1:
            args = (args[0], _flagos_device(args[1]), *args[2:])
        return func(*args, **kwargs)


_TENSOR_CUDA = torch.Tensor.cuda
_TENSOR_TO = torch.Tensor.to


def _tensor_cuda(
    self: torch.Tensor,
    device: Any = None,
    non_blocking: bool = False,
    memory_format: torch.memory_format = torch.preserve_format,
) -> torch.Tensor:
    target = torch.device(FLAGOS, _flagos_index(device))
    return self.to(target, non_blocking=non_blocking, memory_format=memory_format)


# ---------------------------------------------------------------------------------------------
# torch.cuda functions


class _CudaDevice:
    """torch.cuda.device(...) as a context object that makes the flagos device current."""

    def __init__(self, device: Any) -> None:
        index = -1 if device is None or (isinstance(device, int) and device < 0) else _flagos_index(device)
        self._inner = torch.flagos.device(index if index >= 0 else None)
        self.idx = index

    def __enter__(self) -> _CudaDevice:
        self._inner.__enter__()
        return self

    def __exit__(self, *exc: object) -> bool:
        return self._inner.__exit__(*exc)


class _CudaDeviceOf(_CudaDevice):
    def __init__(self, obj: torch.Tensor) -> None:
        super().__init__(obj.device if obj.device.type == FLAGOS else None)


def _by_index(fn: Callable[..., Any]) -> Callable[..., Any]:
    """A torch.flagos function of an optional device, called with a torch.cuda-style device."""

    def call(device: Any = None, *args: Any, **kwargs: Any) -> Any:
        return fn(_flagos_index(device), *args, **kwargs)

    call.__name__ = getattr(fn, "__name__", "call")
    return call


def _replacements() -> dict[str, Any]:
    flagos = torch.flagos
    return {
        "is_available": lambda: True,
        "is_initialized": flagos.is_initialized,
        "init": flagos.init,
        "device_count": flagos.device_count,
        "current_device": flagos.current_device,
        "set_device": lambda device: flagos.set_device(_flagos_index(device)),
        "synchronize": _by_index(flagos.synchronize),
        "device": _CudaDevice,
        "device_of": _CudaDeviceOf,
        "get_device_name": _by_index(flagos.get_device_name),
        "manual_seed": flagos.manual_seed,
        "manual_seed_all": flagos.manual_seed_all,
        "seed": flagos.seed,
        "seed_all": flagos.seed_all,
        "initial_seed": flagos.initial_seed,
        "get_rng_state": lambda device="cuda": flagos.get_rng_state(_flagos_index(device)),
        "set_rng_state": lambda new_state, device="cuda": flagos.set_rng_state(new_state, _flagos_index(device)),
        "get_rng_state_all": flagos.get_rng_state_all,
        "set_rng_state_all": flagos.set_rng_state_all,
        "empty_cache": flagos.empty_cache,
        "memory_allocated": _by_index(flagos.memory_allocated),
        "max_memory_allocated": _by_index(flagos.max_memory_allocated),
        "memory_reserved": _by_index(flagos.memory_reserved),
        "max_memory_reserved": _by_index(flagos.max_memory_reserved),
        "reset_peak_memory_stats": _by_index(flagos.reset_peak_memory_stats),
        "memory_stats": _by_index(flagos.memory_stats),
        "is_bf16_supported": lambda including_emulation=True: flagos.is_bf16_supported(),
    }


COVERED_FUNCTIONS: tuple[str, ...] = (
    "is_available",
    "is_initialized",
    "init",
    "device_count",
    "current_device",
    "set_device",
    "synchronize",
    "device",
    "device_of",
    "get_device_name",
    "manual_seed",
    "manual_seed_all",
    "seed",
    "seed_all",
    "initial_seed",
    "get_rng_state",
    "set_rng_state",
    "get_rng_state_all",
    "set_rng_state_all",
    "empty_cache",
    "memory_allocated",
    "max_memory_allocated",
    "memory_reserved",
    "max_memory_reserved",
    "reset_peak_memory_stats",
    "memory_stats",
    "is_bf16_supported",
)


_set_default_device = torch.set_default_device


def _set_default_flagos_device(device: Any) -> None:
    _set_default_device(_flagos_device(device))


def _patch_torch_cuda() -> None:
    for name, replacement in _replacements().items():
        _saved[name] = getattr(torch.cuda, name)
        setattr(torch.cuda, name, replacement)
    torch.set_default_device = _set_default_flagos_device
