"""The contract every execution path implements, kept as small as possible."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Protocol

import torch


class KernelSet(Protocol):
    """One execution path."""

    name: str

    def ops(self) -> Iterable[str]:
        """The aten overloads this path offers ("aten::name.overload"); native/cpu offer all."""
        ...

    def implements(self, op: str) -> bool: ...

    def call(self, op: torch._ops.OpOverload, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """Run `op` on flagos tensors and return flagos results."""
        ...


def op_name(op: torch._ops.OpOverload) -> str:
    """The qualified overload name routes use: aten::mm, aten::add.Tensor."""
    schema = op._schema
    return f"{schema.name}.{schema.overload_name}" if schema.overload_name else schema.name


def resolve(name: str) -> torch._ops.OpOverload:
    """The OpOverload for "aten::name[.overload]"."""
    namespace, _, rest = name.partition("::")
    packet_name, _, overload = rest.partition(".")
    packet = getattr(getattr(torch.ops, namespace), packet_name)
    return getattr(packet, overload or "default")
