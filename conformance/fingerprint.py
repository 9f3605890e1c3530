"""A short, stable hash of a failure, so the same bug seen in many cases is counted once.

It covers the failure kind (status), the op, and the message with everything incidental removed:
numbers (indices, values, sizes, line numbers), addresses, dtype names and file paths.
"""

from __future__ import annotations

import hashlib
import re

_DTYPES = re.compile(
    r"\b(torch\.)?(float(8_e4m3fn|8_e5m2|16|32|64)?|bfloat16|complex(32|64|128)?|u?int(8|16|32|64)|bool|half|double)\b"
)
_NUMBER = re.compile(r"[-+]?(0x[0-9a-fA-F]+|\d+(\.\d*)?([eE][-+]?\d+)?|\.\d+|inf|nan)")
_PATH = re.compile(r"(/[^\s:'\"()]+)+")


def normalize(message: str) -> str:
    text = _PATH.sub("<path>", message)
    text = _DTYPES.sub("<dtype>", text)
    text = _NUMBER.sub("#", text)
    return " ".join(text.lower().split())


def fingerprint(status: str, op: str | None, message: str) -> str:
    """12 hex digits of sha256 over kind, op and the normalized message."""
    key = f"{status}\n{op or ''}\n{normalize(message)}"
    return hashlib.sha256(key.encode()).hexdigest()[:12]
