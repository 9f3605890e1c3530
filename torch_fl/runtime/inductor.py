"""torch.compile (inductor) for the flagos device.

`register(backing)` tells inductor and dynamo how to generate and run code for flagos tensors:

- host backing ("cpu"): C++/OpenMP kernels (CppScheduling) that run directly on flagos host
  pointers; the wrapper calls them as it calls CPU kernels. flagos is not a GPU type here.
- CUDA backing ("cuda"): Triton kernels (TritonScheduling, PythonWrapperCodegen) launched on the
  current CUDA stream, which is the current flagos stream; "flagos" joins inductor's GPU types,
  the wrapper's device operations are CUDA's, dynamo's device interface forwards hardware queries
  to torch.cuda, and the device properties handed to Triton say "cuda" (Triton compiles for a
  target it knows; the pointers it receives are CUDA memory labelled flagos). CUDA graphs
  (`mode="reduce-overhead"`, inductor's cudagraph trees) capture flagos graphs too: see
  `_register_cudagraphs`.

Registration is lazy (see `register`): it costs nothing at start-up, and dynamo and inductor are
extended when PyTorch first loads them.

Either way, operators inductor does not generate (mm, convolution, SDPA, ...) stay extern kernel
calls on flagos tensors, so they dispatch through flagos and the active routes serve them.
"""

from __future__ import annotations

import functools
import importlib.abc
import multiprocessing
import sys
import warnings
from collections.abc import Callable
from types import ModuleType
from typing import Any

import torch

FLAGOS = "flagos"

_requested: str | None = None
_registered: dict[str, str] = {}  # part ("interface", "codegen") -> backing


def register(backing: str) -> None:
    """Registers inductor code generation and dynamo's device interface for flagos. Idempotent.

    Cheap to call at start-up: each part is installed as soon as PyTorch loads the module it
    extends (now, if already loaded), so a process that never compiles never imports dynamo or
    inductor: dynamo's device interface when torch._dynamo.device_interface loads, the code
    generation when torch._inductor.compile_fx loads (the first torch.compile with inductor).
    """
    global _requested
    if _requested is not None:
        if _requested != backing:
            raise RuntimeError(f"inductor is registered for flagos on '{_requested}', not '{backing}'")
        return
    if backing not in ("cpu", "cuda"):
        raise RuntimeError(f"inductor has no code generation known for the backing device '{backing}'")
    _requested = backing
    after_import("torch._dynamo.device_interface", lambda: _install("interface", backing))
    after_import("torch._inductor.compile_fx", lambda: _install("codegen", backing))


def registered() -> str | None:
    """The backing whose code generation is installed in inductor, or None (not yet loaded)."""
    return _registered.get("codegen")


def _install(part: str, backing: str) -> None:
    if part in _registered:
        return
    if part == "interface":
        _register_interface(backing)
    elif backing == "cpu":
        _register_host_codegen()
    else:
        _register_cuda_codegen()
    _registered[part] = backing


class _PostImportHook(importlib.abc.MetaPathFinder):
    """Runs `callback` once, right after the module `name` has been executed by its import."""

    def __init__(self, name: str, callback: Callable[[], None]) -> None:
        self.name = name
        self.callback = callback

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        if fullname != self.name:
            return None
        sys.meta_path.remove(self)
        spec = None
        for finder in sys.meta_path:
            find = getattr(finder, "find_spec", None)
            spec = find(fullname, path, target) if find else None
            if spec is not None:
                break
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        execute, callback = spec.loader.exec_module, self.callback

        def exec_module(module: ModuleType) -> None:
            execute(module)
            _run_hook(fullname, callback)

        spec.loader.exec_module = exec_module
        return spec


def after_import(name: str, callback: Callable[[], None]) -> None:
    if name in sys.modules:
        _run_hook(name, callback)
    else:
        sys.meta_path.insert(0, _PostImportHook(name, callback))


