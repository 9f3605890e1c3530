"""What a suite sees of the run (the `fl` fixture): the platform under test, its routes, and cases.

Activation happens here, lazily, inside a worker: a platform that fails to start fails every item
with the reason instead of killing the run. Once active, every op the platform routes is pinned
to `native` for this process, so an unforced ("plain") run is the native route whatever the
record or routes.yaml say, and forcing one op onto one path changes only that op.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, field
from typing import Any

from torch_fl.conformance.recorder import CaseInfo, Recorder

PYTHON_PATHS = frozenset({"flaggems", "vendor", "emulated"})
"""Paths served by a Python route kernel (native and cpu are the C++ core's)."""


@dataclass
class Session:
    """The run as one worker sees it."""

    platform_name: str
    recorder: Recorder
    paths: frozenset[str] | None
    samples: int
    sweep: str = "all"
    descriptor: Any = None
    candidates_by_op: dict[str, list[str]] = field(default_factory=dict)
    routed_off_native: set[str] = field(default_factory=set)
    default_candidates: list[str] = field(default_factory=list)
    activation_error: str | None = None
    _active: bool = False

    # ---- the platform
    def activate(self) -> None:
        """Start the platform once; pin routed ops to native; remember each op's candidates."""
        if self._active:
            return
        if self.activation_error is not None:
            raise RuntimeError(self.activation_error)
        try:
            import torch_fl
            from torch_fl.kernels.flaggems import untimed_autotuning
            from torch_fl.routing import router

            untimed_autotuning()  # conformance proves kernels, it does not tune them
            active = torch_fl.activate(self.platform_name)
            r = router()
            self.descriptor = active.descriptor
            self.default_candidates = list(r.default_candidates())
            for op in sorted(r.routed_ops()):
                plan = r.plan(op)
                self.candidates_by_op[op] = list(plan.candidates)
                buckets = plan.route.buckets if plan.route is not None else []
                if plan.candidates[:1] != ["native"] or any(b.choice != "native" for b in buckets):
                    self.routed_off_native.add(op)
                r.set_route(op, ["native"])
            r.key_listener = self.recorder.note_key
        except Exception as exc:
            self.activation_error = (
                f"platform {self.platform_name!r} could not be activated: {type(exc).__name__}: {exc}"
            )
            raise RuntimeError(self.activation_error) from exc
        self._active = True

    @property
    def backing(self) -> str:
        self.activate()
        return str(self.descriptor.backing.device)

    def candidates(self, op: str) -> list[str]:
        """The op's paths to check, limited to the selected ones: those the platform declares, then
        every other Python kernel set that implements the op. A route table is a preference that a
        person, the tuner or FLAGOS_ROUTE_DEFAULTS may reorder; the record must say what each path
        can do (a table that keeps FlagGems' layer-norm backward off does not make it safe to run)."""
        from torch_fl.routing import router

        self.activate()
        declared = self.candidates_by_op.get(op, self.default_candidates)
        others = [p for p in router().kernel_sets if p in PYTHON_PATHS and p not in declared and self.implements(op, p)]
        return [p for p in declared + others if self.selected(p)]

    def selected(self, path: str) -> bool:
        return self.paths is None or path in self.paths

    def implements(self, op: str, path: str) -> bool:
        from torch_fl.routing import router

        kernels = router().kernel_sets.get(path)
        return kernels is not None and kernels.implements(op)

    @contextmanager
    def forced(self, op: str, path: str) -> Iterator[None]:
        """Route `op` through `path` only (gate bypassed) for the duration."""
        from torch_fl.routing import forced

        with forced(op, path):
            yield

    def synchronize(self) -> None:
        """Wait for queued device work, so an asynchronous kernel error surfaces in its own case."""
        import torch

        if self.backing != "cpu":
            torch.flagos.synchronize()

    # ---- cases
    def done(self, case_id: str) -> bool:
        return self.recorder.is_done(case_id)

    @property
    def case(self) -> Callable[..., AbstractContextManager[CaseInfo]]:
        """A context manager recording one case: the recorder's (see Recorder.case)."""
        return self.recorder.case

    def own_cases(self) -> None:
        """This item journals its cases itself: it has no case of its own unless it breaks."""
        self.recorder.used_cases = True

    def meta(self, op: str | None = None, dtype: str | None = None, path: str | None = None) -> None:
        """Name the op / dtype / path of the current item's own case (simple, one-case items)."""
        case: CaseInfo | None = self.recorder.item_case
        if case is None:
            return
        case.op = op if op is not None else case.op
        case.dtype = dtype if dtype is not None else case.dtype
        case.path = path if path is not None else case.path

    def note(self, text: str) -> None:
        """A remark kept in the item's case message when it passes (e.g. what was measured)."""
        if self.recorder.item_case is not None:
            self.recorder.item_case.notes.append(text)
