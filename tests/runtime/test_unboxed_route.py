"""The hottest ops take the native route in their own signature (no boxing): the same backing
kernel on the same aliases as the boxed route, so the same results, counts and errors; every call
it does not serve as is goes to the boxed route."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
import torch.nn.functional as F

import torch_fl

UNBOXED = "torch_fl native route (unboxed)"


def _kernel(op: str) -> str:
    """The name of the kernel that serves `op` on flagos (dense tensors)."""
    rows = [r for r in torch._C._dispatch_dump(op).splitlines() if r.startswith("PrivateUse1:")]
    return rows[0].split(":", 1)[1].split("::")[0].strip() if rows else ""


def _native_calls() -> dict[str, int]:
    return {op: native for op, (native, _) in torch_fl.runtime.core().route_counts().items() if native}


# index_copy_: a static KV cache's update, each layer of each eager decode step
@pytest.mark.parametrize(
    "op", ["aten::add.Tensor", "aten::mm", "aten::cat", "aten::native_layer_norm", "aten::index_copy_"]
)
def test_hot_ops_are_served_unboxed(op: str) -> None:
    assert _kernel(op) == UNBOXED


# the fused kernels scaled_dot_product_attention picks on a CUDA backing (the host has none of them)
@pytest.mark.cuda
@pytest.mark.backing_cuda
@pytest.mark.parametrize("kind", ["cudnn", "flash", "efficient"])
def test_cuda_fused_attention_is_served_unboxed(kind: str) -> None:
    assert _kernel(f"aten::_scaled_dot_product_{kind}_attention") == UNBOXED
    assert _kernel(f"aten::_scaled_dot_product_{kind}_attention_backward") == UNBOXED


def test_results_counts_and_identity_match_the_boxed_route(same: Callable[..., None]) -> None:
    g = torch.Generator().manual_seed(0)
    a, b = torch.randn(8, 16, generator=g), torch.randn(16, 4, generator=g)
    w, bias = torch.randn(16, generator=g), torch.randn(16, generator=g)
    fa, fb, fw, fbias = (t.to("flagos") for t in (a, b, w, bias))
    core = torch_fl.runtime.core()
    core.reset_route_counts()
    same(fa.mm(fb), a.mm(b))  # a new result
    same(torch.cat([fa, fa[:2]], dim=0), torch.cat([a, a[:2]], dim=0))  # a list argument
    y, mean, rstd = torch.ops.aten.native_layer_norm(fa, [16], fw, fbias, 1e-5)  # a tuple result
    ey, emean, erstd = torch.ops.aten.native_layer_norm(a, [16], w, bias, 1e-5)
    same(y, ey), same(mean, emean), same(rstd, erstd)
    y, _, _ = torch.ops.aten.native_layer_norm(fa, [16], None, None, 1e-5)  # absent optional tensors
    same(y, torch.ops.aten.native_layer_norm(a, [16], None, None, 1e-5)[0])
    target = fa.clone()
    assert target.add_(fa) is target  # an in-place op returns its own argument
    same(target, a + a)
    cache, rows = torch.zeros(8, 4), torch.tensor([1, 6])
    flagos_cache = cache.to("flagos")
    assert flagos_cache.index_copy_(0, rows.to("flagos"), fb[:2]) is flagos_cache  # int and tensor arguments
    same(flagos_cache, cache.index_copy_(0, rows, b[:2]))
    calls = _native_calls()
    assert calls["aten::mm"] == 1 and calls["aten::cat"] == 1 and calls["aten::native_layer_norm"] == 2
    assert calls["aten::add_.Tensor"] == 1


def test_a_view_result_shares_the_flagos_storage(same: Callable[..., None]) -> None:
    x = torch.randn(4, 6, device="flagos")
    before = x.clone()
    x.t().mul_(2)  # in place through a transposed view: the storage must see it
    same(x, before.cpu() * 2)


def test_an_in_place_op_leaves_its_argument_as_it_was_laid_out(same: Callable[..., None]) -> None:
    # The unboxed route writes back only out= arguments: an in-place op keeps its argument's
    # geometry and lazy conjugate bit, which the argument must still show after the call.
    x = torch.randn(4, 6, device="flagos")
    view = x.t()[1:3]
    layout = (view.size(), view.stride(), view.storage_offset())
    expected = view.cpu() * 2
    assert view.mul_(2) is view
    assert (view.size(), view.stride(), view.storage_offset()) == layout
    same(view, expected)
    c = torch.randn(3, dtype=torch.complex64)
    flagos_c = c.to("flagos").conj()
    flagos_c.mul_(2j)
    assert flagos_c.is_conj()
    same(flagos_c, c.conj() * 2j)


def test_forced_cpu_route_still_applies(force_cpu_route: Callable[[str], None], same: Callable[..., None]) -> None:
    force_cpu_route("aten::mm")
    a = torch.randn(3, 3)
    core = torch_fl.runtime.core()
    core.reset_route_counts()
    same(a.to("flagos").mm(a.to("flagos")), a.mm(a))
    assert core.route_counts()["aten::mm"] == (0, 1)


def test_a_host_operand_is_refused_as_on_a_device() -> None:
    with pytest.raises(RuntimeError, match="Expected all tensors to be on the same device"):
        torch.randn(3, device="flagos").add(torch.randn(3))


def test_autograd_through_unboxed_ops(same: Callable[..., None]) -> None:
    g = torch.Generator().manual_seed(1)
    x, w = torch.randn(4, 8, generator=g), torch.randn(8, 8, generator=g)
    losses = []
    for device in ("cpu", "flagos"):
        xd = x.to(device)
        wd = w.detach().to(device).requires_grad_()
        loss = F.gelu(F.layer_norm(xd @ wd, [8])).softmax(-1).sum(0).pow(2).mean()
        loss.backward()
        losses.append((loss, wd.grad))
    same(losses[1][0], losses[0][0])
    same(losses[1][1], losses[0][1])


@pytest.mark.parametrize("inference", [False, True])
def test_a_routed_result_has_the_dispatch_keys_of_a_flagos_tensor(inference: bool) -> None:
    # The route relabels the backing kernel's result in place: its backend and autocast keys must
    # become flagos's, or autocast and autograd would skip it.
    with torch.inference_mode(inference):
        a = torch.randn(4, 4, device="flagos")
        made = torch.empty(4, 4, device="flagos")
        for result in (a + a, torch.mm(a, a), a.sum(dim=0), a.to(torch.float64)):
            assert torch._C._dispatch_keys(result) == torch._C._dispatch_keys(made)
            assert result.device.type == "flagos"
    with torch.autocast("flagos", dtype=torch.bfloat16):
        assert torch.mm(a, a).dtype == torch.bfloat16
        assert torch.mm(torch.mm(a, a).float(), a).dtype == torch.bfloat16
