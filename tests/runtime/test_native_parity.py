"""The native route against plain CPU on calls where the host_ref record once failed it.

Each test makes the exact call on flagos and on the CPU. Where flagos differed, the test pins the
fix. Where the conformance run failed flagos but PyTorch's own CPU kernel fails in exactly the same
way under the same conditions (a Python dispatch mode active, as the ops suite's watching mode is;
a device-keyed algorithm choice), the test shows that: flagos equals the CPU in both conditions.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from torch_fl.conformance.watch import Watch


class _PassThrough(TorchDispatchMode):
    """A dispatch mode that changes nothing: only its being active matters."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[override]
        return func(*args, **(kwargs or {}))


def _on(device: str, *tensors: torch.Tensor) -> list[torch.Tensor]:
    return [t.detach().to(device).requires_grad_(t.requires_grad) for t in tensors]


def _complex(*shape: int, seed: int) -> torch.Tensor:
    return torch.randn(*shape, dtype=torch.complex128, generator=torch.Generator().manual_seed(seed))


# ---- flagos defects, fixed


@pytest.mark.parametrize("route", ["native", "cpu"])
def test_lu_solve_out_keeps_the_kernels_conjugate_bit(
    route: str, force_cpu_route: Callable[[str], None], same: Callable[..., None]
) -> None:
    # With left=False the CPU kernel solves the adjoint system in `out` and then marks `out` as a
    # conjugate view instead of conjugating its bytes: the flagos `out` must carry that bit too.
    if route == "cpu":
        force_cpu_route("aten::linalg_lu_solve.out")
    lu, pivots = torch.linalg.lu_factor(_complex(3, 3, seed=0))
    b = _complex(4, 3, seed=1)
    expected = torch.empty(4, 3, dtype=torch.complex128)
    torch.linalg.lu_solve(lu, pivots, b, adjoint=True, left=False, out=expected)
    out = torch.empty(4, 3, dtype=torch.complex128, device="flagos")
    flu, fpivots, fb = _on("flagos", lu, pivots, b)
    returned = torch.linalg.lu_solve(flu, fpivots, fb, adjoint=True, left=False, out=out)
    assert returned is out
    same(out, expected)
    same(out, torch.linalg.lu_solve(lu, pivots, b, adjoint=True, left=False))


def test_sgn_backward_under_the_ops_suites_watch() -> None:
    # sgn's derivative on real inputs is a ZeroTensor (no bytes); the watching mode read its
    # storage pointer, which PyTorch refuses for any device.
    grads = {}
    for device in ("cpu", "flagos"):
        (x,) = _on(device, torch.randn(5, generator=torch.Generator().manual_seed(0)).requires_grad_())
        with Watch() as watch:
            (grads[device],) = torch.autograd.grad(torch.sgn(x), x, torch.ones(5, device=device))
        assert not watch.problems
    assert torch.equal(grads["flagos"].cpu(), grads["cpu"])


# ---- PyTorch's own behaviour under a Python dispatch mode: the CPU fails the same way. Where
# values are compared, the host backing runs the CPU's own kernels: exact comparisons.


@contextlib.contextmanager
def _mode(active: bool) -> Iterator[None]:
    with _PassThrough() if active else contextlib.nullcontext():
        yield


