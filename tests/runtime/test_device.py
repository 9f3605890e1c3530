"""The flagos device itself: factories, torch.tensor, printing, scalars, device properties."""

from __future__ import annotations

import pytest
import torch

FACTORIES = {
    "empty+fill_": lambda d: torch.empty(2, 3, device=d).fill_(1.5),
    "zeros": lambda d: torch.zeros(2, 3, device=d),
    "ones_int32": lambda d: torch.ones(4, dtype=torch.int32, device=d),
    "full": lambda d: torch.full((3, 2), 7.25, device=d),
    "full_bool": lambda d: torch.full((3,), True, device=d),
    "arange": lambda d: torch.arange(10, device=d),
    "arange_float": lambda d: torch.arange(0.0, 2.0, 0.25, device=d),
    "linspace": lambda d: torch.linspace(-1, 1, 9, device=d),
    "logspace": lambda d: torch.logspace(0, 2, 5, device=d),
    "eye": lambda d: torch.eye(3, 4, device=d),
    "zeros_like": lambda d: torch.zeros_like(torch.ones(2, 2, device=d)),
    "ones_like_dtype": lambda d: torch.ones_like(torch.ones(2, device=d), dtype=torch.float64),
    "full_like": lambda d: torch.full_like(torch.ones(3, device=d), -2),
    "empty_strided+fill_": lambda d: torch.empty_strided((2, 3), (1, 2), device=d).fill_(3),
    "zero_size": lambda d: torch.zeros(0, 5, device=d),
    "scalar": lambda d: torch.zeros((), device=d),
    "complex": lambda d: torch.ones(2, dtype=torch.complex64, device=d),
}


@pytest.mark.parametrize("factory", FACTORIES.values(), ids=FACTORIES.keys())
def test_factories_match_cpu(factory, same):
    result, reference = factory("flagos"), factory("cpu")
    assert result.shape == reference.shape and result.stride() == reference.stride()
    same(result, reference)


@pytest.mark.parametrize("fn", [torch.tril_indices, torch.triu_indices], ids=["tril_indices", "triu_indices"])
def test_factories_without_tensor_arguments(fn, same):
    """Only a `Device?` argument and no composite kernel: the native route serves these directly."""
    same(fn(4, 3, 1, device="flagos"), fn(4, 3, 1))


TENSOR_DATA = {
    "float_list": ([[1.0, 2.0], [3.0, 4.5]], None),
    "int_list": ([1, 2, 3], None),
    "bool_list": ([True, False, True], None),
    "scalar": (3.5, None),
    "float16": ([0.1, 0.2], torch.float16),
    "bfloat16": ([0.1, 1e3], torch.bfloat16),
    "int8": ([-128, 127], torch.int8),
    "uint8": ([0, 255], torch.uint8),
    "complex": ([1 + 2j, -3j], None),
    "empty": ([], None),
}


@pytest.mark.parametrize("data,dtype", TENSOR_DATA.values(), ids=TENSOR_DATA.keys())
def test_torch_tensor_on_flagos(data, dtype, same):
    result = torch.tensor(data, dtype=dtype, device="flagos")
    same(result, torch.tensor(data, dtype=dtype))


def test_tensor_from_cpu_tensor_and_numpy(same):
    cpu = torch.randn(3, 4)
    same(torch.as_tensor(cpu, device="flagos"), cpu)
    same(torch.as_tensor(cpu.numpy(), device="flagos"), cpu)
    same(torch.from_numpy(cpu.numpy()).to("flagos"), cpu)


def test_repr_names_the_device():
    text = repr(torch.tensor([1.0, 2.0], device="flagos"))
    assert text == "tensor([1., 2.], device='flagos:0')"
    assert "device='flagos:0'" in repr(torch.zeros(2, 2, dtype=torch.int64, device="flagos"))
    assert "dtype=torch.float16" in repr(torch.zeros(2, dtype=torch.float16, device="flagos"))
    assert str(torch.ones(1, device="flagos").device) == "flagos:0"
    # Large tensors print with the summary, like CPU ones.
    big = torch.arange(5000.0)
    assert repr(big.to("flagos")).replace(", device='flagos:0'", "") == repr(big)


