"""The `flagos` collective backend of torch.distributed.

`register(backing)` makes `init_process_group("flagos")`, and a plain `init_process_group()` in a
process where flagos is the accelerator, build a `FlagosProcessGroup`. It owns the backing
device's own collective library and runs every collective on zero-copy backing aliases of the
flagos tensors (`torch_fl.as_backing`), so no byte is copied:

- host backing: one gloo group serves flagos tensors (as CPU aliases) and CPU tensors alike;
- CUDA backing: an NCCL group serves flagos tensors (as CUDA aliases) and a gloo group serves CPU
  tensors (object collectives, CPU barriers). NCCL orders its work after the *current* CUDA stream
  of the aliased device, which is the current flagos stream (the flagos guard forwards streams to
  CUDA), and `Work.wait()` makes the waiter's current stream wait for NCCL, as on plain CUDA.

Collectives on flagos tensors return a `FlagosWork`: `wait()` waits for the inner work, and
`get_future()` completes with the *flagos* tensors (never the aliases), on CUDA with the stream
semantics of a CUDA future, so DDP's reducer and communication hooks see flagos tensors.

Served: broadcast, allreduce, allreduce_coalesced, reduce, allgather, allgather_coalesced,
all_gather_single (`_allgather_base`), all_gather_single_coalesced
(`allgather_into_tensor_coalesced`), reduce_scatter, reduce_scatter_single (`_reduce_scatter_base`),
reduce_scatter_single_coalesced (`reduce_scatter_tensor_coalesced`), gather, scatter, alltoall,
all_to_all_single (`alltoall_base`), send, recv, recv_anysource, barrier, monitored_barrier
(CPU), _start_coalescing/_end_coalescing (forwarded to NCCL). Both method names of each renamed
collective are provided, so the group works with torch 2.11 and 2.13 alike.

Entered from C++: DDP's reducer and the functional all_reduce reach the Python methods above
through c10d's trampoline. Functional all_gather/reduce_scatter (DTensor redistribution such as
`full_tensor()`, compiled collectives) do not: c10d dispatches them on the tensors' device to
the group's registered backend. On the host backing that is gloo, which works on flagos host
memory directly (tested); on CUDA backing NCCL would receive flagos tensors, which is not
verified and is expected to fail.
"""

from __future__ import annotations

import datetime
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import torch
import torch.distributed as dist

from torch_fl.runtime.device import core as device_core

BACKEND_NAME = "flagos"
FLAGOS = "flagos"

_registered_backing: str | None = None
# torch builds without distributed support have neither class; register() then does nothing.
_Work: type = dist.Work if dist.is_available() else object
_ProcessGroup: type = dist.ProcessGroup if dist.is_available() else object


def register(backing: str) -> None:
    """Registers the `flagos` c10d backend for the flagos device. Idempotent."""
    global _registered_backing
    if not dist.is_available():
        return
    if _registered_backing is not None:
        if _registered_backing != backing:
            raise RuntimeError(f"the flagos collectives are registered for '{_registered_backing}', not '{backing}'")
        return
    if backing not in ("cpu", "cuda"):
        raise RuntimeError(f"no collective library is known for the backing device '{backing}'")
    if not dist.is_gloo_available():
        raise RuntimeError("the flagos collectives need gloo, which this torch build lacks")
    if backing == "cuda" and not dist.is_nccl_available():
        raise RuntimeError("the flagos collectives on CUDA backing need NCCL, which this torch build lacks")
    # devices: flagos tensors, and CPU tensors for object collectives; the map entry for "cpu" stays
    # gloo (register_backend only claims devices that have no default yet), "flagos" becomes ours.
    dist.Backend.register_backend(BACKEND_NAME, _create, devices=[FLAGOS, "cpu"])
    _registered_backing = backing


def registered() -> bool:
    return _registered_backing is not None


def _create(store: dist.Store, rank: int, size: int, timeout: datetime.timedelta) -> FlagosProcessGroup:
    return FlagosProcessGroup(store, rank, size, timeout)


# ---------------------------------------------------------------------------------------------
# tensors: flagos <-> backing aliases


def _is_flagos(t: Any) -> bool:
    return isinstance(t, torch.Tensor) and t.device.type == FLAGOS


def _flat(tree: Any) -> Iterable[torch.Tensor]:
    if isinstance(tree, torch.Tensor):
        yield tree
    elif isinstance(tree, (list, tuple)):
        for item in tree:
            yield from _flat(item)


def _alias(tree: Any) -> Any:
    """The same structure with every flagos tensor replaced by its zero-copy backing alias."""
    if isinstance(tree, torch.Tensor):
        return device_core.core().as_backing(tree) if tree.device.type == FLAGOS else tree
    if isinstance(tree, (list, tuple)):
        return [_alias(item) for item in tree]
    return tree


