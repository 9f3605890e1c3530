"""Conformance gating: which op x gate key x path combinations a platform may route to.

`native` and `cpu` run PyTorch's own kernels (the backing device's, or the host's) and need no
proof, so they are always allowed and a platform never ends up with nothing. `flaggems`,
`vendor` and `emulated` are allowed only for the gate keys (torch_fl.routing.gatekey: the dtypes
of every argument and the size class of a call) that a valid record shows passing, with no
failing case at any size: one failing case refuses its op x dtypes x path at every size class,
the ones that passed included (a kernel that breaks past some extent is not trusted short of it
either, where the sweep happened not to cross that extent). Within a proven key, a call is served
only up to the largest extents (torch_fl.platform.extents) the passing cases reached, and within
the limits the descriptor declares for the path (`kernels.<path>.constraints`), which also
apply when the gate is forced. A user who forces an unvalidated platform (FLAGOS_ALLOW_UNVALIDATED=1) gets every
declared kernel set, and a warning; a descriptor cannot set that variable for itself.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from torch_fl import env
from torch_fl.platform.descriptor import DimLimit, PlatformDescriptor
from torch_fl.platform.record import ANY_KEY, RecordStatus, installed_kernel_versions, record_status, without_size

Limits = dict[str, tuple[int, int]]
"""Named extent -> (smallest, largest or -1): what the gate lets a path serve of one key."""

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
        # (op, path, dtypes) -> the largest extents proven; None: a record older than extents
        self._reached: dict[tuple[str, str, str], dict[str, int]] | None = None
        if status.state == "valid" and status.record is not None and status.record.limits is not None:
            self._reached = {
                (op, path, dtypes): reached
                for op, paths in status.record.limits.items()
                for path, families in paths.items()
                for dtypes, reached in families.items()
            }

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

    def declared(self, op: str, path: str) -> dict[str, DimLimit]:
        """The limits the descriptor declares for `op` on `path` (extent -> DimLimit)."""
        return self.descriptor.kernels.constraints(path).get(op, {})

    def limits(self, op: str, path: str, key: str) -> Limits:
        """What `path` may serve of `op`'s calls of gate key `key`, per named extent: up to the
        largest extent proven (unless forced), within the declared limits; empty: no limit."""
        out: Limits = {}
        if path in ALWAYS_ALLOWED:
            return out
        if not self.forced and self._reached is not None:
            # a key proven by cases that kept no extents reaches nothing beyond the empty call
            reached = self._reached.get((op, path, without_size(key)), {"numel": 0})
            out = {name: (0, largest) for name, largest in reached.items()}
        for name, limit in self.declared(op, path).items():
            low, high = out.get(name, (0, -1))
            low = max(low, limit.min or 0)
            if limit.max is not None:
                high = limit.max if high < 0 else min(high, limit.max)
            out[name] = (low, high)
        return out

    def measures(self, op: str, path: str) -> bool:
        """Must calls of `op` be measured before `path` serves them (a record with extents, or declared limits)?"""
        return path not in ALWAYS_ALLOWED and (
            (self._reached is not None and not self.forced) or bool(self.declared(op, path))
        )

    def within(self, op: str, path: str, key: str, extents: dict[str, int]) -> bool:
        """May `path` serve a call of `op` with gate key `key` and these extents (key already allowed)?"""
        return fits(self.limits(op, path, key), extents)

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


def fits(limits: Limits, extents: dict[str, int]) -> bool:
    """Are a call's extents within `limits`?"""
    for name, (low, high) in limits.items():
        value = extents.get(name, 0)
        if value < low or (high >= 0 and value > high):
            return False
    return True