def _run_hook(name: str, callback: Callable[[], None]) -> None:
    try:
        callback()
    except Exception as exc:  # noqa: BLE001 - PyTorch's own import must not fail because of flagos
        warnings.warn(f"torch_fl: registering flagos with {name} failed: {exc!r}", stacklevel=2)


def _index(device: Any) -> int:
    """The flagos device index of a torch.cuda-style device argument (None: the current device)."""
    from torch_fl.runtime.device import core

    return core.index(device)


def _register_interface(backing: str) -> None:
    from torch._dynamo.device_interface import register_interface_for_device

    interface = _host_interface() if backing == "cpu" else _cuda_interface()
    register_interface_for_device(FLAGOS, interface)
    for i in range(torch.flagos.device_count()):
        register_interface_for_device(f"{FLAGOS}:{i}", interface)


# ---------------------------------------------------------------------------------------------
# host backing: C++ kernels on host pointers


def _register_host_codegen() -> None:
    from torch._inductor.codegen.common import register_backend_for_device, register_device_op_overrides
    from torch._inductor.codegen.cpp import CppScheduling

    register_device_op_overrides(FLAGOS, _host_op_overrides())
    register_backend_for_device(FLAGOS, CppScheduling, _host_wrapper())
    _schedule_as_cpu()
    _resolve_backend_as_cpu()


def _schedule_as_cpu() -> None:
    """The scheduler skips its GPU-only loop transformations (reordering, reindexing for fusion)
    for CPU nodes, which the C++ backend cannot take; flagos nodes on the host are C++ nodes too."""
    from torch._inductor.scheduler import BaseSchedulerNode

    if getattr(BaseSchedulerNode.is_cpu, "_flagos", False):
        return

    def is_cpu(self: Any) -> bool:
        device = self.get_device()
        return device is not None and device.type in ("cpu", FLAGOS)

    is_cpu._flagos = True
    BaseSchedulerNode.is_cpu = is_cpu


def _resolve_backend_as_cpu() -> None:
    """Inductor names the code generator of a device type with `get_current_backend`, which knows
    cpu and sends every other type to the GPU backend: its dtype propagation then treats C++
    kernels as Triton ones (indirect loads lose their dtype). Host flagos is answered as cpu; the
    modules that imported the function by name get the same answer."""
    import torch._inductor.codegen.common as common
    import torch._inductor.kernel.mm_common as mm_common
    import torch._inductor.scheduler as scheduler
    import torch._inductor.utils as utils
    from torch._inductor import config
    from torch._inductor.virtualized import V

    original = utils.get_current_backend
    if getattr(original, "_flagos", False):
        return

    def get_current_backend(device_type: str | None = None) -> str:
        if (device_type or V.graph.get_current_device_or_throw().type) == FLAGOS:
            return config.cpu_backend
        return original(device_type)

    get_current_backend._flagos = True
    for module in (utils, common, scheduler, mm_common):
        if getattr(module, "get_current_backend", None) is original:
            module.get_current_backend = get_current_backend


def _host_op_overrides() -> Any:
    from torch._inductor.codegen.common import DeviceOpOverrides

    class HostOpOverrides(DeviceOpOverrides):
        """Wrapper-code snippets: host work is synchronous and has no raw stream."""

        def import_get_raw_stream_as(self, name: str) -> str:
            return f"def {name}(_index): return 0"

        def set_device(self, device_idx: int) -> str:
            return f"torch.flagos.set_device({device_idx})"

        def synchronize(self) -> str:
            return "pass"

        def device_guard(self, device_idx: int) -> str:
            return f"torch.flagos.device({device_idx})"

        def current_stream(self) -> str:
            return "torch.flagos.current_stream()"

        def cpp_kernel_type(self) -> str:
            return "void*"

    return HostOpOverrides()


