"""Load a platform.yaml into a PlatformDescriptor, or raise a DescriptorError that names the line.

Nothing is half-loaded: `load_descriptor` returns a complete, validated model or raises.
"""

from __future__ import annotations

import importlib
import importlib.util
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from torch_fl.platform.descriptor import OP_NAME_PATTERN, RULE_KINDS, PlatformDescriptor
from torch_fl.platform.errors import DescriptorError, Issue, Loc, short
from torch_fl.platform.yaml_source import YamlDocument, load_yaml

DESCRIPTOR_FILE = "platform.yaml"
MAX_DESCRIPTOR_BYTES = 256 << 10  # a hundred times the largest shipped descriptor

_NOUNS = {
    "string_type": "a string",
    "int_type": "an integer",
    "int_from_float": "an integer",
    "int_parsing": "an integer",
    "float_parsing": "a number",
    "bool_parsing": "true or false",
    "float_type": "a number",
    "bool_type": "true or false",
    "list_type": "a list",
    "dict_type": "a mapping",
    "model_type": "a mapping",
    "model_attributes_type": "a mapping",
}


def _describe(error: Mapping[str, Any]) -> str:
    """A pydantic error as 'expected ...; got ...', in the words a descriptor author uses."""
    kind, ctx, value = error["type"], error.get("ctx") or {}, error.get("input")
    if kind == "missing":
        return f"missing required field {error['loc'][-1]!r}"
    if kind == "extra_forbidden":
        return f"unknown field {error['loc'][-1]!r}"
    if kind == "literal_error":
        return f"expected one of {ctx['expected']}; got {short(value)}"
    if kind == "string_pattern_mismatch" and ctx.get("pattern") == OP_NAME_PATTERN:
        return f"bad op name {short(value)}: expected aten::name or aten::name.overload"
    if kind == "string_pattern_mismatch":
        return f"expected a string matching {ctx['pattern']}; got {short(value)}"
    if kind in _NOUNS:
        hint = ""
        if kind == "string_type" and isinstance(value, (int, float)):
            hint = " (quote it: YAML reads 3.10 as the number 3.1)"
        return f"expected {_NOUNS[kind]}; got {short(value)}{hint}"
    if kind == "rule_kind":
        return f"{error['msg']}; got {short(value)}"
    message = error["msg"]
    message = message[0].lower() + message[1:] if message else kind
    return f"{message.removeprefix('value error, ')}; got {short(value)}"


def _clean_loc(loc: tuple[Any, ...]) -> Loc:
    """Drop pydantic's bookkeeping from a location: union tags and the '[key]' marker of dict keys."""
    out: list[Any] = []
    for i, part in enumerate(loc):
        if part == "[key]":
            continue
        if part in RULE_KINDS and i + 1 < len(loc) and loc[i + 1] == part:
            continue
        out.append(part)
    return tuple(out)


def locate(issues: list[Issue], doc: YamlDocument) -> list[Issue]:
    """The issues with the line of each one's field in `doc`, in file order."""
    placed = [Issue(i.message, i.loc, i.line or doc.line_of(i.loc)) for i in issues]
    return sorted(placed, key=lambda i: i.line or 0)


def validation_issues(exc: ValidationError, doc: YamlDocument) -> list[Issue]:
    """A pydantic error on `doc`'s data as located issues in a person's words (no pydantic text)."""
    return locate([Issue(_describe(e), _clean_loc(e["loc"])) for e in exc.errors()], doc)


VENDOR_MODULE_LOC: Loc = ("kernels", "vendor", "module")


