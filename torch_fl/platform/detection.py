"""Evaluate descriptors' detection rules on this machine, without importing torch or the runtime.

`cuda_device_name` rules look at torch only if the process already imported it (sys.modules):
detection must be cheap and must not initialise CUDA behind the user's back, so without torch
those rules are skipped, and the result says so.
"""

from __future__ import annotations

import importlib.util
import os
import re
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from torch_fl.platform.descriptor import (
    AlwaysRule,
    CudaDeviceNameRule,
    EnvRule,
    PathExistsRule,
    PlatformDescriptor,
    PythonModuleRule,
    Rule,
)


@dataclass(frozen=True)
class RuleResult:
    """One rule's outcome: matched True/False, or None when it could not be evaluated here."""

    rule: str
    matched: bool | None
    reason: str


@dataclass(frozen=True)
class Detection:
    """A platform's detection outcome: matched when any rule matched."""

    name: str
    priority: int
    results: tuple[RuleResult, ...]

    @property
    def matched(self) -> bool:
        return any(r.matched for r in self.results)

    def summary(self) -> str:
        """The matching rule's reason, or every rule's reason when none matched."""
        hits = [r for r in self.results if r.matched]
        shown = hits[:1] or list(self.results)
        return "; ".join(f"{r.rule}: {r.reason}" for r in shown) or "no detection rules"


def _cuda_device_names() -> tuple[list[str] | None, str]:
    torch = sys.modules.get("torch")
    if torch is None:
        return None, "skipped: torch is not imported"
    try:
        if not torch.cuda.is_available():
            return [], "CUDA is not available"
        return [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())], ""
    except Exception as exc:  # a broken driver must not break detection of other platforms
        return [], f"CUDA query failed: {exc}"


def evaluate_rule(rule: Rule) -> RuleResult:
    """Evaluate one rule here and now."""
    if isinstance(rule, AlwaysRule):
        return RuleResult("always", True, "always matches")
    if isinstance(rule, EnvRule):
        # The variable is named by the descriptor, not a torch-fl setting, so it is read directly.
        hit = bool(os.environ.get(rule.env))
        return RuleResult(f"env {rule.env}", hit, "is set" if hit else "is not set")
    if isinstance(rule, PathExistsRule):
        hit = Path(rule.path_exists).exists()
        return RuleResult(f"path_exists {rule.path_exists}", hit, "exists" if hit else "does not exist")
    if isinstance(rule, PythonModuleRule):
        try:
            hit = importlib.util.find_spec(rule.python_module) is not None
        except (ImportError, ValueError):
            hit = False
        return RuleResult(f"python_module {rule.python_module}", hit, "importable" if hit else "not importable")
    assert isinstance(rule, CudaDeviceNameRule)
    label = f"cuda_device_name {rule.cuda_device_name!r}"
    names, why = _cuda_device_names()
    if names is None:
        return RuleResult(label, None, why)
    if not names:
        return RuleResult(label, False, why)
    hits = [n for n in names if re.search(rule.cuda_device_name, n)]
    if hits:
        return RuleResult(label, True, f"device {hits[0]!r} matches")
    return RuleResult(label, False, f"no device matches (found {', '.join(sorted(set(names)))})")


def detect(descriptors: Mapping[str, PlatformDescriptor]) -> list[Detection]:
    """Every platform's detection, highest priority first (ties by name)."""
    detections = [
        Detection(name, d.detect.priority, tuple(evaluate_rule(r) for r in d.detect.rules))
        for name, d in descriptors.items()
    ]
    return sorted(detections, key=lambda x: (-x.priority, x.name))