def _host_wrapper() -> type:
    from torch._inductor.codegen.wrapper import PythonWrapperCodegen, SubgraphPythonWrapperCodegen
    from torch._inductor.virtualized import V

    class HostWrapperCodegen(PythonWrapperCodegen):
        """Calls the generated C++ kernels on flagos tensors exactly as on CPU tensors."""

        @staticmethod
        def create(
            is_subgraph: bool, subgraph_name: str | None, parent_wrapper: Any, partition_signatures: Any = None
        ) -> Any:
            if is_subgraph:
                return SubgraphPythonWrapperCodegen(subgraph_name, parent_wrapper, partition_signatures)
            return HostWrapperCodegen()

        def _generate_kernel_call_helper(
            self, kernel_name: str, call_args: Any, *, device: Any = None, **kwargs: Any
        ) -> None:
            device = device or V.graph.get_current_device_or_throw()
            if device.type == FLAGOS:
                device = torch.device("cpu")
            super()._generate_kernel_call_helper(kernel_name, call_args, device=device, **kwargs)

    return HostWrapperCodegen


def _host_interface() -> type:
    from torch._dynamo.device_interface import CpuDeviceProperties, DeviceInterface

    flagos = torch.flagos

    class HostInterface(DeviceInterface):
        """Dynamo's view of flagos on the host: torch.flagos for devices and streams."""

        device = flagos.device
        Event = torch.Event
        Stream = torch.Stream

        class Worker:
            @staticmethod
            def set_device(device: int) -> None:
                pass

            @staticmethod
            def current_device() -> int:
                return 0

            @staticmethod
            def get_device_properties(device: Any = None) -> Any:
                return CpuDeviceProperties(multiprocessing.cpu_count())

        current_device = staticmethod(flagos.current_device)
        set_device = staticmethod(flagos.set_device)
        device_count = staticmethod(flagos.device_count)
        stream = staticmethod(flagos.stream)
        current_stream = staticmethod(flagos.current_stream)
        set_stream = staticmethod(flagos.set_stream)
        synchronize = staticmethod(flagos.synchronize)
        memory_allocated = staticmethod(flagos.memory_allocated)

        @staticmethod
        def _set_stream_by_id(stream_id: int, device_index: int, device_type: int) -> None:
            flagos.set_stream(torch.Stream(stream_id=stream_id, device_index=device_index, device_type=device_type))

        @staticmethod
        def exchange_device(device: int) -> int:
            return torch._C._accelerator_hooks_exchange_device(device)

        @staticmethod
        def maybe_exchange_device(device: int) -> int:
            return torch._C._accelerator_hooks_maybe_exchange_device(device)

        @staticmethod
        def is_available() -> bool:
            return True

        @staticmethod
        def get_raw_stream(device_idx: int) -> int:
            return 0

        @staticmethod
        def get_device_properties(device: Any = None) -> Any:
            return CpuDeviceProperties(multiprocessing.cpu_count())

        @staticmethod
        def get_compute_capability(device: Any = None) -> str:
            return ""

        @staticmethod
        def is_bf16_supported(including_emulation: bool = False) -> bool:
            return flagos.is_bf16_supported()

        @staticmethod
        def is_triton_capable(device: Any = None) -> bool:
            return False

        @staticmethod
        def raise_if_triton_unavailable(device: Any = None) -> None:
            raise RuntimeError("flagos on the host backing compiles C++ kernels; Triton is not available for it")

    return HostInterface


# ---------------------------------------------------------------------------------------------
# CUDA backing: Triton kernels on CUDA memory labelled flagos


def _cuda_device(device: Any) -> Any:
    """torch.cuda's name for a flagos device (same index); anything else unchanged."""
    if isinstance(device, str) and device.startswith(FLAGOS):
        device = torch.device(device)
    if isinstance(device, torch.device) and device.type == FLAGOS:
        return torch.device("cuda", _index(device))
    return device


def _on_cuda(fn: Any) -> Any:
    """A torch.cuda query that accepts flagos devices."""

    @functools.wraps(fn)
    def call(device: Any = None, *args: Any, **kwargs: Any) -> Any:
        return fn(_cuda_device(device), *args, **kwargs)

    return staticmethod(call)


