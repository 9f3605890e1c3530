"""The explicit CPU fallback of the C++ core: an op forced onto the `cpu` route (copy to the host, run
PyTorch's CPU kernel, copy back) still gives the CPU's results, is counted under the cpu column of
route_counts(), and is logged once per op when logging is on (set_log_cpu_fallback / FLAGOS_LOG_FALLBACK).

Which overload reaches the core depends on how PyTorch dispatches a call (`a + b` arrives as
aten::add.Tensor, `torch.add(a, b, out=o)` as aten::add.out), so each test first asks the core's
counters which ops served a call, then forces exactly those.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

import torch_fl

core = torch_fl.runtime.core
# On a CUDA machine the child processes need the platform asked for, or flagos stays contained.
PLATFORM = {"FLAGOS_PLATFORM": torch_fl.active_platform().name} if torch_fl.is_active() else {}


def served_by(fn: Callable[[], object]) -> set[str]:
    """The ops the C++ routes served during one call of `fn`."""
    core().reset_route_counts()
    fn()
    return set(core().route_counts())


CASES = {
    "add": lambda a, b: a + b,
    "add_": lambda a, b: a.clone().add_(b, alpha=2),
    "mul_out": lambda a, b: torch.mul(a, b, out=torch.empty(0, device=a.device)),
    "mm": lambda a, b: a @ b,
    "addmm": lambda a, b: torch.addmm(a, a, b, beta=0.5),
    "sum": lambda a, b: a.sum(0),
    "max_dim": lambda a, b: a.max(1).indices,
    "sort": lambda a, b: a.sort(1).values,
    "softmax": lambda a, b: a.softmax(1),
    "cat": lambda a, b: torch.cat([a, b]),
    "relu": lambda a, b: (a - b).relu(),
    "nonzero": lambda a, b: (a > b).nonzero(),
}


@pytest.mark.parametrize("fn", CASES.values(), ids=CASES.keys())
def test_forced_cpu_route_is_correct_and_counted(fn, force_cpu_route, same):
    torch.manual_seed(0)
    a, b = torch.randn(5, 5), torch.randn(5, 5)
    x, y = a.to("flagos"), b.to("flagos")
    native_result = fn(x, y)
    ops = served_by(lambda: fn(x, y))
    assert ops, "no op of this call reached the C++ routes"
    assert all(core().route_counts()[op][1] == 0 for op in ops), "without forcing, the native route serves it"
    for op in ops:
        force_cpu_route(op)
    core().reset_route_counts()
    result = fn(x, y)
    same(result, fn(a, b))
    same(result, native_result.cpu())
    counts = core().route_counts()
    for op in ops:
        native, cpu = counts[op]
        assert cpu >= 1 and native == 0, (op, counts)


def test_forcing_is_per_op_and_reversible(force_cpu_route):
    x = torch.ones(3, device="flagos")
    (add,) = served_by(lambda: x + x)
    (mul,) = served_by(lambda: x * x)
    force_cpu_route(add)
    core().reset_route_counts()
    x + x
    x * x
    counts = core().route_counts()
    assert counts[add] == (0, 1)
    assert counts[mul] == (1, 0)
    core().set_cpu_route(add, False)
    core().reset_route_counts()
    x + x
    assert core().route_counts()[add] == (1, 0)


def test_cpu_route_keeps_views_and_in_place_semantics(force_cpu_route, same):
    cpu = torch.arange(12.0).reshape(3, 4)
    x = cpu.to("flagos")
    forced = served_by(lambda: x.t()[1].add_(0))
    forced |= served_by(lambda: torch.mul(x, 1, out=torch.empty(0, device="flagos")))
    for op in forced:
        force_cpu_route(op)
    core().reset_route_counts()
    view = x.t()[1]
    view.add_(100)  # an in-place op through a strided view, served on the host
    cpu.t()[1].add_(100)
    same(x, cpu)
    out = torch.empty(0, device="flagos")
    torch.mul(x, 2, out=out)  # out= resized on the host, handed back to the flagos tensor
    same(out, cpu * 2)
    assert out.shape == (3, 4) and out.device == x.device
    assert all(core().route_counts()[op] == (0, 1) for op in forced), core().route_counts()


@pytest.mark.two_devices
def test_cpu_route_results_stay_on_the_inputs_device(force_cpu_route):
    x = torch.randn(3, 3, device="flagos:1")
    for op in served_by(lambda: x @ x):
        force_cpu_route(op)
    assert (x @ x).device == torch.device("flagos", 1)
    assert (x + 1).device == torch.device("flagos", 1)


def test_cpu_route_with_autograd(force_cpu_route, same):
    a = torch.randn(4, 4, requires_grad=True)
    x = a.detach().to("flagos").requires_grad_()
    (mm,) = served_by(lambda: x.detach() @ x.detach())
    force_cpu_route(mm)
    core().reset_route_counts()
    (x @ x).sum().backward()
    (a @ a).sum().backward()
    same(x.grad, a.grad)
    assert core().route_counts()[mm] == (0, 3)  # the forward product and both backward ones


@pytest.mark.backing_cpu
def test_cpu_route_draws_from_the_flagos_generator(force_cpu_route):
    """On the host backing a random op forced onto the cpu route still draws from the flagos
    generator: seeded alike, it gives the numbers of the native route."""
    torch.flagos.manual_seed(5)
    expected = torch.empty(6, device="flagos").normal_()
    for op in served_by(lambda: torch.empty(6, device="flagos").normal_()):
        force_cpu_route(op)
    torch.flagos.manual_seed(5)
    assert torch.equal(torch.empty(6, device="flagos").normal_().cpu(), expected.cpu())


def test_routing_stats_include_the_cpu_column(force_cpu_route):
    x = torch.ones(2, device="flagos")
    (add,) = served_by(lambda: x + x)
    force_cpu_route(add)
    torch_fl.routing.reset_stats()
    x + x
    rows = {(r.op, r.path): r.calls for r in torch_fl.routing.stats()}
    assert rows.get((add, "cpu")) == 1, rows


# Forces the ops behind `x + x` and `x * x` onto the cpu route, calls them 3 and 2 times.
LOG_SCRIPT = """
    import torch, torch_fl
    {switch}
    core = torch_fl.runtime.core()
    x = torch.ones(3, device="flagos")
    def served(fn):
        core.reset_route_counts()
        fn()
        (op,) = core.route_counts()
        return op
    add, mul = served(lambda: x + x), served(lambda: x * x)
    core.set_cpu_route(add, True)
    core.set_cpu_route(mul, True)
    core.reset_route_counts()
    for _ in range(3):
        x + x
    x * x
    x * x
    x - x  # not forced: never logged
    print("ops", add, mul)
    print("counts", core.route_counts()[add], core.route_counts()[mul])
"""


def fallback_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if "cpu fallback" in line]


@pytest.mark.own_process
def test_log_switch_logs_once_per_op(run_python):
    result = run_python(LOG_SCRIPT.format(switch="torch_fl.runtime.core().set_log_cpu_fallback(True)"), env=PLATFORM)
    assert "counts (0, 3) (0, 2)" in result.stdout, result.stdout
    add, mul = result.stdout.split("ops ")[1].split()[:2]
    lines = fallback_lines(result.stderr)
    assert len(lines) == 2, result.stderr
    assert any(add in line for line in lines) and any(mul in line for line in lines), lines
    assert all("forced" in line for line in lines)


@pytest.mark.own_process
def test_log_env_variable(run_python):
    result = run_python(LOG_SCRIPT.format(switch=""), env={**PLATFORM, "FLAGOS_LOG_FALLBACK": "1"})
    assert len(fallback_lines(result.stderr)) == 2, result.stderr
    quiet = run_python(LOG_SCRIPT.format(switch=""), env={**PLATFORM, "FLAGOS_LOG_FALLBACK": None})
    assert "counts (0, 3) (0, 2)" in quiet.stdout
    assert fallback_lines(quiet.stderr) == [], quiet.stderr
