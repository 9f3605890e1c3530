"""The native route reuses its backing aliases from call to call (one pool per thread): every reuse
must see the new argument's bytes, dtype, geometry and conjugate/negative bits, and none may carry
state from the call that made it (inference mode, a buffer an out= kernel grew)."""

from __future__ import annotations

import threading
from collections.abc import Callable

import torch


def _pairs(*tensors: torch.Tensor) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    return list(tensors), [t.to("flagos") for t in tensors]


def test_each_reuse_takes_the_new_arguments_geometry_and_dtype(same: Callable[..., None]) -> None:
    g = torch.Generator().manual_seed(0)
    base = torch.randn(6, 8, generator=g)
    cpu, fl = _pairs(
        base,
        base.t(),  # transposed strides
        base[2:, 3:],  # an offset into the storage
        base.double()[::2],
        torch.randn(5, generator=g, dtype=torch.complex64).conj(),  # a lazy conjugate
        torch.arange(12).reshape(3, 4),
    )
    for _ in range(3):  # every round reuses the aliases the round before made
        for c, f in zip(cpu, fl, strict=True):
            same(f * 2, c * 2)
            same(f.sum(dim=0), c.sum(dim=0))
            same(torch.cat([f.flatten(), f.flatten()[:3]]), torch.cat([c.flatten(), c.flatten()[:3]]))


def test_each_reuse_takes_the_new_arguments_memory_format(same: Callable[..., None]) -> None:
    # A pooled alias copies each argument's contiguity flags: a kernel that reads them (the output
    # layout of an elementwise op, a convolution's algorithm) must see the argument's, whatever the
    # alias last served.
    g = torch.Generator().manual_seed(3)
    x4 = torch.randn(2, 3, 4, 5, generator=g)
    x5 = torch.randn(2, 3, 4, 5, 6, generator=g)
    weight = torch.randn(4, 3, 3, 3, generator=g)
    cpu, fl = _pairs(
        x4.contiguous(memory_format=torch.channels_last),
        x4,
        x5.contiguous(memory_format=torch.channels_last_3d),
        torch.randn(3, 4, 5, generator=g),
        x5,
        x4.contiguous(memory_format=torch.channels_last),
    )
    for _ in range(2):
        for c, f in zip(cpu, fl, strict=True):
            result, expected = f * 2, c * 2
            same(result, expected)
            assert result.stride() == expected.stride()
            if c.dim() == 4:
                out, ref = torch.nn.functional.conv2d(f, weight.to("flagos")), torch.nn.functional.conv2d(c, weight)
                same(out, ref)
                assert out.stride() == ref.stride()


def test_an_alias_moves_between_ranks_kept_in_place_and_past_them(same: Callable[..., None]) -> None:
    # Sizes and strides of up to five dimensions sit inside a TensorImpl, more on the heap: a pooled
    # alias that served one kind then serves the other, and back, with the right geometry each time.
    g = torch.Generator().manual_seed(4)
    deep = torch.randn(2, 1, 3, 2, 2, 3, generator=g)
    cpu, fl = _pairs(
        torch.randn(4, 5, generator=g),
        deep,
        deep.transpose(0, 5),  # non-contiguous, past five dimensions
        torch.tensor(2.5),  # no dimensions
        torch.randn(1, 2, 1, 2, 1, 2, 1, generator=g),
        torch.randn(3, 2, 2, 2, 2, generator=g),
    )
    for _ in range(3):
        for c, f in zip(cpu, fl, strict=True):
            result, expected = f * 2, c * 2
            same(result, expected)
            assert result.stride() == expected.stride()
            same(f.sum(dim=-1), c.sum(dim=-1))


def test_aliases_of_one_shape_take_each_calls_dtype_and_lazy_bits(same: Callable[..., None]) -> None:
    # A pooled alias serves arguments of one shape that differ in dtype and in the lazy conjugate
    # and negative bits, which each reuse must set or clear.
    g = torch.Generator().manual_seed(1)
    z = torch.randn(4, 5, dtype=torch.complex64, generator=g)
    x = torch.randn(4, 5, generator=g)
    cpu, fl = _pairs(z, z.conj(), z, x, torch._neg_view(x), x.double(), x, x.int())
    for _ in range(2):
        for c, f in zip(cpu, fl, strict=True):
            same(f * 2, c * 2)
            same(f + f, c + c)
            same(torch.cat([f, f]), torch.cat([c, c]))


