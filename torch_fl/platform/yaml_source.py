"""YAML loading that remembers where each value came from, so errors can name the line.

Descriptors are read on every activation (that is, during `import torch`), so the data comes
from libyaml through PyYAML, restricted to YAML 1.2's booleans like ruamel. When something must be
located, `line_of` maps a field path back to the line that holds it through libyaml's node tree
(composed on demand). ruamel.yaml's round-trip loader, many times slower (half a minute for a
megabyte), runs only on a syntax error, which ruamel's parser reports with its line.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml as pyyaml

from torch_fl.fileio import RefusedFile, check_depth, read_bounded, too_deep
from torch_fl.platform.errors import DescriptorError, Issue, Loc, clip

# ruamel.yaml is imported where it is used: a descriptor that loads cleanly never needs it, and
# importing it costs about 30 ms of `import torch`.


def _plain(node: Any) -> Any:
    """Round-trip node -> plain dict/list/str/int/float/bool, so validation sees ordinary types."""
    from ruamel.yaml.comments import CommentedMap, CommentedSeq
    from ruamel.yaml.scalarbool import ScalarBoolean
    from ruamel.yaml.scalarfloat import ScalarFloat
    from ruamel.yaml.scalarint import ScalarInt

    if isinstance(node, CommentedMap):
        return {_plain(k): _plain(v) for k, v in node.items()}
    if isinstance(node, CommentedSeq):
        return [_plain(v) for v in node]
    if isinstance(node, ScalarBoolean):
        return bool(node)
    if isinstance(node, ScalarInt):
        return int(node)
    if isinstance(node, ScalarFloat):
        return float(node)
    if isinstance(node, str):
        return str(node)
    return node


class _FastLoader(getattr(pyyaml, "CSafeLoader", pyyaml.SafeLoader)):  # type: ignore[misc]
    """libyaml's safe loader with YAML 1.2 booleans (`yes`, `no`, `on`, `off` stay strings) that,
    like ruamel, refuses a key given twice (then ruamel's parser reports it with its line)."""

    def construct_mapping(self, node: Any, deep: bool = False) -> dict[Any, Any]:
        seen = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=True)
            if key in seen:
                raise pyyaml.constructor.ConstructorError(None, None, f"duplicate key {key!r}", key_node.start_mark)
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


_FastLoader.yaml_implicit_resolvers = {
    first: [(tag, regexp) for tag, regexp in resolvers if tag != "tag:yaml.org,2002:bool"]
    for first, resolvers in pyyaml.SafeLoader.yaml_implicit_resolvers.items()
}
_FastLoader.add_implicit_resolver(
    "tag:yaml.org,2002:bool", re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"), list("tTfF")
)


class YamlInputError(ValueError):
    """Input refused before it is parsed: text that is not UTF-8, or a YAML anchor or alias."""

    def __init__(self, message: str, line: int) -> None:
        super().__init__(message)
        self.line = line


def decode(raw: bytes) -> str:
    """The UTF-8 text of a file's bytes; other bytes are a YamlInputError naming the line."""
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw.count(b"\n", 0, exc.start) + 1
        raise YamlInputError(f"not UTF-8 text (byte 0x{raw[exc.start]:02x}); save the file as UTF-8", line) from None


def refuse_anchors(text: str) -> None:
    """Raise a YamlInputError at the first anchor or alias.

    Platform files are short and flat, and an alias may expand exponentially (a 1 KB "billion
    laughs" file is gigabytes of data), so they are refused before anything is constructed.
    Texts without '&' or '*' cannot hold one and skip the scan, which keeps `import torch` fast.
    """
    if "&" not in text and "*" not in text:
        return
    try:
        for event in pyyaml.parse(text, Loader=_FastLoader):
            name = getattr(event, "anchor", None)
            if name is not None:
                raise YamlInputError(
                    f"YAML anchors and aliases are not allowed (&{clip(name)} / *{clip(name)}); write the value out",
                    event.start_mark.line + 1,
                )
    except pyyaml.YAMLError:
        return  # a syntax error: the loaders report it with its line


def fast_load(text: str) -> Any:
    """Plain data of a YAML text through libyaml (raises PyYAML's YAMLError on bad input, and a
    YamlInputError on an anchor or alias)."""
    refuse_anchors(text)
    return pyyaml.load(text, Loader=_FastLoader)


