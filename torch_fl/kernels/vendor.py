"""The vendor path: a platform's own kernel module, one Python callable per aten overload.

Contract for vendor functions (what `torch-fl onboard` scaffolds): they receive the op's
arguments with flagos tensors replaced by zero-copy tensors of the backing device, and return
backing tensors (or write in place / into `out=`), exactly like the backing's aten kernel would.
"""

from __future__ import annotations

import hashlib
import sys
from collections.abc import Iterable
from pathlib import Path
from types import ModuleType
from typing import Any

import torch

from torch_fl.fileio import RefusedFile, read_bounded
from torch_fl.kernels.aliasing import call_on_backing
from torch_fl.kernels.base import op_name
from torch_fl.platform import PlatformDescriptor
from torch_fl.platform.loader import vendor_module_file
from torch_fl.platform.record import MAX_SOURCE_BYTES

_imported: dict[str, str] = {}


def imported_sources() -> dict[str, str]:
    """Relative path -> `sha256:<hex>` of the vendor modules this process imported: what it ran, for
    the conformance run to check against the sources its record binds."""
    return dict(_imported)


def load_vendor_module(descriptor: PlatformDescriptor) -> ModuleType:
    """Import the descriptor's vendor module: a regular file inside the platform folder, checked again here
    because the folder may have changed since the descriptor was loaded.

    It runs from the bytes read here, compiled in memory: never from a bytecode file in __pycache__/,
    which the record does not hash (an unchecked-hash .pyc, or one with the source's size and mtime,
    would run other code than the source), and nothing is written there."""
    assert descriptor.directory is not None, "a loaded descriptor knows its folder"
    path = vendor_module_file(descriptor, Path(descriptor.directory))
    name = f"torch_fl_vendor_{descriptor.name}"
    if name in sys.modules:
        return sys.modules[name]
    if not path.is_file():
        raise ImportError(f"{path}: the vendor kernel module named by kernels.vendor.module does not exist")
    try:
        source = read_bounded(path, MAX_SOURCE_BYTES)
    except RefusedFile as exc:
        raise ImportError(f"cannot load the vendor kernel module: {exc}") from None
    relative = path.relative_to(Path(descriptor.directory).resolve()).as_posix()
    _imported[relative] = "sha256:" + hashlib.sha256(source).hexdigest()
    code = compile(source, str(path), "exec", dont_inherit=True)
    module = ModuleType(name)
    module.__file__ = str(path)
    sys.modules[name] = module  # before it runs, as an import does: its own classes look it up there
    try:
        exec(code, module.__dict__)
    except BaseException:
        del sys.modules[name]
        raise
    return module


class VendorKernels:
    name = "vendor"

    def __init__(self, descriptor: PlatformDescriptor) -> None:
        self.descriptor = descriptor
        assert descriptor.kernels.vendor is not None, "built only for descriptors that declare vendor kernels"
        self.functions = dict(descriptor.kernels.vendor.ops)
        self._module: ModuleType | None = None

    def module(self) -> ModuleType:
        if self._module is None:
            self._module = load_vendor_module(self.descriptor)
            missing = [fn for fn in self.functions.values() if not hasattr(self._module, fn)]
            if missing:
                raise AttributeError(f"vendor module {self._module.__name__} lacks {missing} named by the descriptor")
        return self._module

    def ops(self) -> Iterable[str]:
        return sorted(self.functions)

    def implements(self, op: str) -> bool:
        return op in self.functions

    def call(self, op: torch._ops.OpOverload, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        fn = getattr(self.module(), self.functions[op_name(op)])
        return call_on_backing(fn, args, kwargs)