class FlagosWork(_Work):
    """The work of one collective on flagos tensors, run as one or more inner works.

    `result` is what the future of the equivalent native collective holds (the output tensors),
    as flagos tensors; the inner works keep the aliases, and so the flagos storages, alive.
    """

    def __init__(self, works: Sequence[dist.Work | None], result: list[Any], devices: list[torch.device]) -> None:
        super().__init__()
        # A blocking collective (asyncOp=False) may return no work: it has already ordered the
        # current stream after itself, so there is nothing left to wait for.
        self._works = [work for work in works if work is not None]
        self._result = result
        self._devices = devices
        self._future: torch.futures.Future | None = None

    def wait(self, timeout: datetime.timedelta | None = None) -> bool:
        for work in self._works:
            if timeout is None or timeout == datetime.timedelta(0):
                work.wait()
            else:
                work.wait(timeout)
        return True

    def is_completed(self) -> bool:
        return all(work.is_completed() for work in self._works)

    def is_success(self) -> bool:
        return all(work.is_success() for work in self._works)

    def exception(self) -> Any:
        for work in self._works:
            exc = work.exception()
            if exc is not None:
                return exc
        return None

    def source_rank(self) -> int:
        return self._works[0].source_rank() if self._works else -1

    def _source_rank(self) -> int:
        return self._works[0]._source_rank() if self._works else -1

    def result(self) -> list[Any]:
        return self._result

    def synchronize(self) -> None:
        for work in self._works:
            work.synchronize()

    def get_future(self) -> torch.futures.Future:
        if self._future is None:
            self._future = self._make_future()
        return self._future

    def _make_future(self) -> torch.futures.Future:
        inner: list[torch.futures.Future] = []
        for work in self._works:
            try:
                inner.append(work.get_future())
            except RuntimeError:
                # Some backends (gloo's reduce_scatter) have no future: complete after the wait.
                inner = []
                break
        if not inner:
            # No inner work, or no future for it: complete once the work is done (on CUDA, the
            # result's events are recorded on the current stream, which the wait has ordered).
            done: torch.futures.Future = torch.futures.Future(devices=self._devices)
            self.wait()
            done.set_result(self._result)
            return done
        if len(inner) == 1:
            # One inner future: complete ours from its callback, where the current streams are
            # those the callback runs on (synchronised with the collective on CUDA), so our
            # future records its events after the collective's.
            out: torch.futures.Future = torch.futures.Future(devices=self._devices)
            result = self._result

            def finish(fut: torch.futures.Future) -> None:
                try:
                    fut.value()
                except Exception as exc:  # noqa: BLE001 - forwarded to the waiter
                    out.set_exception(exc)
                    return
                out.set_result(result)

            inner[0].add_done_callback(finish)
            return out
        # Several inner works happen only on the host backing (no streams to order).
        return torch.futures.collect_all(inner).then(lambda _: self._result)


# ---------------------------------------------------------------------------------------------
# the process group


def _gloo(store: dist.Store, rank: int, size: int, timeout: datetime.timedelta) -> dist.ProcessGroupGloo:
    return dist.ProcessGroupGloo(store, rank, size, timeout)


def _nccl(store: dist.Store, rank: int, size: int, timeout: datetime.timedelta) -> Any:
    opts = dist.ProcessGroupNCCL.Options()
    opts._timeout = timeout
    opts.is_high_priority_stream = False
    return dist.ProcessGroupNCCL(store, rank, size, opts)