@dataclass
class YamlDocument:
    """A parsed YAML file: its plain data, and (composed on demand) the tree that knows the lines."""

    path: Path
    data: Any
    text: str
    _tree: Any = field(default=None, repr=False)

    def tree(self) -> Any:
        """libyaml's node tree (fast for any size of file), or ruamel's where only ruamel parsed the file."""
        if self._tree is None:
            self._tree = pyyaml.compose(self.text, Loader=_FastLoader)
        return self._tree

    def line_of(self, loc: Loc) -> int:
        """The 1-based line of the deepest part of `loc` present in the file.

        For a key that exists this is the key's line; for a missing key it is the line of the
        nearest enclosing key that exists (the parent mapping).
        """
        node = self.tree()
        line = 1
        if isinstance(node, (pyyaml.MappingNode, pyyaml.SequenceNode)):
            line = node.start_mark.line + 1
        elif node is not None and not isinstance(node, pyyaml.Node):
            line = node.lc.line + 1 if hasattr(node, "lc") else 1
        for part in loc:
            found = _child(node, part)
            if found is None:
                break
            line, node = found
        return line


def _child(node: Any, part: str | int) -> tuple[int, Any] | None:
    """(the line of `part` in `node`, its value) in a libyaml or a ruamel tree; None when absent."""
    if isinstance(node, pyyaml.MappingNode):
        for key, value in node.value:
            if isinstance(key, pyyaml.ScalarNode) and key.value == str(part):
                return key.start_mark.line + 1, value
        return None
    if isinstance(node, pyyaml.SequenceNode):
        if isinstance(part, int) and 0 <= part < len(node.value):
            return node.value[part].start_mark.line + 1, node.value[part]
        return None
    if node is None or isinstance(node, pyyaml.Node):
        return None
    from ruamel.yaml.comments import CommentedMap, CommentedSeq

    if isinstance(node, CommentedMap) and part in node:
        return node.lc.key(part)[0] + 1, node[part]
    if isinstance(node, CommentedSeq) and isinstance(part, int) and 0 <= part < len(node):
        return node.lc.item(part)[0] + 1, node[part]
    return None


def _round_trip(path: Path, text: str) -> Any:
    """The round-trip tree; a syntax error becomes a DescriptorError naming the parser's line."""
    from ruamel.yaml import YAML
    from ruamel.yaml.error import MarkedYAMLError, YAMLError

    try:
        return YAML(typ="rt").load(text)
    except MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line = mark.line + 1 if mark is not None else None
        problem = " ".join(p for p in (exc.context, exc.problem) if p)
        raise DescriptorError([Issue(f"invalid YAML: {problem}", line=line)], file=path) from None
    except YAMLError as exc:
        raise DescriptorError(f"invalid YAML: {exc}", file=path) from None


ROUND_TRIP_MAX = 32 << 10
"""The largest text whose syntax error ruamel reports (it parses about 40 KB a second); a larger
one gets libyaml's report."""


def _libyaml_error(exc: pyyaml.YAMLError, path: Path) -> DescriptorError:
    mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
    problem = " ".join(str(p) for p in (getattr(exc, "context", None), getattr(exc, "problem", None)) if p)
    line = mark.line + 1 if mark is not None else None
    return DescriptorError([Issue(f"invalid YAML: {clip(problem or str(exc), 200)}", line=line)], file=path)


def parse_yaml(text: str, path: Path) -> YamlDocument:
    """Parse the text of `path`; bad input becomes a DescriptorError naming the file and line.

    Data nested more than MAX_DEPTH levels is refused before anything uses it; deeper data stops
    the parsers themselves (libyaml at a thousand flow levels, then Python's stack), which is the
    same refusal."""
    try:
        try:
            doc = YamlDocument(path=path, data=fast_load(text), text=text)
        except YamlInputError as exc:
            raise DescriptorError([Issue(str(exc), line=exc.line)], file=path) from None
        except pyyaml.YAMLError as exc:
            if "maximum nesting depth" in str(exc):
                raise too_deep(path) from None  # libyaml stops at a thousand levels
            if len(text) > ROUND_TRIP_MAX:
                raise _libyaml_error(exc, path) from None
            tree = _round_trip(path, text)  # raises with ruamel's line and wording
            doc = YamlDocument(path=path, data=_plain(tree), text=text, _tree=tree)
        check_depth(doc.data, path)
    except RecursionError:
        raise DescriptorError(too_deep(path).reason, file=path) from None
    except RefusedFile as exc:
        raise DescriptorError(exc.reason, file=path) from None
    return doc


def load_yaml(path: Path, limit: int) -> YamlDocument:
    """Read (at most `limit` bytes, a regular file) and parse `path`; unreadable or bad input becomes
    a DescriptorError naming the file and line."""
    try:
        raw = read_bounded(path, limit)
    except RefusedFile as exc:
        raise DescriptorError(exc.reason, file=path) from None
    try:
        text = decode(raw)
    except YamlInputError as exc:
        raise DescriptorError([Issue(str(exc), line=exc.line)], file=path) from None
    return parse_yaml(text, path)