def test_device_of_results():
    x = torch.ones(3, device="flagos")
    assert x.device == torch.device("flagos", 0)
    assert x.device.type == "flagos" and x.device.index == 0
    assert x.is_flagos and not x.is_cpu and not x.is_cuda
    for result in (x + 1, x.sum(), x.view(3, 1), x.clone(), torch.stack([x, x]), x.to(torch.float64)):
        assert result.device == x.device


def test_scalars_and_python_values():
    x = torch.tensor([1.5, -2.0, 3.0], device="flagos")
    assert x[1].item() == -2.0
    assert x.tolist() == [1.5, -2.0, 3.0]
    assert float(x.sum()) == 2.5
    assert int(torch.tensor(7, device="flagos")) == 7
    assert bool(torch.tensor(True, device="flagos"))
    assert (x > 0).any() and not (x > 10).any()
    assert x.numel() == 3 and x.dim() == 1 and x.element_size() == 4


ELEMENTWISE = {
    "add": lambda a, b: a + b,
    "sub_alpha": lambda a, b: torch.sub(a, b, alpha=2),
    "mul": lambda a, b: a * b,
    "div": lambda a, b: a / (b.abs() + 1),
    "pow": lambda a, b: a.abs().pow(b),
    "where": lambda a, b: torch.where(a > 0, a, b),
    "clamp": lambda a, b: a.clamp(-0.5, 0.5),
    "exp_log": lambda a, b: a.exp().log(),
    "tanh": lambda a, b: torch.tanh(a),
    "compare": lambda a, b: a < b,
    "broadcast": lambda a, b: a + b[:1],
    "scalar_tensor": lambda a, b: a * torch.tensor(3.0),  # a 0-dim CPU tensor mixes in, as on CUDA
    "matmul": lambda a, b: a @ b.T,
    "sum_dim": lambda a, b: a.sum(dim=1, keepdim=True),
    "mean": lambda a, b: a.mean(),
    "max_dim": lambda a, b: a.max(dim=0).values,
    "argmax": lambda a, b: a.argmax(dim=1),
    "cumsum": lambda a, b: a.cumsum(0),
    "sort": lambda a, b: a.sort(dim=1).values,
    "topk": lambda a, b: a.topk(2).indices,
    "cat": lambda a, b: torch.cat([a, b], dim=1),
    "index_select": lambda a, b: a.index_select(0, torch.tensor([2, 0], device=a.device)),
    "masked_fill": lambda a, b: a.masked_fill(b > 0, 0.0),
    "nonzero": lambda a, b: (a > 0).nonzero(),
    "unique": lambda a, b: torch.unique((a * 2).round()),
}


@pytest.mark.parametrize("op", ELEMENTWISE.values(), ids=ELEMENTWISE.keys())
def test_ops_match_cpu(op, same):
    torch.manual_seed(0)
    a, b = torch.randn(4, 5), torch.randn(4, 5)
    same(op(a.to("flagos"), b.to("flagos")), op(a, b))


def test_in_place_and_out_ops(same):
    a = torch.randn(3, 3)
    x = a.to("flagos")
    x.mul_(2).add_(1)
    same(x, a.mul(2).add(1))
    out = torch.empty(0, device="flagos")
    torch.add(x, 1, out=out)  # out= resizes a zero-size flagos tensor
    same(out, a.mul(2).add(1) + 1)
    assert out.shape == (3, 3)


def test_torch_device_strings():
    assert torch.device("flagos").type == "flagos" and torch.device("flagos").index is None
    assert torch.device("flagos:1") == torch.device("flagos", 1)
    assert torch.flagos.is_available()
    assert torch.flagos.device_count() >= 1
    assert torch.flagos.current_device() == 0
    assert isinstance(torch.flagos.get_device_name(), str) and torch.flagos.get_device_name()
    torch.flagos.synchronize()