def vendor_module_file(descriptor: PlatformDescriptor, folder: Path) -> Path:
    """The real path of the descriptor's vendor module in `folder`, or a DescriptorError.

    The module is imported at the first vendor call, and what runs must be what the record hashed
    (torch_fl.platform.record.platform_sources): a regular file inside the platform folder, reached
    without links (the descriptor keeps it out of records/ and __pycache__/, never hashed). A file
    that does not exist yet is returned as is (onboard validates before writing).
    """
    assert descriptor.kernels.vendor is not None
    module = descriptor.kernels.vendor.module
    path = folder / module
    if not path.exists() and not path.is_symlink():
        return path
    try:
        real = path.resolve(strict=True)
    except (OSError, RuntimeError):  # RuntimeError: a loop of links
        real = None
    parts = Path(module).parts
    link = next((p for p in (folder.joinpath(*parts[: i + 1]) for i in range(len(parts))) if p.is_symlink()), None)
    problem = None
    if real is None:
        problem = f"{module} is a link that leads nowhere (dangling, or a loop)"
    elif not real.is_relative_to(folder.resolve()):
        problem = f"{module} resolves to {real}, outside the platform folder"
    elif not real.is_file():
        problem = f"{module} is not a regular file"
    elif link is not None:
        problem = f"{module} is reached through a link ({link.relative_to(folder)}); the record hashes files, not links"
    if problem is not None:
        issue = Issue(f"{problem}; a vendor module must be a file inside the platform folder", VENDOR_MODULE_LOC)
        source = descriptor.source_path
        raise DescriptorError(
            locate([issue], load_yaml(source, MAX_DESCRIPTOR_BYTES)) if source else [issue], file=source
        )
    assert real is not None
    return real


def load_descriptor(path: Path | str) -> PlatformDescriptor:
    """Read and validate `path` (a platform.yaml, or the folder that holds one).

    Checks the schema, the cross-field rules of the model, and that `name` equals the folder
    name. Op names are checked against torch's registry separately (`validate_op_names`), so
    loading never imports torch.
    """
    path = Path(path)
    if path.is_dir():
        path = path / DESCRIPTOR_FILE
    doc = load_yaml(path, MAX_DESCRIPTOR_BYTES)
    if not isinstance(doc.data, dict):
        raise DescriptorError([Issue("expected a mapping of descriptor fields", line=1)], file=path)
    try:
        descriptor = PlatformDescriptor.model_validate(doc.data)
    except ValidationError as exc:
        raise DescriptorError(validation_issues(exc, doc), file=path) from None
    except DescriptorError as exc:
        raise DescriptorError(locate(exc.issues, doc), file=path) from None
    folder = path.resolve().parent.name
    if descriptor.name != folder:
        issue = Issue(f"must equal the folder name {folder!r}; got {descriptor.name!r}", ("name",))
        raise DescriptorError(locate([issue], doc), file=path)
    descriptor._source = path
    if descriptor.kernels.vendor is not None:
        vendor_module_file(descriptor, path.parent)
    return descriptor


def op_exists(torch: Any, op: str) -> bool:
    """Whether the installed `torch` has the aten op `aten::name` or overload `aten::name.overload`."""
    name, _, overload = op.partition(".")
    if overload:
        try:
            torch._C._dispatch_find_schema_or_throw(name, overload)
        except RuntimeError:
            return False
        return True
    return bool(torch._C._jit_get_schemas_for_operator(name))


def validate_op_names(descriptor: PlatformDescriptor) -> None:
    """Check that every op the descriptor names exists in the installed torch.

    Does nothing when torch is not installed (the format was already checked at load); the
    runtime loader calls this after importing torch. Raises a DescriptorError naming each
    unknown op's field path (and line, when the descriptor was loaded from a file).
    """
    if importlib.util.find_spec("torch") is None:
        return
    torch = importlib.import_module("torch")
    issues = [
        Issue(f"unknown op {op!r}: torch {torch.__version__} has no such operator or overload", loc)
        for loc, op in descriptor.op_names()
        if not op_exists(torch, op)
    ]
    if not issues:
        return
    source = descriptor.source_path
    if source is not None and source.exists():
        issues = locate(issues, load_yaml(source, MAX_DESCRIPTOR_BYTES))
    raise DescriptorError(issues, file=source)
