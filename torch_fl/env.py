"""The one registry of environment variables that torch-fl reads.

Every variable is declared here with its default and a sentence of documentation, and read
through `get`/`flag`, so the documentation table (`table_markdown`) is generated from the same
declarations the code uses and an undeclared read fails loudly instead of growing a hidden knob.
Variables named by a platform descriptor (detection rules, SDK home variables) are data, not
torch-fl settings, and are read by the code that evaluates the descriptor.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

_TRUE = frozenset({"1", "true", "yes", "on"})


@dataclass(frozen=True)
class EnvVar:
    """One declared variable: its name, the value used when it is unset, and what it does."""

    name: str
    default: str | None
    doc: str


_REGISTRY: dict[str, EnvVar] = {}


def register(name: str, default: str | None, doc: str) -> EnvVar:
    """Declare a variable; declaring the same name twice with different text is an error."""
    var = EnvVar(name, default, doc)
    known = _REGISTRY.get(name)
    if known is not None and known != var:
        raise ValueError(f"environment variable {name} is already declared differently: {known}")
    _REGISTRY[name] = var
    return var


def _declared(name: str) -> EnvVar:
    try:
        return _REGISTRY[name]
    except KeyError:
        raise KeyError(f"environment variable {name} is read but not declared in torch_fl.env") from None


def get(name: str) -> str | None:
    """The variable's value, or its declared default when unset or empty."""
    var = _declared(name)
    value = os.environ.get(name)
    return value if value else var.default


def flag(name: str) -> bool:
    """True when the variable is set to 1/true/yes/on (case-insensitive)."""
    value = get(name)
    return value is not None and value.strip().lower() in _TRUE


def declared() -> list[EnvVar]:
    """Every declared variable, sorted by name."""
    return sorted(_REGISTRY.values(), key=lambda v: v.name)


def table_markdown() -> str:
    """A Markdown table of every declared variable, sorted by name, for the docs."""
    lines = ["| variable | default | what it does |", "|---|---|---|"]
    for var in declared():
        default = f"`{var.default}`" if var.default is not None else "unset"
        lines.append(f"| `{var.name}` | {default} | {var.doc} |")
    return "\n".join(lines) + "\n"


register(
    "FLAGOS_PLATFORM",
    None,
    "Force the platform by name (a folder under platforms/ or FLAGOS_PLATFORM_PATH) instead of detecting it.",
)
register(
    "FLAGOS_PLATFORM_PATH",
    None,
    "Extra platform folders, separated by the OS path separator; each entry is a platform folder "
    "or a folder of platform folders. A platform found here overrides a shipped one of the same name.",
)
register(
    "FLAGOS_ALLOW_UNVALIDATED",
    "0",
    "Set to 1 to enable every declared kernel set of a platform that has no valid conformance record "
    "(with a warning); without it only the native and cpu paths run.",
)
