"""PyTorch's OpInfo database, loaded where its test-only dependencies may be missing.

`torch.testing._internal.common_methods_invocations.op_db` ships in every torch wheel, but its
import pulls `expecttest` (a test-only package) for a TestCase base class the ops suite never
uses. GPU boards often cannot install packages, so when it is missing a minimal stand-in module
is registered before the import; with expecttest installed nothing is replaced.
"""

from __future__ import annotations

import functools
import importlib.util
import sys
import types
import unittest
from typing import Any


def _stand_in_expecttest() -> None:
    if "expecttest" in sys.modules or importlib.util.find_spec("expecttest") is not None:
        return
    module = types.ModuleType("expecttest")

    class TestCase(unittest.TestCase):  # only subclassed by common_utils.TestCase
        def assertExpectedInline(self, actual: Any, expect: Any, skip: int = 0) -> None:
            self.assertEqual(str(actual).strip(), str(expect).strip())

    module.TestCase = TestCase  # type: ignore[attr-defined]
    sys.modules["expecttest"] = module


@functools.cache
def op_db() -> list[Any]:
    _stand_in_expecttest()
    from torch.testing._internal.common_methods_invocations import op_db as db

    return list(db)


def full_name(opinfo: Any) -> str:
    """`nn.functional.conv2d`, `normal.in_place`: the name plus the variant, unique in op_db."""
    return opinfo.name + (f".{opinfo.variant_test_name}" if opinfo.variant_test_name else "")
