"""YAML loading that remembers where each value came from, so errors can name the line.

ruamel.yaml's round-trip loader keeps line numbers on every mapping key and sequence item; the
data handed to validation is converted to plain Python types, and `line_of` maps a field path
back to the line that holds it.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ruamel.yaml import YAML
from ruamel.yaml.comments import CommentedMap, CommentedSeq
from ruamel.yaml.error import MarkedYAMLError, YAMLError
from ruamel.yaml.scalarbool import ScalarBoolean
from ruamel.yaml.scalarfloat import ScalarFloat
from ruamel.yaml.scalarint import ScalarInt

from torch_fl.platform.errors import DescriptorError, Issue, Loc


def _plain(node: Any) -> Any:
    """Round-trip node -> plain dict/list/str/int/float/bool, so validation sees ordinary types."""
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


@dataclass(frozen=True)
class YamlDocument:
    """A parsed YAML file: its plain data and the round-trip tree that knows the lines."""

    path: Path
    data: Any
    _tree: Any

    def line_of(self, loc: Loc) -> int:
        """The 1-based line of the deepest part of `loc` present in the file.

        For a key that exists this is the key's line; for a missing key it is the line of the
        nearest enclosing key that exists (the parent mapping).
        """
        node = self._tree
        line = node.lc.line + 1 if isinstance(node, (CommentedMap, CommentedSeq)) else 1
        for part in loc:
            if isinstance(node, CommentedMap) and part in node:
                line = node.lc.key(part)[0] + 1
                node = node[part]
            elif isinstance(node, CommentedSeq) and isinstance(part, int) and 0 <= part < len(node):
                line = node.lc.item(part)[0] + 1
                node = node[part]
            else:
                break
        return line


def load_yaml(path: Path) -> YamlDocument:
    """Parse `path`; a syntax error becomes a DescriptorError naming the parser's line."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise DescriptorError(f"cannot read the file: {exc.strerror or exc}", file=path) from None
    yaml = YAML(typ="rt")
    try:
        tree = yaml.load(text)
    except MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line = mark.line + 1 if mark is not None else None
        problem = " ".join(p for p in (exc.context, exc.problem) if p)
        raise DescriptorError([Issue(f"invalid YAML: {problem}", line=line)], file=path) from None
    except YAMLError as exc:
        raise DescriptorError(f"invalid YAML: {exc}", file=path) from None
    return YamlDocument(path=path, data=_plain(tree), _tree=tree)
