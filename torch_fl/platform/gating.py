"""Conformance gating: which op x gate key x path combinations a platform may route to.

`native` and `cpu` run PyTorch's own kernels (the backing device's, or the host's) and need no
proof, so they are always allowed and a platform never ends up with nothing. `flaggems`,
`vendor` and `emulated` are allowed only for the gate keys (torch_fl.routing.gatekey: the dtypes
of every argument and the size class of a call) that a valid record shows passing, with no
failing case at any size: one failing case refuses its op x dtypes x path at every size class,
the ones that passed included (a kernel that breaks past some extent is not trusted short of it
either, where the sweep happened not to cross that extent). A user who forces an unvalidated platform (FLAGOS_ALLOW_UNVALIDATED=1) gets every
declared kernel set, and a warning; a descriptor cannot set that variable for itself.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from torch_fl import env
from torch_fl.platform.descriptor import PlatformDescriptor
from torch_fl.platform.record import ANY_KEY, RecordStatus, installed_kernel_versions, record_status, without_size

ALWAYS_ALLOWED = frozenset({"native", "cpu"})


class Gate:
    """Answers `allows(op, key, path)` for one platform from its record's status."""

    def __init__(self, descriptor: PlatformDescriptor, status: RecordStatus, forced: bool = False) -> None:
        self.descriptor = descriptor
        self.status = status
        self.forced = forced and status.state != "valid"
        self._declared = frozenset(descriptor.kernels.declared())
        # (op, path) -> the keys proven; a key that failed at any size, or an ANY_KEY veto, proves nothing
        self._proven: dict[tuple[str, str], frozenset[str]] = {}
        if status.state == "valid" and status.record is not None:
            for op, paths in status.record.gate.items():
                for path, verdicts in paths.items():
                    if verdicts.get(ANY_KEY) == "failed":
                        continue
                    refused = {without_size(k) for k, v in verdicts.items() if v == "failed"}
                    self._proven[(op, path)] = frozenset(
                        k for k, v in verdicts.items() if v == "passed" and without_size(k) not in refused
                    )

    @classmethod
    def for_platform(
        cls,
        descriptor: PlatformDescriptor,
        torch_version: str | None,
        directory: Path | None = None,
        kernel_versions: Mapping[str, str | None] | None = None,
        forced: bool | None = None,
    ) -> Gate:
        """Build the gate from the platform's folder, the running torch and the installed kernels.

        `forced` defaults to FLAGOS_ALLOW_UNVALIDATED; `kernel_versions` to the installed ones.
        """
        folder = directory if directory is not None else descriptor.directory
        if folder is None:
            raise ValueError("the descriptor was not loaded from a file; pass its directory")
        versions = installed_kernel_versions(descriptor) if kernel_versions is None else kernel_versions
        status = record_status(descriptor, folder, torch_version, versions)
        return cls(descriptor, status, env.flag("FLAGOS_ALLOW_UNVALIDATED") if forced is None else forced)

    @property
    def state(self) -> str:
        return self.status.state

    def allows(self, op: str, key: str | None, path: str) -> bool:
        """May `op` (an aten overload) run on kernel set `path` for a call of gate key `key`?

        `key` None asks whether it may for some key (whether the op needs a route kernel at all).
        """
        if path in ALWAYS_ALLOWED:
            return True
        if path not in self._declared:
            return False
        if self.forced:
            return True
        proven = self._proven.get((op, path))
        if not proven:
            return False
        return True if key is None else key in proven

    def proven_keys(self, op: str, path: str) -> frozenset[str]:
        """The gate keys `op` may run on `path` for (every key when forced)."""
        return self._proven.get((op, path), frozenset())

    def warning(self) -> str | None:
        """The one-line warning the runtime prints once, or None when the record is valid."""
        if self.status.state == "valid":
            return None
        name = self.descriptor.name
        why = {"missing": "no conformance record", "tampered": "a tampered conformance record"}.get(
            self.status.state, "a stale conformance record"
        )
        detail = "; ".join(self.status.reasons)
        fix = f"make one with: torch-fl conformance run {name}"
        if self.forced:
            return (
                f"torch-fl: platform {name!r} has {why} ({detail}); FLAGOS_ALLOW_UNVALIDATED=1 enables "
                f"all declared kernel sets unvalidated; {fix}"
            )
        return f"torch-fl: platform {name!r} has {why} ({detail}); only native and cpu routes run; {fix}"
