"""A dispatch mode that watches the aten overloads a run reaches on flagos and checks their contract.

Below autograd and composite decompositions, every call that reaches a backend passes here once:
the overloads seen with a flagos argument are exactly the ones a route can serve, so the ops
suite forces each of them in turn. For the overloads under test it also checks what a route
kernel must honour whatever path serves it, from the op's schema:

- a return without an alias annotation is a fresh tensor: it shares no storage with an input;
- a return annotated as writing an argument (in-place `self`, `out=`) is that argument itself.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator
from typing import Any

import torch
from torch.utils._python_dispatch import (
    TorchDispatchMode,
    _disable_current_modes,
    _get_current_dispatch_mode,
)
from torch.utils._pytree import tree_flatten

from torch_fl.conformance.compare import overlaps, storage_key
from torch_fl.kernels.base import op_name
from torch_fl.routing.constraints import SCHEMA_ALIAS_EXEMPT


def _is_flagos(x: Any) -> bool:
    return isinstance(x, torch.Tensor) and x.device.type == "flagos"


def _touches_flagos(args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
    leaves, _ = tree_flatten((args, kwargs))
    for x in leaves:
        if _is_flagos(x) or (isinstance(x, torch.device) and x.type == "flagos"):
            return True
    return False


class Watch(TorchDispatchMode):
    """Records reached overloads (in first-seen order) and the parts that reached them, whether any
    op was random, and schema-contract problems of the `focus` ops.

    `focus=None` checks every overload; an empty set checks none.
    """

    def __init__(self, focus: Iterable[str] | None = None) -> None:
        super().__init__()
        self.focus = None if focus is None else frozenset(focus)
        self.seen: dict[str, torch._ops.OpOverload] = {}
        self.problems: list[str] = []
        self.random = False
        self.part = "forward"
        self.parts: dict[str, set[str]] = {}
        self._paused = 0

    def set_part(self, part: str) -> None:
        """Which part of a run (forward, backward, inplace, out) the next ops belong to."""
        self.part = part

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        """Ops run meanwhile are not the op under test (copying a sample onto flagos): not watched,
        and not even dispatched through this mode (that costs a Python call per op)."""
        self._paused += 1
        try:
            if _get_current_dispatch_mode() is self:
                with _disable_current_modes():
                    yield
            else:
                yield
        finally:
            self._paused -= 1

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[override]
        kwargs = kwargs or {}
        if self._paused:
            return func(*args, **kwargs)
        name = op_name(func)
        on_flagos = _touches_flagos(args, kwargs)
        if on_flagos:
            if torch.Tag.nondeterministic_seeded in func.tags:
                self.random = True
            if name not in self.seen:
                self.seen[name] = func
            self.parts.setdefault(name, set()).add(self.part)
        result = func(*args, **kwargs)
        if on_flagos and (self.focus is None or name in self.focus):
            self._check(name, func, args, kwargs, result)
        return result

    def _check(
        self, name: str, func: torch._ops.OpOverload, args: tuple[Any, ...], kwargs: dict[str, Any], result: Any
    ) -> None:
        schema = func._schema
        bound: list[tuple[str, Any, Any]] = []
        for i, argument in enumerate(schema.arguments):
            value = args[i] if i < len(args) else kwargs.get(argument.name)
            bound.append((argument.name, value, argument.alias_info))
        results = list(result) if isinstance(result, (tuple, list)) and len(schema.returns) > 1 else [result]
        for k, (ret, value) in enumerate(zip(schema.returns, results)):
            if not isinstance(value, torch.Tensor):
                continue
            label = f"return {k}" if len(schema.returns) > 1 else "its result"
            info = ret.alias_info
            if info is None:
                if name in SCHEMA_ALIAS_EXEMPT:
                    continue
                key = storage_key(value)
                for arg_name, arg, _ in bound:
                    tensors = arg if isinstance(arg, (list, tuple)) else [arg]
                    if any(isinstance(t, torch.Tensor) and overlaps(key, storage_key(t)) for t in tensors):
                        self.problems.append(
                            f"{name}: {label} shares storage with argument '{arg_name}', but the schema returns a new tensor"
                        )
                        break
            elif info.is_write:
                for arg_name, arg, arg_info in bound:
                    if arg_info is not None and arg_info.is_write and set(arg_info.before_set) & set(info.before_set):
                        if value is not arg:
                            where = "in place into" if arg_name == "self" else "into"
                            self.problems.append(
                                f"{name}: {label} is a new tensor, not '{arg_name}' (the schema says it writes {where} '{arg_name}')"
                            )
                        break