def _register_cuda_codegen() -> None:
    import torch._inductor.utils as inductor_utils
    from torch._inductor.codegen.common import (
        get_device_op_overrides,
        register_backend_for_device,
        register_device_op_overrides,
    )
    from torch._inductor.codegen.triton import TritonScheduling
    from torch._inductor.codegen.wrapper import PythonWrapperCodegen

    if FLAGOS not in inductor_utils.GPU_TYPES:
        inductor_utils.GPU_TYPES.append(FLAGOS)
    _prefer_flagos_as_gpu_type(inductor_utils)
    register_backend_for_device(FLAGOS, TritonScheduling, PythonWrapperCodegen)
    # flagos:i is cuda:i with another label: the wrapper's streams, guards and syncs are CUDA's.
    register_device_op_overrides(FLAGOS, get_device_op_overrides("cuda"))
    _report_cuda_to_triton()
    _register_cudagraphs()


def _prefer_flagos_as_gpu_type(inductor_utils: Any) -> None:
    """inductor's get_gpu_type() (cached) asserts that one GPU type is available; with flagos over
    CUDA both are. Prime its cache with "flagos", the device this process computes on."""
    saved = list(inductor_utils.GPU_TYPES)
    inductor_utils.get_gpu_type.cache_clear()
    inductor_utils.GPU_TYPES[:] = [FLAGOS]  # other modules hold this list object: edit in place
    try:
        inductor_utils.get_gpu_type()
    finally:
        inductor_utils.GPU_TYPES[:] = saved


def _cuda_interface() -> type:
    from torch._dynamo.device_interface import CudaInterface

    class CudaBackedInterface(CudaInterface):
        """Dynamo's view of flagos over CUDA: torch.cuda answers, for the device of the same index."""

        get_device_properties = _on_cuda(torch.cuda.get_device_properties)
        get_compute_capability = _on_cuda(CudaInterface.get_compute_capability)
        is_triton_capable = _on_cuda(CudaInterface.is_triton_capable)
        raise_if_triton_unavailable = _on_cuda(CudaInterface.raise_if_triton_unavailable)
        synchronize = _on_cuda(torch.cuda.synchronize)
        current_stream = _on_cuda(torch.cuda.current_stream)
        memory_allocated = _on_cuda(torch.cuda.memory_allocated)

        class Worker(CudaInterface.Worker):
            @staticmethod
            def get_device_properties(device: Any = None) -> Any:
                return CudaInterface.Worker.get_device_properties(_cuda_device(device))

    return CudaBackedInterface


def _report_cuda_to_triton() -> None:
    """Device properties of a flagos device are those of its CUDA device, type "cuda" included,
    so Triton compiles for its CUDA target."""
    from torch._inductor.runtime import hints

    create = hints.DeviceProperties.create.__func__  # the cached function behind the classmethod
    if getattr(create, "_flagos", False):
        return

    def create_for_flagos(cls: type, device: Any) -> Any:
        return create(cls, _cuda_device(device))

    create_for_flagos._flagos = True
    hints.DeviceProperties.create = classmethod(create_for_flagos)


# ---------------------------------------------------------------------------------------------
# CUDA graphs (mode="reduce-overhead") for flagos graphs on a CUDA backing


