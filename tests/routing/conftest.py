"""Routing tests run on the active platform (host_ref on a machine without an accelerator)."""

from __future__ import annotations

import pytest
import torch

import torch_fl


@pytest.fixture
def fresh_routes():
    """Undo every API route and counter a test sets."""
    from torch_fl.routing import reset_stats, router

    r = router()
    before = dict(r.api)
    reset_stats()
    yield r
    for op in list(r.api):
        if op not in before:
            r.clear_route(op)
    reset_stats()


def pytest_collection_modifyitems(items):
    if not torch_fl.is_active():
        for item in items:
            item.add_marker(pytest.mark.skip(reason="flagos is not active in this process"))


@pytest.fixture
def pair():
    torch.manual_seed(0)
    a, b = torch.randn(8, 8), torch.randn(8, 8)
    return a, b, a.to("flagos"), b.to("flagos")
