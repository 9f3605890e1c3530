"""The vendor contract (docs/onboarding.md, "The vendor contract"): what a vendor function receives."""

from __future__ import annotations

import types

import pytest
import torch

from torch_fl.kernels.vendor import VendorKernels
from torch_fl.platform.descriptor import VendorKernels as VendorSpec
from torch_fl.routing.runtime import forced


@pytest.fixture
def vendor(fresh_routes, monkeypatch):
    """A vendor kernel set with mm and add.Tensor kernels that note what they received."""
    seen: list[tuple] = []

    def mm(a, b):
        seen.append(("mm", a.is_conj(), a.is_neg(), b.is_conj(), b.is_neg()))
        return torch.mm(a, b)

    def add(self, other, alpha=1):
        seen.append(("add", type(self).__name__, type(other).__name__))
        return torch.add(self, other, alpha=alpha)

    descriptor = fresh_routes.descriptor
    spec = VendorSpec(module="v.py", ops={"aten::mm": "mm", "aten::add.Tensor": "add"})
    kernels = VendorKernels(
        descriptor.model_copy(update={"kernels": descriptor.kernels.model_copy(update={"vendor": spec})})
    )
    module = types.ModuleType("vendor_contract")
    module.mm, module.add = mm, add
    kernels._module = module
    monkeypatch.setitem(fresh_routes.kernel_sets, "vendor", kernels)
    return seen


def test_conjugate_and_negative_views_arrive_resolved(vendor):
    """mm receives x.conj() as a lazy view (the Conjugate key passes it through): the kernel must
    see plain memory, and the result must be PyTorch's."""
    torch.manual_seed(0)
    a, b = torch.randn(3, 3, dtype=torch.complex64), torch.randn(3, 3, dtype=torch.complex64)
    fa, fb = a.to("flagos"), b.to("flagos")
    with forced("aten::mm", "vendor"):
        conj = torch.mm(fa.conj(), fb)
        neg = torch.mm(torch.ops.aten._neg_view(fa), fb.conj())
    assert vendor == [("mm", False, False, False, False)] * 2
    torch.testing.assert_close(conj.cpu(), torch.mm(a.conj(), b))
    torch.testing.assert_close(neg.cpu(), torch.mm(-a, b.conj()))


def test_a_written_conjugate_view_gets_the_result():
    """A written argument that is a conjugate view: the kernel writes a resolved copy, which is
    copied back, and the result is the caller's tensor (PyTorch resolves add_'s self before the
    device today; an op that passes it through gets this)."""
    from torch_fl.kernels.vendor import _with_plain_memory

    seen = []

    def add_inplace(self, other, alpha=1):
        seen.append(self.is_conj())
        return self.add_(other, alpha=alpha)

    a = torch.randn(4, dtype=torch.complex64)
    base = a.clone()
    view = base.conj()
    out = _with_plain_memory(add_inplace, torch.ops.aten.add_.Tensor)(view, torch.ones(4, dtype=torch.complex64))
    assert seen == [False] and out is view
    torch.testing.assert_close(base, (a.conj() + 1).conj())


def test_a_python_number_arrives_where_add_tensor_has_a_tensor(vendor):
    """The documented exception to 'tensors arrive as tensors': PyTorch's wrapped number."""
    x = torch.randn(4).to("flagos")
    with forced("aten::add.Tensor", "vendor"):
        y = x + 2
        z = x + torch.tensor(2.0)
    assert vendor == [("add", "Tensor", "int"), ("add", "Tensor", "Tensor")]
    torch.testing.assert_close(y.cpu(), x.cpu() + 2)
    torch.testing.assert_close(z.cpu(), x.cpu() + 2)
