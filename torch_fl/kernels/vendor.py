"""The vendor path: a platform's own kernel module, one Python callable per aten overload.

The contract of a vendor function (docs/onboarding.md, "The vendor contract"; the stub `kernel add`
writes repeats it), which `VendorKernels.call` makes hold:

- arguments come in the order of the op's schema, positional as the caller gave them, keyword
  arguments by their schema names;
- every flagos tensor arrives as a zero-copy tensor of the backing device, its memory holding
  exactly the values it stands for: a lazily conjugated or negated view (x.conj() of a complex
  tensor, which mm and other linear algebra receive as such) arrives resolved, as a copy, and what
  the function writes into such an argument (in place, `out=`) is copied back;
- a Python number may arrive where the schema has a Tensor (add.Tensor's `other` in `x + 2`):
  PyTorch's wrapped number, which promotes like a scalar of its Python type
  (torch.result_type(self, other) gives the result dtype; torch.mul(2, x) passes `self` so);
  Scalar arguments are Python numbers;
- it returns backing tensors (or writes in place / into `out=`) exactly as the backing's own aten
  kernel would.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
from collections.abc import Callable, Iterable
from pathlib import Path
from types import ModuleType
from typing import Any

import torch

from torch_fl.fileio import RefusedFile, read_bounded
from torch_fl.kernels.aliasing import call_on_backing, map_structure
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
    folder = Path(descriptor.directory).resolve()
    _imported[path.relative_to(folder).as_posix()] = "sha256:" + hashlib.sha256(source).hexdigest()
    code = compile(source, str(path), "exec", dont_inherit=True)
    module = ModuleType(name)
    module.__file__ = str(path)
    sys.modules[name] = module  # before it runs, as an import does: its own classes look it up there
    finder = _KernelFiles(folder)
    sys.meta_path.insert(0, finder)
    try:
        exec(code, module.__dict__)
    except BaseException:
        del sys.modules[name]
        raise
    finally:
        sys.meta_path.remove(finder)
    return module


class _KernelFiles(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """While the vendor module's top level runs, `import NAME` / `from NAME import f` of a file
    NAME.py of the platform's folder imports that file (kernels kept in files of their own, which
    the vendor module imports by name), like the vendor module itself: from the bytes hashed here,
    never from __pycache__/, and listed in `imported_sources`."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        if path is not None or "." in fullname:
            return None
        file = self.folder / f"{fullname}.py"
        if not file.is_file():
            return None
        if file.is_symlink():
            raise ImportError(f"{file}: a kernel file that is a link is not imported (its target is not hashed)")
        return importlib.util.spec_from_loader(fullname, self, origin=str(file))

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return None

    def exec_module(self, module: ModuleType) -> None:
        assert module.__spec__ is not None and module.__spec__.origin is not None
        file = Path(module.__spec__.origin)
        try:
            source = read_bounded(file, MAX_SOURCE_BYTES)
        except RefusedFile as exc:
            raise ImportError(f"cannot load the kernel file {file.name}: {exc}") from None
        _imported[file.relative_to(self.folder).as_posix()] = "sha256:" + hashlib.sha256(source).hexdigest()
        module.__file__ = str(file)
        exec(compile(source, str(file), "exec", dont_inherit=True), module.__dict__)


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
        return call_on_backing(_with_plain_memory(fn, op), args, kwargs)


@functools.cache
def _written(op: torch._ops.OpOverload) -> tuple[set[int], set[str]]:
    """Positions and names of the arguments the op writes (self of add_, out of add.out)."""
    arguments = op._schema.arguments
    writes = [a.alias_info is not None and a.alias_info.is_write for a in arguments]
    return {i for i, w in enumerate(writes) if w}, {a.name for a, w in zip(arguments, writes) if w}


def _with_plain_memory(fn: Callable[..., Any], op: torch._ops.OpOverload) -> Callable[..., Any]:
    """`fn` receiving conjugated/negated views resolved (a kernel reads memory, and the memory of
    x.conj() holds x): written ones as copies that are copied back after the call, and returned
    as the arguments they stand for (so in-place results stay the caller's tensors)."""
    positions, names = _written(op)

    def call(*args: Any, **kwargs: Any) -> Any:
        # id(resolved copy) -> (the copy, the written argument it stands for); holding the copy keeps its id unique
        copied: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}

        def plain(x: Any, written: bool) -> Any:
            if not isinstance(x, torch.Tensor) or not (x.is_conj() or x.is_neg()):
                return x
            resolved = x.resolve_conj().resolve_neg()
            if written:
                copied[id(resolved)] = (resolved, x)
            return resolved

        args = tuple(map_structure(functools.partial(plain, written=i in positions), a) for i, a in enumerate(args))
        kwargs = {k: map_structure(functools.partial(plain, written=k in names), v) for k, v in kwargs.items()}
        result = fn(*args, **kwargs)
        for resolved, target in copied.values():
            target.copy_(resolved)
        return map_structure(lambda x: copied[id(x)][1] if id(x) in copied else x, result)

    return call
