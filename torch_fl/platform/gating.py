"""Conformance gating: which op x dtype x path combinations a platform may route to.

`native` and `cpu` run PyTorch's own kernels (the backing device's, or the host's) and need no
proof, so they are always allowed and a platform never ends up with nothing. `flaggems`,
`vendor` and `emulated` are allowed only for the combinations a valid record shows passing:
at least one passed case and no failing one (skipped cases are neutral: they were not tried).
A user who forces an unvalidated platform (FLAGOS_ALLOW_UNVALIDATED=1) gets every declared
kernel set, and a warning.
"""
from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from torch_fl import env
from torch_fl.platform.descriptor import PlatformDescriptor
from torch_fl.platform.record import RecordStatus, installed_kernel_versions, record_status

ALWAYS_ALLOWED = frozenset({"native", "cpu"})


def _dtype_name(dtype: Any) -> str | None:
    """`torch.float32` or `"float32"` -> `"float32"`, without importing torch."""
    return None if dtype is None else str(dtype).removeprefix("torch.")


class Gate:
    """Answers `allows(op, dtype, path)` for one platform from its record's status."""

    def __init__(self, descriptor: PlatformDescriptor, status: RecordStatus, forced: bool = False) -> None:
        self.descriptor = descriptor
        self.status = status
        self.forced = forced and status.state != "valid"
        self._declared = frozenset(descriptor.kernels.declared())
        self._proven: dict[tuple[str | None, str | None, str], bool] = {}
        if status.state == "valid" and status.record is not None:
            for case in status.record.cases:
                if case.path is None or case.path in ALWAYS_ALLOWED or case.status == "skipped":
                    continue
                key = (case.op, case.dtype, case.path)
                self._proven[key] = self._proven.get(key, True) and case.status == "passed"

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
        # native and cpu need no proof, so their cases (most of a record) are not even read
        status = record_status(descriptor, folder, torch_version, versions, skip_paths=ALWAYS_ALLOWED)
        return cls(descriptor, status, env.flag("FLAGOS_ALLOW_UNVALIDATED") if forced is None else forced)

    @property
    def state(self) -> str:
        return self.status.state

    def allows(self, op: str, dtype: Any, path: str) -> bool:
        """May `op` (an aten overload) in `dtype` run on kernel set `path` here?"""
        if path in ALWAYS_ALLOWED:
            return True
        if path not in self._declared:
            return False
        if self.forced:
            return True
        return self._proven.get((op, _dtype_name(dtype), path), False)

    def warning(self) -> str | None:
        """The one-line warning the runtime prints once, or None when the record is valid."""
        if self.status.state == "valid":
            return None
        name = self.descriptor.name
        why = "no conformance record" if self.status.state == "missing" else "a stale conformance record"
        detail = "; ".join(self.status.reasons)
        fix = f"make one with: torch-fl conformance run {name}"
        if self.forced:
            return (
                f"torch-fl: platform {name!r} has {why} ({detail}); FLAGOS_ALLOW_UNVALIDATED=1 enables "
                f"all declared kernel sets unvalidated; {fix}"
            )
        return f"torch-fl: platform {name!r} has {why} ({detail}); only native and cpu routes run; {fix}"
