"""FLAGOS_ROUTE_<op> names read back as the ops they were written for."""

from __future__ import annotations

import pytest

from torch_fl.routing.overrides import env_name, op_from_env_name


@pytest.mark.parametrize(
    "op",
    [
        "aten::mm",
        "aten::add.Tensor",
        "aten::add_.Tensor",
        "aten::_foreach_add_.List",
        "aten::relu_",
        "aten::__and__.Tensor",
    ],
)
def test_env_names_round_trip(op):
    assert op_from_env_name(env_name(op)) == op


def test_the_documented_spelling():
    assert env_name("aten::add.Tensor") == "FLAGOS_ROUTE_add__Tensor"
    assert op_from_env_name("FLAGOS_ROUTE_add___Tensor") == "aten::add_.Tensor"


def test_every_routable_op_round_trips():
    """Every aten overload this torch registers (what a route may name) reads back as itself."""
    import re

    import torch

    from torch_fl.platform.descriptor import OP_NAME_PATTERN

    names = [n for n in torch._C._dispatch_get_all_op_names() if re.fullmatch(OP_NAME_PATTERN, n)]
    assert len(names) > 1000
    assert [n for n in names if op_from_env_name(env_name(n)) != n] == []