def _register_cudagraphs() -> None:
    """Lets inductor's CUDA graphs (cudagraph trees) wrap compiled flagos graphs.

    Two things keep them from flagos otherwise, both tied to the device type "cuda":

    1. the gate: a compiled graph is cudagraphed only if all its tensors are on one device of type
       "cuda" (`cudagraph_utils.check_multiple_devices_or_any_cpu_nodes`), else inductor logs
       "skipping cudagraphs due to multiple devices: device(type='flagos', index=0)";
    2. the tree manager handles CUDA tensors only: it asserts `is_cuda` on recorded outputs, and
       rebuilds replayed outputs with `torch._C._construct_CUDA_Tensor_From_Storage_And_Metadata`,
       which always gives a tensor CUDA dispatch keys (a flagos storage there would make a tensor
       labelled flagos that dispatches to CUDA kernels).

    So the gate accepts one flagos device as the CUDA device of the same index (never beside a
    real CUDA device), and `compile_fx.cudagraphify` (which both the whole-graph and the
    partitioned paths import from compile_fx when they wrap a graph) gets a boundary, for flagos
    graphs only: the tree manager receives and returns zero-copy CUDA aliases of the flagos
    tensors (same memory, so its data-pointer checks, static inputs and memory pool hold), and
    the compiled graph inside still receives and returns flagos tensors. Capturing flagos work in
    a CUDA graph needs nothing more: flagos kernels run on the current CUDA stream and flagos
    memory comes from CUDA's caching allocator, whose capture pools it thereby joins.
    """
    import torch._inductor.compile_fx as compile_fx
    import torch._inductor.cudagraph_utils as cudagraph_utils

    check = cudagraph_utils.check_multiple_devices_or_any_cpu_nodes
    if not getattr(check, "_flagos", False):

        def check_devices(device_node_mapping: dict[torch.device, Any]) -> str | None:
            return check(_flagos_as_cuda(device_node_mapping))

        check_devices._flagos = True
        cudagraph_utils.check_multiple_devices_or_any_cpu_nodes = check_devices

    cudagraphify = compile_fx.cudagraphify
    if not getattr(cudagraphify, "_flagos", False):

        @functools.wraps(cudagraphify)
        def cudagraphify_flagos(model: Callable[..., Any], *args: Any, **kwargs: Any) -> Callable[..., Any]:
            return over_backing(cudagraphify, model, *args, **kwargs)

        cudagraphify_flagos._flagos = True
        compile_fx.cudagraphify = cudagraphify_flagos


def _flagos_as_cuda(device_node_mapping: dict[torch.device, Any]) -> dict[torch.device, Any]:
    """The mapping with flagos:i read as cuda:i, unless a real CUDA device is in it too."""
    if any(d.type == "cuda" for d in device_node_mapping):
        return device_node_mapping
    return {torch.device("cuda", d.index) if d.type == FLAGOS else d: n for d, n in device_node_mapping.items()}