def test_list_ops_in_place_after_inference_mode(same: Callable[..., None]) -> None:
    # Aliases made in inference mode have no version counter: reused outside it, an in-place
    # kernel that bumps versions (the fused foreach ones on CUDA) would refuse them.
    cpu, fl = _pairs(*(torch.full((4, 4), float(i)) for i in range(5)))
    with torch.inference_mode():
        for f in fl:
            f.add(1)
    torch._foreach_add_(fl, 1.0)
    torch._foreach_mul_(fl, fl)
    torch._foreach_add_(cpu, 1.0)
    torch._foreach_mul_(cpu, cpu)
    for f, c in zip(fl, cpu, strict=True):
        same(f, c)
    with torch.inference_mode():  # and back: made outside, reused inside
        same(torch.stack(torch._foreach_add(fl, 1.0)), torch.stack(torch._foreach_add(cpu, 1.0)))


def test_a_tensor_at_one_position_of_two_lists_shares_its_alias(same: Callable[..., None]) -> None:
    # A list op's later list reads the alias its earlier list got for the same tensor at the same
    # position: in place (written, then read), out of place, three lists, partly repeated, and a
    # repeat at another position (not shared).
    g = torch.Generator().manual_seed(2)
    cpu, fl = _pairs(*(torch.randn(3, 5, generator=g) for _ in range(4)))
    grads_cpu, grads_fl = _pairs(*(torch.randn(3, 5, generator=g) for _ in range(4)))
    for lists in ((fl, fl), (cpu, cpu)):
        torch._foreach_add_(*lists, alpha=0.5)
    same(torch.stack(torch._foreach_add(fl, fl)), torch.stack(torch._foreach_add(cpu, cpu)))
    torch._foreach_addcmul_(fl, grads_fl, grads_fl, value=0.1)
    torch._foreach_addcmul_(cpu, grads_cpu, grads_cpu, value=0.1)
    partly_fl, partly_cpu = [fl[0], *grads_fl[1:]], [cpu[0], *grads_cpu[1:]]
    torch._foreach_mul_(fl, partly_fl)
    torch._foreach_mul_(cpu, partly_cpu)
    same(torch.stack(torch._foreach_add(fl, fl[::-1])), torch.stack(torch._foreach_add(cpu, cpu[::-1])))
    for f, c in zip(fl, cpu, strict=True):
        same(f, c)


def test_aliases_cross_inference_mode_to_be_read_and_normal_ones_to_be_written(same: Callable[..., None]) -> None:
    # An alias made in inference mode may serve a read outside it but not a write (it has no
    # version counter to bump); one made outside may serve either in either mode.
    cpu, fl = _pairs(*(torch.full((3, 3), float(i)) for i in range(4)))
    with torch.inference_mode():
        for c, f in zip(cpu, fl, strict=True):
            same(f * 2, c * 2)  # the pool now holds aliases made in inference mode
    for c, f in zip(cpu, fl, strict=True):
        same(f + 1, c + 1)
    torch._foreach_mul_(fl, 3.0)
    torch._foreach_mul_(cpu, 3.0)
    for c, f in zip(cpu, fl, strict=True):
        same(f, c)
    with torch.inference_mode():
        torch._foreach_add_(fl, 1.0)  # written in inference mode, with aliases made outside it
        torch._foreach_add_(cpu, 1.0)
        for c, f in zip(cpu, fl, strict=True):
            same(f, c)


def test_out_grown_by_the_kernel_then_reused(same: Callable[..., None]) -> None:
    a, b = torch.randn(64), torch.randn(64)
    out = torch.empty(0, device="flagos")
    for _ in range(3):
        torch.add(a.to("flagos"), b.to("flagos"), out=out)  # out= grows its empty storage
        same(out, a + b)
        same(out * 3, (a + b) * 3)


def test_threads_reuse_their_own_aliases(same: Callable[..., None]) -> None:
    xs = [torch.randn(32, 32, generator=torch.Generator().manual_seed(i)) for i in range(4)]
    results: dict[int, list[torch.Tensor]] = {}

    def work(i: int) -> None:
        x = xs[i].to("flagos")
        results[i] = [x @ x + i for _ in range(50)]

    threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for i, x in enumerate(xs):
        for r in results[i]:
            same(r, x @ x + i)
