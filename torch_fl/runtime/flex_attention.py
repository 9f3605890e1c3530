"""torch.nn.attention.flex_attention on flagos, eager and under torch.compile.

PyTorch admits flex_attention only on the device types it lists, and chooses the rules and the
compiled kernel by device type: the CPU's (inference only; inductor's C++ template) or a GPU's
(with backward; the Triton template). flagos follows its backing: on the host the CPU's rules and
C++ template, on CUDA the GPU's. `register(backing)` installs that when PyTorch loads the modules
concerned (nothing is imported before), as the inductor registration does:

- torch.nn.attention.flex_attention: the device check admits flagos with the backing's rules, and
  on the host the kernel options are the CPU's (no logsumexp unless asked for, no max scores);
- torch._inductor.kernel.flex.flex_attention: on the host, flagos inputs lower to the C++ template
  (flagos host code is C++ code, see torch_fl.runtime.inductor).
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import Any

import torch

from torch_fl.runtime.inductor import after_import

FLAGOS = "flagos"
_MARK = "_flagos"


def register(backing: str) -> None:
    """Admits flagos to flex_attention with the rules of `backing` ("cpu" or "cuda"). Idempotent."""
    after_import("torch.nn.attention.flex_attention", lambda: _admit_flagos(backing))
    if backing == "cpu":
        after_import("torch._inductor.kernel.flex.flex_attention", _lower_host_flagos_as_cpu)


def _on_flagos(*tensors: torch.Tensor) -> bool:
    return any(t.device.type == FLAGOS for t in tensors)


def _wrap_once(module: Any, name: str, make: Callable[[Callable[..., Any]], Callable[..., Any]]) -> None:
    original = getattr(module, name)
    if getattr(original, _MARK, False):
        return
    wrapper = functools.wraps(original)(make(original))
    setattr(wrapper, _MARK, True)
    setattr(module, name, wrapper)


def _admit_flagos(backing: str) -> None:
    import torch.nn.attention.flex_attention as flex

    def make_validate(original: Callable[..., None]) -> Callable[..., None]:
        def validate_device(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor) -> None:
            if not _on_flagos(query):
                return original(query, key, value)
            if backing == "cpu" and (query.requires_grad or key.requires_grad or value.requires_grad):
                raise NotImplementedError(
                    "FlexAttention does not support backward on the host backing (as on the CPU). Please set the "
                    "input requires_grad to False or use a device platform."
                )
            return None

        return validate_device

    _wrap_once(flex, "_validate_device", make_validate)
    if backing != "cpu":
        return
    parameters = list(inspect.signature(flex._apply_kernel_options).parameters)

    def make_options(original: Callable[..., Any]) -> Callable[..., Any]:
        def apply_kernel_options(*args: Any, **kwargs: Any) -> Any:
            options = original(*args, **kwargs)
            bound = dict(zip(parameters, args), **kwargs)
            if not _on_flagos(bound["query"], bound["key"], bound["value"]):
                return options
            # The CPU's rules: the C++ kernel gives no logsumexp unless asked for, and no max scores.
            aux = bound.get("return_aux")
            wants_lse = aux.lse if aux is not None else bound["return_lse"]
            if not wants_lse:
                options["OUTPUT_LOGSUMEXP"] = False
            if options.get("OUTPUT_MAX"):
                raise NotImplementedError("Returning max scores is not supported on the host backing (as on the CPU).")
            return options

        return apply_kernel_options

    _wrap_once(flex, "_apply_kernel_options", make_options)


def _lower_host_flagos_as_cpu() -> None:
    from torch._inductor import lowering
    from torch._inductor.kernel.flex.flex_cpu import lower_cpu

    hop = torch.ops.higher_order.flex_attention
    original = lowering.lowerings[hop]
    if getattr(original, _MARK, False):
        return

    def flex_attention(query: Any, *args: Any, **kwargs: Any) -> Any:
        if query.get_device().type == FLAGOS:
            return lower_cpu(query, *args, **kwargs)
        return original(query, *args, **kwargs)

    setattr(flex_attention, _MARK, True)
    lowering.lowerings[hop] = flex_attention