@pytest.mark.parametrize("hermitian", [False, True])
def test_matrix_rank_out_under_a_dispatch_mode(hermitian: bool) -> None:
    # linalg_matrix_rank's out= kernel takes a functional branch when a dispatch mode is active
    # (it treats the input as a tensor subclass) and rebinds `out` instead of writing it: the
    # caller's `out` keeps whatever bytes it had, on the CPU as on flagos.
    a = torch.randn(5, 5, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    a = a @ a.mT if hermitian else a

    def rank(device: str, in_mode: bool) -> torch.Tensor:
        out = torch.full((), -1, dtype=torch.int64, device=device)
        with _mode(in_mode):
            torch.linalg.matrix_rank(a.to(device), hermitian=hermitian, out=out)
        return out.cpu()

    assert rank("flagos", False).item() == rank("cpu", False).item() == 5
    assert rank("flagos", True).item() == rank("cpu", True).item() == -1  # out= left unwritten on both


def _lstsq_grad(device: str, in_mode: bool) -> list[torch.Tensor]:
    a, b = _on(device, _complex(2, 3, seed=2).requires_grad_(), _complex(2, 2, seed=3).requires_grad_())
    with _mode(in_mode):
        solution = torch.linalg.lstsq(a, b).solution
        grads = torch.autograd.grad(solution, (a, b), torch.ones_like(solution))
    return [g.cpu() for g in grads]


def _pinv_grad(fn: Callable[[torch.Tensor], torch.Tensor]) -> Callable[[str, bool], list[torch.Tensor]]:
    def run(device: str, in_mode: bool) -> list[torch.Tensor]:
        (a,) = _on(device, _complex(5, 5, seed=4).requires_grad_())
        with _mode(in_mode):
            result = fn(a)
            (grad,) = torch.autograd.grad(result, a, torch.ones_like(result))
        return [result.detach().cpu(), grad.cpu()]

    return run


@pytest.mark.backing_cpu
@pytest.mark.parametrize(
    "call",
    [_lstsq_grad, _pinv_grad(torch.linalg.pinv), _pinv_grad(torch.pinverse)],
    ids=["linalg.lstsq", "linalg.pinv", "pinverse"],
)
def test_complex_linalg_under_a_dispatch_mode(call: Callable[[str, bool], list[torch.Tensor]]) -> None:
    # Complex lstsq's backward and pinv's forward come out differently on the CPU itself while a
    # dispatch mode is active; flagos computes exactly what the CPU does, with and without one.
    plain_cpu, plain_flagos = call("cpu", False), call("flagos", False)
    mode_cpu, mode_flagos = call("cpu", True), call("flagos", True)
    for f, c in [*zip(plain_flagos, plain_cpu), *zip(mode_flagos, mode_cpu)]:
        assert torch.equal(f, c)
    assert any(not torch.allclose(m, p) for m, p in zip(mode_cpu, plain_cpu)), "the CPU no longer differs in a mode"


# ---- PyTorch's device-keyed algorithm choice


@pytest.mark.backing_cpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_chunked_linear_cross_entropy_follows_the_options_pytorch_picks(dtype: torch.dtype) -> None:
    # With acc_policy="auto", linear_cross_entropy picks its accumulation per device type: float32
    # and the "accurate" policy on the CPU, the input dtype and "compact" on a device it does not
    # list (flagos). Given the same explicit options, flagos and the CPU agree exactly.
    gen = torch.Generator().manual_seed(5)
    x = torch.randn(8, 3, generator=gen).to(dtype).requires_grad_()
    w = torch.randn(4, 3, generator=gen).to(dtype).requires_grad_()
    target = torch.randint(0, 4, (8,), generator=gen)
    Options = torch.nn.LinearCrossEntropyOptions

    def run(device: str, options: torch.nn.LinearCrossEntropyOptions) -> list[torch.Tensor]:
        fx, fw, ft = _on(device, x, w, target)
        loss = torch.nn.functional.linear_cross_entropy(fx, fw, ft, reduction="none", options=options)
        grads = torch.autograd.grad(loss, (fx, fw), torch.ones_like(loss))
        return [loss.detach().cpu(), *(g.cpu() for g in grads)]

    auto = Options(batch_chunk_size=2)
    compact = Options(batch_chunk_size=2, acc_policy="compact")
    accurate = Options(batch_chunk_size=2, acc_policy="accurate", acc_dtype=torch.float32)
    for f, c in zip(run("flagos", auto), run("cpu", compact)):
        assert torch.equal(f, c)
    for f, c in zip(run("flagos", accurate), run("cpu", auto)):
        assert torch.equal(f, c)
