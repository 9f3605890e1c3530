"""Views share storage with their base, exactly as on the CPU: geometry, _base, data pointers, and
writes through a view (or through the base) seen on the other side."""

from __future__ import annotations

import pytest
import torch


def pair(*shape: int) -> tuple[torch.Tensor, torch.Tensor]:
    cpu = torch.arange(float(torch.Size(shape).numel())).reshape(shape)
    return cpu.to("flagos"), cpu


def shares_storage(view: torch.Tensor, base: torch.Tensor) -> bool:
    return view.untyped_storage().data_ptr() == base.untyped_storage().data_ptr()


VIEWS = {
    "t_row": lambda x: x.t()[0],
    "slice": lambda x: x[1:, ::2],
    "select": lambda x: x[2],
    "view": lambda x: x.view(4, 3),
    "reshape": lambda x: x.reshape(2, 6),
    "flatten": lambda x: x.flatten(),
    "unsqueeze_expand": lambda x: x.unsqueeze(0).expand(2, 3, 4),
    "narrow": lambda x: x.narrow(1, 1, 2),
    "diagonal": lambda x: x.diagonal(),
    "transpose": lambda x: x.transpose(0, 1),
    "permute": lambda x: x[None].permute(2, 0, 1),
    "unfold": lambda x: x.unfold(
        1, 2, 2
    ),  # non-overlapping: in-place writes to overlapping windows are order-dependent
    "as_strided": lambda x: x.as_strided((2, 2), (1, 4), 1),
    "split": lambda x: x.split(2, dim=1)[1],
    "chunk": lambda x: x.chunk(3, dim=0)[2],
    "unbind": lambda x: x.unbind(1)[3],
    "view_dtype": lambda x: x.view(torch.int32),
    "movedim": lambda x: x.movedim(0, 1),
    "squeeze": lambda x: x[:1].squeeze(0),
    "detach": lambda x: x.detach(),
}


@pytest.mark.parametrize("make_view", VIEWS.values(), ids=VIEWS.keys())
def test_view_geometry_and_storage(make_view, same):
    x, cpu = pair(3, 4)
    view, reference = make_view(x), make_view(cpu)
    assert view.shape == reference.shape
    assert view.stride() == reference.stride()
    assert view.storage_offset() == reference.storage_offset()
    assert view.is_contiguous() == reference.is_contiguous()
    assert shares_storage(view, x)
    assert view.data_ptr() == x.data_ptr() + view.storage_offset() * view.element_size()
    same(view, reference)


@pytest.mark.parametrize("make_view", VIEWS.values(), ids=VIEWS.keys())
def test_in_place_through_view_reaches_base(make_view, same):
    x, cpu = pair(3, 4)
    if make_view(cpu).dtype != cpu.dtype:  # view(int32): write integers into the float bits
        make_view(x).fill_(7)
        make_view(cpu).fill_(7)
    elif make_view is VIEWS["unsqueeze_expand"]:  # expanded views cannot be written element-wise
        make_view(x)[0].mul_(-1)
        make_view(cpu)[0].mul_(-1)
    else:
        make_view(x).mul_(-1).add_(0.5)
        make_view(cpu).mul_(-1).add_(0.5)
    same(x, cpu)


def test_x_t_row_is_a_view_of_x(same):
    x, cpu = pair(2, 3)
    row = x.t()[0]
    assert row._base is x
    assert shares_storage(row, x)
    row.add_(10)
    cpu.t()[0].add_(10)
    same(x, cpu)
    # and the other way: writing the base changes the view
    x.zero_()
    same(row, torch.zeros(2))


def test_base_and_is_view():
    x, _ = pair(3, 4)
    s = x[1:]
    assert s._is_view() and s._base is x
    assert s[0]._base is x  # a view of a view keeps the original base
    assert not x._is_view() and x._base is None
    c = s.contiguous()  # already contiguous: the same tensor, still a view
    assert c is s
    copy = x.t().contiguous()
    assert copy._base is None and not shares_storage(copy, x)


def test_untyped_storage():
    x, cpu = pair(3, 4)
    storage = x.untyped_storage()
    assert storage.device == x.device
    assert storage.nbytes() == cpu.untyped_storage().nbytes() == 48
    assert x[1].untyped_storage().data_ptr() == storage.data_ptr()
    assert x.t().untyped_storage().data_ptr() == storage.data_ptr()


def test_writes_into_strided_views_and_setitem(same):
    x, cpu = pair(4, 5)
    for t in (x, cpu):
        t[:, 1] = 0
        t[::2, 3:] = -1
        t[1:3, ::2] += 100
        t.diagonal().copy_(torch.tensor([9.0, 8.0, 7.0, 6.0]))
        t.t()[2].fill_(3.5)
    same(x, cpu)


def test_ops_on_non_contiguous_views(same):
    x, cpu = pair(6, 8)
    cases = [
        lambda t: t.t() @ t,
        lambda t: t[::2, 1::3].exp(),
        lambda t: t.t().sum(0),
        lambda t: t.unfold(1, 3, 2).mean(-1),
        lambda t: t.flip(1)[:, :4] * 2,
        lambda t: torch.cat([t[:, :2], t.t()[:2].t()], 1),
    ]
    for case in cases:
        same(case(x), case(cpu))


def test_complex_views(same):
    cpu = torch.randn(3, 2)
    x = cpu.to("flagos")
    c, ccpu = torch.view_as_complex(x), torch.view_as_complex(cpu)
    assert shares_storage(c, x)
    same(c, ccpu)
    r = torch.view_as_real(c)
    assert shares_storage(r, x)
    c.mul_(1j)
    ccpu.mul_(1j)
    same(x, cpu)
    lazy = c.conj()  # a lazy conjugate view: only a bit on the same storage
    assert lazy.is_conj() and shares_storage(lazy, x)
    same(c.conj_physical(), ccpu.conj_physical())


def test_materialising_conjugate_and_negative_views(same):
    """clone()/print()/resolve_conj() of a lazy conjugate view (and resolve_neg() of a negative one)
    copy it into plain memory, as on the CPU."""
    cpu = torch.randn(4, dtype=torch.complex64)
    x = cpu.to("flagos")
    same(x.conj().clone(), cpu.conj().clone())
    same(x.conj().resolve_conj(), cpu.conj().resolve_conj())
    assert "device='flagos:0'" in repr(x.conj())
    same(x.conj().imag.resolve_neg(), cpu.conj().imag.resolve_neg())
    assert torch.equal(x.conj().to("cpu"), cpu.conj().resolve_conj())
    target = torch.zeros(4, dtype=torch.complex64, device="flagos")
    same(target.copy_(x.conj()), cpu.conj().resolve_conj())


def test_resize_and_set(same):
    x = torch.arange(4.0, device="flagos")
    x.resize_(2, 5)  # grows the storage, keeping the first elements
    assert x.shape == (2, 5)
    same(x.flatten()[:4], torch.arange(4.0))
    y = torch.empty(0, device="flagos")
    y.set_(x.untyped_storage(), 2, (2, 2), (1, 2))
    assert shares_storage(y, x)
    same(y, x.cpu().flatten().as_strided((2, 2), (1, 2), 2))
    assert y.is_set_to(y)
    z = torch.empty(0, device="flagos").set_(x)
    assert z.is_set_to(x)


def test_autograd_through_views(same):
    cpu = torch.randn(4, 4, requires_grad=True)
    x = cpu.detach().to("flagos").requires_grad_()
    for t in (x, cpu):
        (t.t()[1:3, ::2] * t[0, :2]).sum().backward()
    same(x.grad, cpu.grad)