class FlagosProcessGroup(_ProcessGroup):
    """A c10d process group for flagos tensors over the backing device's collective library."""

    def __init__(self, store: dist.Store, rank: int, size: int, timeout: datetime.timedelta) -> None:
        super().__init__(rank, size)
        self._backing = device_core.backing()
        self._timeout = timeout
        # Separate key spaces, so the inner groups' rendezvous never collide.
        self._host = _gloo(dist.PrefixStore("gloo/", store), rank, size, timeout)
        if self._backing == "cuda":
            self._device = _nccl(dist.PrefixStore("nccl/", store), rank, size, timeout)
        else:
            self._device = self._host
        # Let torch.distributed find the inner backends by device (object collectives ask for the
        # CPU one, FSDP2 and DeviceMesh may ask for the accelerator's).
        self._register_backend(torch.device("cpu"), dist.ProcessGroup.BackendType.GLOO, self._host)
        if self._backing == "cuda":
            self._register_backend(torch.device("cuda"), dist.ProcessGroup.BackendType.NCCL, self._device)

    # -- identity

    def getBackendName(self) -> str:  # noqa: N802 - c10d's virtual
        return BACKEND_NAME

    def _get_backend_name(self) -> str:
        return BACKEND_NAME

    def name(self) -> str:
        return BACKEND_NAME

    @property
    def inner(self) -> Any:
        """The collective library serving flagos tensors (gloo or NCCL)."""
        return self._device

    # -- routing

    def _route(self, *trees: Any) -> tuple[Any, bool]:
        """(inner backend, whether flagos tensors are involved) for a call's tensors."""
        types = {t.device.type for tree in trees for t in _flat(tree)}
        if FLAGOS in types:
            if types - {FLAGOS}:
                raise ValueError(f"a collective cannot mix flagos tensors with tensors on {sorted(types - {FLAGOS})}")
            return self._device, True
        if types <= {"cpu"}:
            return self._host, False
        if types <= {self._backing}:
            return self._device, False
        raise ValueError(f"the flagos process group serves flagos and cpu tensors, not {sorted(types)}")

    def _devices(self, tensors: Any) -> list[torch.device]:
        if self._backing != "cuda":
            return []  # host futures carry no stream events
        indices = sorted({t.device.index for t in _flat(tensors) if _is_flagos(t)})
        return [torch.device(FLAGOS, i) for i in indices]

    def _run(self, call: Callable[[Any, Callable[[Any], Any]], Any], result: Any, *trees: Any) -> Any:
        """Runs `call(inner, alias)` and wraps its work when flagos tensors take part."""
        inner, on_flagos = self._route(*trees)
        if not on_flagos:
            return call(inner, lambda tree: tree)
        work = call(inner, _alias)
        return FlagosWork([work], result, self._devices(trees))

    # -- collectives

    def broadcast(self, tensors: list[torch.Tensor], opts: Any) -> Any:
        return self._run(lambda pg, a: pg.broadcast(a(tensors), opts), tensors, tensors)

    def allreduce(self, tensors: list[torch.Tensor], opts: Any) -> Any:
        return self._run(lambda pg, a: pg.allreduce(a(tensors), opts), tensors, tensors)

    def allreduce_coalesced(self, tensors: list[torch.Tensor], opts: Any) -> Any:
        return self._run(lambda pg, a: pg.allreduce_coalesced(a(tensors), opts), tensors, tensors)

    def reduce(self, tensors: list[torch.Tensor], opts: Any) -> Any:
        return self._run(lambda pg, a: pg.reduce(a(tensors), opts), tensors, tensors)

    def allgather(self, output_tensors: list[list[torch.Tensor]], input_tensors: list[torch.Tensor], opts: Any) -> Any:
        return self._run(
            lambda pg, a: pg.allgather(a(output_tensors), a(input_tensors), opts),
            output_tensors,
            output_tensors,
            input_tensors,
        )

    def allgather_coalesced(
        self, output_lists: list[list[torch.Tensor]], input_list: list[torch.Tensor], opts: Any
    ) -> Any:
        return self._run(
            lambda pg, a: pg.allgather_coalesced(a(output_lists), a(input_list), opts),
            output_lists,
            output_lists,
            input_list,
        )

    def all_gather_single(self, output: torch.Tensor, input: torch.Tensor, opts: Any) -> Any:  # noqa: A002
        return self._run(lambda pg, a: pg._allgather_base(a(output), a(input), opts), [output], output, input)

    _allgather_base = all_gather_single

    def all_gather_single_coalesced(self, outputs: list[torch.Tensor], inputs: list[torch.Tensor], opts: Any) -> Any:
        return self._coalesced("_allgather_base", outputs, inputs, opts)

    allgather_into_tensor_coalesced = all_gather_single_coalesced

    def reduce_scatter(
        self, output_tensors: list[torch.Tensor], input_lists: list[list[torch.Tensor]], opts: Any
    ) -> Any:
        return self._run(
            lambda pg, a: pg.reduce_scatter(a(output_tensors), a(input_lists), opts),
            output_tensors,
            output_tensors,
            input_lists,
        )

    def reduce_scatter_single(self, output: torch.Tensor, input: torch.Tensor, opts: Any) -> Any:  # noqa: A002
        return self._run(lambda pg, a: pg._reduce_scatter_base(a(output), a(input), opts), [output], output, input)

    _reduce_scatter_base = reduce_scatter_single

    def reduce_scatter_single_coalesced(
        self, outputs: list[torch.Tensor], inputs: list[torch.Tensor], opts: Any
    ) -> Any:
        return self._coalesced("_reduce_scatter_base", outputs, inputs, opts)

    reduce_scatter_tensor_coalesced = reduce_scatter_single_coalesced

    def gather(self, output_lists: list[list[torch.Tensor]], input_tensors: list[torch.Tensor], opts: Any) -> Any:
        return self._run(
            lambda pg, a: pg.gather(a(output_lists), a(input_tensors), opts),
            output_lists,
            output_lists,
            input_tensors,
        )

    def scatter(self, output_tensors: list[torch.Tensor], input_lists: list[list[torch.Tensor]], opts: Any) -> Any:
        return self._run(
            lambda pg, a: pg.scatter(a(output_tensors), a(input_lists), opts),
            output_tensors,
            output_tensors,
            input_lists,
        )

    def alltoall(self, output_tensors: list[torch.Tensor], input_tensors: list[torch.Tensor], opts: Any) -> Any:
        return self._run(
            lambda pg, a: pg.alltoall(a(output_tensors), a(input_tensors), opts),
            output_tensors,
            output_tensors,
            input_tensors,
        )

    def all_to_all_single(
        self,
        output: torch.Tensor,
        input: torch.Tensor,
        output_split_sizes: list[int],  # noqa: A002
        input_split_sizes: list[int],
        opts: Any,
    ) -> Any:
        return self._run(
            lambda pg, a: pg.alltoall_base(a(output), a(input), output_split_sizes, input_split_sizes, opts),
            [output],
            output,
            input,
        )

    alltoall_base = all_to_all_single

    def send(self, tensors: list[torch.Tensor], dst: int, tag: int) -> Any:
        return self._run(lambda pg, a: pg.send(a(tensors), dst, tag), tensors, tensors)

    def recv(self, tensors: list[torch.Tensor], src: int, tag: int) -> Any:
        return self._run(lambda pg, a: pg.recv(a(tensors), src, tag), tensors, tensors)

    def recv_anysource(self, tensors: list[torch.Tensor], tag: int) -> Any:
        return self._run(lambda pg, a: pg.recv_anysource(a(tensors), tag), tensors, tensors)

    def barrier(self, opts: Any = None) -> Any:
        if self._backing != "cuda":
            return self._host.barrier(dist.BarrierOptions() if opts is None else opts)
        # NCCL's barrier, on the CUDA device behind the current (or named) flagos device, so it
        # also orders the device work, as a barrier of a plain NCCL group does.
        inner = dist.BarrierOptions()
        if opts is not None:
            inner.timeout = opts.timeout
            inner.device_ids = list(opts.device_ids)
            if hasattr(inner, "asyncOp"):
                inner.asyncOp = opts.asyncOp
        index = inner.device_ids[0] if inner.device_ids else device_core.core().current_device()
        inner.device = torch.device("cuda", index)
        return self._device.barrier(inner)

    def monitored_barrier(self, timeout: datetime.timedelta | None = None, wait_all_ranks: bool = False) -> None:
        self._host.monitored_barrier(self._timeout if timeout is None else timeout, wait_all_ranks)

    # -- coalescing

    def _coalesced(self, method: str, outputs: list[torch.Tensor], inputs: list[torch.Tensor], opts: Any) -> Any:
        """N single-tensor collectives as one work: one NCCL group call, or gloo's ordered queue."""
        inner, on_flagos = self._route(outputs, inputs)
        a = _alias if on_flagos else (lambda tree: tree)
        pairs = list(zip(a(outputs), a(inputs)))
        if inner is self._host:
            works = [getattr(inner, method)(out, inp, opts) for out, inp in pairs]
            return FlagosWork(works, list(outputs), [])
        device = pairs[0][0].device if pairs else torch.device(self._backing)
        inner._start_coalescing(device)
        for out, inp in pairs:
            getattr(inner, method)(out, inp, opts)
        work = inner._end_coalescing(device)
        if not on_flagos:
            return work
        return FlagosWork([work], list(outputs), self._devices([outputs, inputs]))

    def _start_coalescing(self, device: torch.device) -> None:
        self._backend_for(device)._start_coalescing(self._backing_device(device))

    def _end_coalescing(self, device: torch.device) -> Any:
        return self._backend_for(device)._end_coalescing(self._backing_device(device))

    def _backend_for(self, device: torch.device) -> Any:
        return self._host if torch.device(device).type == "cpu" else self._device

    def _backing_device(self, device: torch.device) -> torch.device:
        device = torch.device(device)
        if device.type != FLAGOS:
            return device
        if self._backing == "cpu":
            return torch.device("cpu")
        return torch.device(
            self._backing, device.index if device.index is not None else device_core.core().current_device()
        )

    # -- lifetime

    def shutdown(self) -> None:
        for inner in {id(self._host): self._host, id(self._device): self._device}.values():
            if hasattr(inner, "shutdown"):
                inner.shutdown()

    def abort(self) -> None:
        for inner in {id(self._host): self._host, id(self._device): self._device}.values():
            if hasattr(inner, "abort"):
                inner.abort()
