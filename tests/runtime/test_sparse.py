"""Sparse tensors on flagos: COO and the compressed layouts, built, converted and computed with the
backing's sparse kernels on the native route; results equal the CPU's."""

from __future__ import annotations

import pytest
import torch

import torch_fl

LAYOUTS = {
    torch.sparse_csr: lambda t: t.to_sparse_csr(),
    torch.sparse_csc: lambda t: t.to_sparse_csc(),
    torch.sparse_bsr: lambda t: t.to_sparse_bsr((2, 2)),
    torch.sparse_bsc: lambda t: t.to_sparse_bsc((2, 2)),
}


def dense(rows: int = 4, cols: int = 6, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    t = torch.randn(rows, cols, generator=g)
    return t * (torch.rand(rows, cols, generator=g) > 0.5)


def assert_same_sparse(result: torch.Tensor, reference: torch.Tensor) -> None:
    assert result.device.type == "flagos" and result.layout == reference.layout
    assert result.shape == reference.shape and result.dtype == reference.dtype
    torch.testing.assert_close(result.to_dense().cpu(), reference.to_dense())


def test_coo_construction_and_accessors():
    indices = torch.tensor([[0, 1, 1], [2, 0, 2]])
    values = torch.tensor([3.0, 4.0, 5.0])
    t = torch.sparse_coo_tensor(indices, values, (2, 3), device="flagos")
    assert t.is_sparse and t.device.type == "flagos" and t._nnz() == 3
    assert t._indices().device.type == "flagos" and t._values().device.type == "flagos"
    assert torch.equal(t.to_dense().cpu(), torch.sparse_coo_tensor(indices, values, (2, 3)).to_dense())
    moved = torch.sparse_coo_tensor(indices, values, (2, 3)).to("flagos")
    assert moved.is_sparse and moved.device.type == "flagos"
    back = moved.cpu()
    assert back.is_sparse and torch.equal(back.to_dense(), t.to_dense().cpu())


def test_coalesce_sums_duplicates():
    indices = torch.tensor([[0, 0, 1], [1, 1, 0]])
    values = torch.tensor([1.0, 2.0, 3.0])
    cpu = torch.sparse_coo_tensor(indices, values, (2, 2))
    t = cpu.to("flagos")
    assert not t.is_coalesced()
    c = t.coalesce()
    assert c.is_coalesced() and c._nnz() == 2 and c.device.type == "flagos"
    assert torch.equal(c.indices().cpu(), cpu.coalesce().indices())
    assert torch.equal(c.values().cpu(), cpu.coalesce().values())


def test_dense_to_sparse_runs_the_backings_kernel_on_the_native_route():
    core = torch_fl.runtime.core()
    core.reset_route_counts()
    d = dense()
    s = d.to("flagos").to_sparse()
    assert_same_sparse(s, d.to_sparse())
    counts = core.route_counts()
    assert counts["aten::_to_sparse"][0] >= 1
    assert all(cpu == 0 for _, cpu in counts.values()), counts


@pytest.mark.parametrize("layout", list(LAYOUTS), ids=lambda layout: str(layout).split(".")[-1])
def test_compressed_layouts_from_dense_and_back(layout):
    d = dense()
    convert = LAYOUTS[layout]
    s = convert(d.to("flagos"))
    reference = convert(d)
    assert_same_sparse(s, reference)
    if layout in (torch.sparse_csr, torch.sparse_bsr):
        assert torch.equal(s.crow_indices().cpu(), reference.crow_indices())
        assert torch.equal(s.col_indices().cpu(), reference.col_indices())
    else:
        assert torch.equal(s.ccol_indices().cpu(), reference.ccol_indices())
        assert torch.equal(s.row_indices().cpu(), reference.row_indices())
    assert s.values().device.type == "flagos"
    assert torch.equal(s.to_dense().cpu(), d)


def test_compressed_construction():
    crow, col, values = torch.tensor([0, 1, 3]), torch.tensor([1, 0, 2]), torch.tensor([1.0, 2.0, 3.0])
    t = torch.sparse_csr_tensor(crow, col, values, (2, 3), device="flagos")
    assert t.layout == torch.sparse_csr and t.device.type == "flagos" and t._nnz() == 3
    assert torch.equal(t.to_dense().cpu(), torch.sparse_csr_tensor(crow, col, values, (2, 3)).to_dense())


def test_conversions_between_layouts():
    d = dense()
    coo = d.to("flagos").to_sparse()
    csr = coo.to_sparse_csr()
    assert_same_sparse(csr, d.to_sparse_csr())
    assert_same_sparse(csr.to_sparse_coo(), d.to_sparse())
    assert_same_sparse(csr.to_sparse_csc(), d.to_sparse_csc())


@pytest.mark.parametrize("layout", [torch.sparse_coo, torch.sparse_csr])
def test_sparse_mm_and_addmm(layout):
    a, b, c = dense(4, 6), torch.randn(6, 3), torch.randn(4, 3)
    sparse_cpu = a.to_sparse() if layout == torch.sparse_coo else a.to_sparse_csr()
    sparse = sparse_cpu.to("flagos")
    assert sparse.layout == layout
    out = torch.sparse.mm(sparse, b.to("flagos"))
    assert out.device.type == "flagos"
    torch.testing.assert_close(out.cpu(), torch.sparse.mm(sparse_cpu, b))
    out = torch.addmm(c.to("flagos"), sparse, b.to("flagos"), beta=0.5, alpha=2.0)
    torch.testing.assert_close(out.cpu(), torch.addmm(c, sparse_cpu, b, beta=0.5, alpha=2.0))
    # close, not equal: on a CUDA backing the product is cuSPARSE's, summed in another order than the CPU's
    torch.testing.assert_close((sparse @ b.to("flagos")).cpu(), sparse_cpu @ b)


def test_in_place_sparse_ops_write_back():
    cpu = dense().to_sparse()
    t = cpu.to("flagos")
    t.mul_(2.0)
    cpu.mul_(2.0)
    assert_same_sparse(t, cpu)
    other = dense(seed=1).to_sparse().to("flagos")
    t.copy_(other)
    assert_same_sparse(t, dense(seed=1).to_sparse())


def test_sparse_gradient_of_embedding():
    emb = torch.nn.Embedding(10, 4, sparse=True).to("flagos")
    emb(torch.tensor([1, 3, 3], device="flagos")).sum().backward()
    grad = emb.weight.grad
    assert grad.is_sparse and grad.device.type == "flagos"
    expected = torch.zeros(10, 4)
    expected[1] = 1
    expected[3] = 2
    assert torch.equal(grad.to_dense().cpu(), expected)
