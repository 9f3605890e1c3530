"""sparse: sparse tensors on flagos equal the CPU's, built, converted and multiplied.

COO tensors and the compressed layouts (CSR, CSC, BSR, BSC) are structure around dense members;
the native route runs the backing's sparse kernels on aliases of those members. Each case builds
the same tensor on the CPU and on flagos and compares values (and indices where they are defined).
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

SUITE = "sparse"

CONVERSIONS = {
    "coo": lambda t: t.to_sparse(),
    "csr": lambda t: t.to_sparse_csr(),
    "csc": lambda t: t.to_sparse_csc(),
    "bsr": lambda t: t.to_sparse_bsr((2, 2)),
    "bsc": lambda t: t.to_sparse_bsc((2, 2)),
}


def _dense(rows: int, cols: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    g = torch.Generator().manual_seed(rows * 100 + cols)
    return (torch.randn(rows, cols, generator=g) * (torch.rand(rows, cols, generator=g) > 0.5)).to(dtype)


def _same(result: torch.Tensor, reference: torch.Tensor) -> None:
    assert result.device.type == "flagos", f"result on {result.device}"
    assert result.layout == reference.layout, (result.layout, reference.layout)
    torch.testing.assert_close(result.to_dense().cpu(), reference.to_dense())


def test_coo_construction_and_coalesce(fl: Any) -> None:
    indices, values = torch.tensor([[0, 0, 1, 2], [1, 1, 0, 2]]), torch.tensor([1.0, 2.0, 3.0, 4.0])
    cpu = torch.sparse_coo_tensor(indices, values, (3, 3))
    built = torch.sparse_coo_tensor(indices.to("flagos"), values.to("flagos"), (3, 3))
    _same(built, cpu)
    coalesced = built.coalesce()
    assert coalesced.is_coalesced() and coalesced._nnz() == cpu.coalesce()._nnz()
    assert torch.equal(coalesced.indices().cpu(), cpu.coalesce().indices())
    _same(cpu.to("flagos").coalesce(), cpu.coalesce())


@pytest.mark.parametrize("layout", list(CONVERSIONS))
def test_layout_from_dense_and_back(fl: Any, layout: str) -> None:
    d = _dense(4, 6)
    converted = CONVERSIONS[layout](d.to("flagos"))
    _same(converted, CONVERSIONS[layout](d))
    assert torch.equal(converted.to_dense().cpu(), d)


@pytest.mark.parametrize("target", ["coo", "csr", "csc"])
def test_conversion_between_layouts(fl: Any, target: str) -> None:
    d = _dense(6, 4)
    source = d.to("flagos").to_sparse_csr() if target == "coo" else d.to("flagos").to_sparse()
    _same(CONVERSIONS[target](source), CONVERSIONS[target](d))


@pytest.mark.parametrize("layout", ["coo", "csr"])
def test_sparse_mm_and_addmm(fl: Any, layout: str) -> None:
    a, b, c = _dense(8, 6), _dense(6, 5), _dense(8, 5)
    sparse = CONVERSIONS[layout](a)
    fl_sparse, fl_b, fl_c = sparse.to("flagos"), b.to("flagos"), c.to("flagos")
    torch.testing.assert_close(torch.sparse.mm(fl_sparse, fl_b).cpu(), torch.sparse.mm(sparse, b))
    torch.testing.assert_close(
        torch.addmm(fl_c, fl_sparse, fl_b, beta=0.5, alpha=2.0).cpu(), torch.addmm(c, sparse, b, beta=0.5, alpha=2.0)
    )