def over_backing(cudagraphify: Callable[..., Any], model: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """`cudagraphify(model, ...)` with the backing's tensors at its boundary, for flagos graphs.

    Both callables take inductor's boxed calling convention: one list of inputs, which the callee
    empties. The CUDA graph machinery (`cudagraphify`'s function) reads only the addresses of the
    static inputs (parameters, buffers, static caches: most of a decode step's inputs) and keeps
    them, so they cross as the program's own flagos tensors: no alias per call, and a `.data` swap
    changes the address the machinery checks, as on the backing. The other flagos inputs, which the
    machinery copies into its own buffers, cross as CUDA aliases, made per call. `model` gets flagos
    tensors: the static inputs as given, flagos aliases of the others (the machinery's own copies
    while recording, which become its graph's inputs). The outputs `model` gave as flagos tensors
    are handed back as flagos aliases of what the machinery returns (on a replay, its graph's
    static outputs), over the program's own storage where they lie over a static input. Which
    inputs are flagos is read from the first call (a compiled graph's input devices are fixed by
    its guards); a graph without flagos tensors goes through as is.

    One check of the tree manager does not reach through the boundary: when a later replay
    overwrites an output that the program still holds, CUDA raises on access to the stale tensor
    (its storage is marked); the flagos alias of it reads the overwritten memory instead.
    """
    from torch_fl.runtime import as_backing, hand_to_backing
    from torch_fl.runtime.device.core import core

    if "constants" in kwargs:
        kwargs["constants"] = tuple(as_backing(c) if isinstance(c, torch.Tensor) else c for c in kwargs["constants"])
    flagos_inputs: list[int] = []  # positions of flagos tensors among the inputs
    wrapped: Callable[..., Any] | None = None
    static = set(args[0] if args else kwargs.get("static_input_idxs", ()))
    graph_inputs: Any = None  # core().GraphInputs over the aliased inputs, made at the first call
    to_flagos = core().as_flagos

    def on_flagos(inputs: list[Any]) -> Any:
        # Runs only when the machinery warms up or records (a replay runs the graph, not this).
        given = list(inputs)
        inputs.clear()
        args = list(given)
        for i in flagos_inputs:
            args[i] = to_flagos(args[i])  # a static input is flagos already, and stays itself
        outputs = model(args)
        flagos_outputs = [i for i, o in enumerate(outputs) if isinstance(o, torch.Tensor) and o.device.type == FLAGOS]
        graph_inputs.set_outputs(flagos_outputs)
        convert = _shared_aliases(given, hand_to_backing, recording=_recording())
        converted = list(outputs)
        for i in flagos_outputs:
            converted[i] = convert(converted[i])
        return tuple(converted) if isinstance(outputs, tuple) else converted

    def run(inputs: list[Any]) -> Any:
        nonlocal wrapped, graph_inputs
        if wrapped is None:
            flagos_inputs[:] = [
                i for i, x in enumerate(inputs) if isinstance(x, torch.Tensor) and x.device.type == FLAGOS
            ]
            graph_inputs = core().GraphInputs([i for i in flagos_inputs if _crosses_as_alias(i, inputs[i], static)])
            wrapped = cudagraphify(on_flagos, *args, **kwargs)
        converted = graph_inputs.to_backing(inputs)  # a new list
        inputs.clear()
        return graph_inputs.outputs_as_flagos(wrapped(converted))

    return run


def _crosses_as_alias(position: int, tensor: torch.Tensor, static: set[int]) -> bool:
    """Whether a flagos input reaches the machinery as a CUDA alias: all but the static inputs, and
    those the machinery makes non-static for being misaligned (it then copies them as it copies the
    others, into CUDA buffers)."""
    from torch._inductor.utils import ALIGNMENT

    return position not in static or tensor.data_ptr() % ALIGNMENT != 0


def _recording() -> bool:
    """Whether the machinery is recording a CUDA graph (rather than warming up) on this thread."""
    return registered() == "cuda" and torch.cuda.is_current_stream_capturing()


def _shared_aliases(
    given: list[Any], to_backing: Callable[[torch.Tensor], torch.Tensor], *, recording: bool
) -> Callable[[Any], Any]:
    """Converts flagos outputs for the machinery, given its inputs `given`, so that it tells an
    output over an input's buffer as it does on the backing. Warming up, it tells one by storage
    object: an output over a backing input shares that input's storage, and one over a static
    input (a flagos tensor) stays the program's flagos tensor. Recording, it tells one by address
    and asserts that every output is a CUDA tensor: an output over a static input becomes an owning
    alias, which the replays return and `GraphInputs.outputs_as_flagos` turns back into a tensor
    over the program's own storage. Outputs over one new buffer share one storage object, made by
    `to_backing` (`hand_to_backing` for the tree manager, which frees outputs of its pool through
    the backing allocator's own deleter)."""
    from torch_fl.runtime import as_backing

    by_buffer = {
        x.untyped_storage().data_ptr(): x.untyped_storage()
        for x in given
        if isinstance(x, torch.Tensor) and x.untyped_storage().data_ptr()
    }

    def convert(output: torch.Tensor) -> torch.Tensor:
        buffer = output.untyped_storage().data_ptr()
        storage = by_buffer.get(buffer)
        if storage is None or storage.nbytes() < output.untyped_storage().nbytes():
            alias = to_backing(output)
            if buffer:
                by_buffer[buffer] = alias.untyped_storage()
            return alias
        if storage.device.type == FLAGOS:
            return as_backing(output) if recording else output
        view = torch.empty(0, dtype=output.dtype, device=storage.device)
        return view.set_(storage, output.storage_offset(), output.size(), output.stride())

    return convert
