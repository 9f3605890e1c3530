"""torch.compile (inductor) on flagos tensors: compiled results equal eager, forward and backward.

On the host backing inductor generates C++ kernels that run on flagos host memory; on CUDA backing
it generates Triton kernels on flagos (CUDA) memory. Either way, operators inductor leaves to extern
kernels (mm, addmm) must still dispatch through flagos, where the native route serves them.
The CUDA tests run on a GPU board with FLAGOS_PLATFORM=nvidia_h200.
"""

from __future__ import annotations

import copy
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch._inductor.utils import run_and_get_code

import torch_fl
from torch_fl.runtime import inductor
from torch_fl.runtime.device import core as device_core

ACTIVE = torch_fl.is_active()
BACKING = device_core.backing() if ACTIVE else None

host_backing = pytest.mark.skipif(BACKING != "cpu", reason=f"needs flagos on the host backing; here: {BACKING}")
cuda_backing = pytest.mark.skipif(
    not torch.cuda.is_available() or BACKING != "cuda",
    reason="needs a CUDA device and flagos on CUDA backing (FLAGOS_PLATFORM=nvidia_h200)",
)
# Compiled and eager code reduce in different orders; on CUDA TF32/fused kernels widen that.
TOL = {"cpu": {"rtol": 1e-5, "atol": 1e-5}, "cuda": {"rtol": 1e-4, "atol": 1e-4}}.get(BACKING or "cpu")


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    if ACTIVE:
        inductor.register(BACKING)  # idempotent; the runtime's start() registers it too
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def _pointwise_reduction(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return (x.sin() * 2 + y).relu().sum(-1) + x.mean()


def _matmul_chain(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return ((a @ b).relu() * 0.5 + 1).pow(2).sum()


class MLP(nn.Module):
    def __init__(self, d: int = 32) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(d)
        self.up = nn.Linear(d, 2 * d)
        self.down = nn.Linear(2 * d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(F.silu(self.up(self.norm(x)))) + x


class Attention(nn.Module):
    """Causal self-attention through scaled_dot_product_attention, whose fused-kernel choice
    flagos answers per device (and, under torch.compile, for FakeTensors)."""

    def __init__(self, d: int = 32, heads: int = 4) -> None:
        super().__init__()
        self.heads = heads
        self.qkv, self.out = nn.Linear(d, 3 * d), nn.Linear(d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(x).view(b, t, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.out(a.transpose(1, 2).reshape(b, t, d)) + x


def _native_calls(prefixes: tuple[str, ...]) -> int:
    counts = torch_fl.runtime.core().route_counts()
    return sum(native for op, (native, _cpu) in counts.items() if op.startswith(prefixes))


def _train_losses(model: nn.Module, x: torch.Tensor, steps: int = 3, scalar: bool = False) -> list[float]:
    """Per-step losses of AdamW on `model(x)`: the output itself when `scalar`, else its mean square."""
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    losses = []
    for _ in range(steps):
        opt.zero_grad()
        loss = model(x) if scalar else model(x).pow(2).mean()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def test_registration_is_lazy():
    """Registering costs nothing until PyTorch loads dynamo and inductor (a plain import stays fast)."""
    code = (
        "import sys, torch, torch_fl\n"
        "from torch_fl.runtime import inductor\n"
        "inductor.register('cpu')\n"
        "assert 'torch._dynamo' not in sys.modules and inductor.registered() is None\n"
        "y = torch.compile(lambda x: x * 2 + 1)(torch.ones(4, device='flagos'))\n"
        "assert inductor.registered() == 'cpu' and y.device.type == 'flagos' and y.tolist() == [3.0] * 4\n"
    )
    env = dict(os.environ, FLAGOS_PLATFORM="host_ref")
    result = subprocess.run(
        [sys.executable, "-c", code],
        cwd=Path(__file__).resolve().parents[2],
        env=env,
        capture_output=True,
        text=True,
        timeout=540,
    )
    assert result.returncode == 0, result.stdout + result.stderr


class TinyLM(nn.Module):
    """Embedding (an indirect load), attention, logits: the shape of the benchmark's decoder."""

    def __init__(self, vocab: int = 64, d: int = 32) -> None:
        super().__init__()
        self.embed, self.block, self.head = nn.Embedding(vocab, d), Attention(d), nn.Linear(d, vocab)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        logits = self.head(self.block(self.embed(tokens)))
        return F.cross_entropy(logits.flatten(0, 1), tokens.flatten())


@pytest.mark.skipif(not ACTIVE, reason="flagos is not active in this process")
def test_tiny_language_model_trains_three_steps_like_eager():
    torch.manual_seed(0)
    base = TinyLM()
    tokens = torch.randint(0, 64, (2, 16)).to("flagos")
    eager = _train_losses(copy.deepcopy(base).to("flagos"), tokens, scalar=True)
    compiled_model = copy.deepcopy(base).to("flagos")
    compiled = _train_losses(torch.compile(compiled_model), tokens, scalar=True)
    torch.testing.assert_close(compiled, eager, **TOL)
    assert all(p.device.type == "flagos" for p in compiled_model.parameters())


# ---- host backing: C++ kernels


@host_backing
def test_pointwise_and_reduction_compile_to_cpp_on_flagos():
    x, y = torch.randn(64, 128, device="flagos"), torch.randn(64, 128, device="flagos")
    out, code = run_and_get_code(torch.compile(_pointwise_reduction), x, y)
    source = "\n".join(code)
    assert "cpp_fused" in source and "async_compile.cpp" in source, source
    assert "@triton.jit" not in source
    assert inductor.registered() == "cpu"
    assert out.device.type == "flagos"
    torch.testing.assert_close(out, _pointwise_reduction(x, y), **TOL)
    torch.testing.assert_close(out.cpu(), _pointwise_reduction(x.cpu(), y.cpu()), **TOL)


@host_backing
def test_forward_and_backward_equal_eager_with_extern_mm_through_flagos():
    a0, b0 = torch.randn(32, 64), torch.randn(64, 16)
    a, b = a0.to("flagos").requires_grad_(), b0.to("flagos").requires_grad_()
    compiled = torch.compile(_matmul_chain)
    compiled(a, b).backward()  # compile forward and backward once
    a.grad = b.grad = None

    torch_fl.runtime.core().reset_route_counts()
    out, code = run_and_get_code(compiled, a, b)
    assert _native_calls(("aten::mm",)) >= 1, "the compiled forward's mm did not dispatch through flagos"
    out.backward()
    assert _native_calls(("aten::mm",)) >= 3, "the compiled backward's mms did not dispatch through flagos"
    assert "extern_kernels.mm" in "\n".join(code)

    ae, be = a0.to("flagos").requires_grad_(), b0.to("flagos").requires_grad_()
    eager = _matmul_chain(ae, be)
    eager.backward()
    torch.testing.assert_close(out, eager, **TOL)
    torch.testing.assert_close(a.grad, ae.grad, **TOL)
    torch.testing.assert_close(b.grad, be.grad, **TOL)
    assert a.grad.device.type == "flagos" and b.grad.device.type == "flagos"


@host_backing
def test_mlp_trains_three_steps_like_eager():
    torch.manual_seed(0)
    base = MLP()
    x = torch.randn(16, 32).to("flagos")
    eager = _train_losses(copy.deepcopy(base).to("flagos"), x)
    compiled_model = copy.deepcopy(base).to("flagos")
    compiled = _train_losses(torch.compile(compiled_model), x)
    torch.testing.assert_close(compiled, eager, **TOL)
    assert all(p.device.type == "flagos" for p in compiled_model.parameters())


# ---- CUDA backing: Triton kernels


@pytest.mark.cuda
@cuda_backing
def test_pointwise_and_reduction_compile_to_triton_on_flagos():
    x, y = torch.randn(512, 1024, device="flagos"), torch.randn(512, 1024, device="flagos")
    out, code = run_and_get_code(torch.compile(_pointwise_reduction), x, y)
    assert "@triton.jit" in "\n".join(code)
    assert inductor.registered() == "cuda"
    assert out.device.type == "flagos"
    torch.testing.assert_close(out, _pointwise_reduction(x, y), **TOL)


@pytest.mark.cuda
@cuda_backing
def test_triton_forward_and_backward_equal_eager_with_extern_mm_through_flagos():
    a0, b0 = torch.randn(128, 256), torch.randn(256, 64)
    a, b = a0.to("flagos").requires_grad_(), b0.to("flagos").requires_grad_()
    compiled = torch.compile(_matmul_chain)
    compiled(a, b).backward()
    a.grad = b.grad = None
    torch_fl.runtime.core().reset_route_counts()
    out, code = run_and_get_code(compiled, a, b)
    out.backward()
    assert _native_calls(("aten::mm",)) >= 3, "mm in the compiled code did not dispatch through flagos"
    assert "@triton.jit" in "\n".join(code)
    ae, be = a0.to("flagos").requires_grad_(), b0.to("flagos").requires_grad_()
    eager = _matmul_chain(ae, be)
    eager.backward()
    torch.testing.assert_close(out, eager, rtol=1e-3, atol=1e-2)
    torch.testing.assert_close(a.grad, ae.grad, rtol=1e-3, atol=1e-3)
    torch.testing.assert_close(b.grad, be.grad, rtol=1e-3, atol=1e-3)


@pytest.mark.cuda
@cuda_backing
def test_triton_mlp_trains_three_steps_like_eager():
    torch.manual_seed(0)
    base = MLP(256)
    x = torch.randn(64, 256).to("flagos")
    eager = _train_losses(copy.deepcopy(base).to("flagos"), x)
    compiled = _train_losses(torch.compile(copy.deepcopy(base).to("flagos")), x)
    torch.testing.assert_close(compiled, eager, rtol=1e-3, atol=1e-4)


# ---------------------------------------------------------------------------------------------
# mode="reduce-overhead": inductor's CUDA graph trees over flagos graphs


def test_cudagraph_gate_reads_one_flagos_device_as_its_cuda_device():
    from torch._inductor import cudagraph_utils

    check = getattr(cudagraph_utils.check_multiple_devices_or_any_cpu_nodes, "__wrapped__", None)
    check = check or cudagraph_utils.check_multiple_devices_or_any_cpu_nodes
    node = object()
    assert inductor._flagos_as_cuda({torch.device("flagos", 1): node}) == {torch.device("cuda", 1): node}
    assert check(inductor._flagos_as_cuda({torch.device("flagos", 0): node})) is None
    # Beside a real CUDA device, or another flagos device, the graph spans devices: no graphs.
    both = {torch.device("flagos", 0): node, torch.device("cuda", 0): node}
    assert inductor._flagos_as_cuda(both) == both
    assert "multiple devices" in check(inductor._flagos_as_cuda(both))
    assert "multiple devices" in check(inductor._flagos_as_cuda({torch.device("flagos", i): node for i in (0, 1)}))


@pytest.mark.skipif(not ACTIVE, reason="flagos is not active in this process")
def test_over_backing_hands_the_graph_machinery_backing_tensors_and_the_model_flagos_ones():
    """The boundary of `over_backing`, against a stand-in for cudagraphify that records on the
    first call and replays its own static outputs after (as the tree manager does)."""
    seen: dict[str, list] = {"machinery": [], "model": [], "static": []}

    def fake_cudagraphify(model, static_input_idxs=(), **kwargs):
        assert all(c.device.type == BACKING for c in kwargs["constants"])
        static: list = []

        def run(inputs):
            seen["machinery"].append([x.device.type for x in inputs if isinstance(x, torch.Tensor)])
            seen["static"].append(inputs[1])
            if not static:
                copies = [x.clone() if isinstance(x, torch.Tensor) else x for x in inputs]
                inputs.clear()
                static.append(list(copies))
                static.append(model(copies))
                assert not copies, "the model empties its input list"
            else:  # a replay: new inputs into the static ones, the graph's work into the static outputs
                for dst, src in zip(static[0], inputs):
                    if isinstance(src, torch.Tensor):
                        dst.copy_(src)
                inputs.clear()
                for dst, src in zip(static[1], model(list(static[0]))):
                    if isinstance(dst, torch.Tensor):
                        dst.copy_(src)
            return list(static[1])

        return run

    def model(args):
        seen["model"].append([x.device.type for x in args if isinstance(x, torch.Tensor)])
        x, w, n = args
        args.clear()
        return (x @ w, n + 1, torch.zeros(1))

    constant = torch.ones(2, device="flagos")
    run = inductor.over_backing(fake_cudagraphify, model, (1,), constants=(constant,))
    w = torch.randn(4, 4, device="flagos")
    for step in range(3):
        x = torch.randn(3, 4, device="flagos")
        inputs = [x, w, step]
        out = run(inputs)
        assert inputs == [], "run empties its input list"
        assert isinstance(out, list) and out[0].device.type == "flagos" and out[2].device.type == "cpu"
        torch.testing.assert_close(out[0], x @ w)
        assert out[1] == 1  # recorded with step 0: a replay returns the static outputs
    assert seen["model"] == [["flagos", "flagos"]] * 3
    assert seen["machinery"] == [[BACKING, "flagos"]] * 3
    # the static input (position 1) reaches the machinery as the program's own tensor
    assert all(static is w for static in seen["static"])


@pytest.mark.skipif(not ACTIVE, reason="flagos is not active in this process")
def test_an_output_over_a_static_input_shares_its_storage_on_both_sides_of_the_boundary():
    """The tree manager tells an output over an input's memory by the storage object of the input
    it gave (any other output must lie in its memory pool; a training graph returns parameters for
    the backward), and the program gets an output over its own tensor's storage, as on the backing."""
    machinery_saw_input_storage = []

    def fake_cudagraphify(model, static_input_idxs=(), **kwargs):
        def run(inputs):
            given = list(inputs)
            outputs = model(inputs)
            machinery_saw_input_storage.append(outputs[0].untyped_storage()._cdata == given[0].untyped_storage()._cdata)
            return outputs

        return run

    def model(args):
        (w,) = args
        args.clear()
        return (w.t(), w + 1)

    run = inductor.over_backing(fake_cudagraphify, model, (0,))
    w = torch.randn(4, 4, device="flagos")
    for _ in range(2):
        transposed, _ = run([w])
        assert transposed.device.type == "flagos" and torch.equal(transposed.cpu(), w.t().cpu())
        assert transposed.untyped_storage()._cdata == w.untyped_storage()._cdata
        assert not transposed.is_inference()  # autograd may save it for the backward
    assert machinery_saw_input_storage == [True, True]


def _over_one_static_input(cudagraphify, fn):
    """`over_backing` around a graph of one static input that returns `fn` of it."""

    def model(args):
        (x,) = args
        args.clear()
        return (fn(x),)

    return inductor.over_backing(cudagraphify, model, (0,))


@pytest.mark.skipif(not ACTIVE, reason="flagos is not active in this process")
def test_a_recorded_output_over_a_static_input_comes_back_over_the_programs_storage(monkeypatch):
    """Recording, the tree manager asserts that every output is a CUDA tensor and tells one over a
    static input by its address; its replays return that same tensor, which the program gets back
    as a tensor over its own parameter's storage."""
    monkeypatch.setattr(inductor, "_recording", lambda: True)
    recorded: list = []

    def fake_cudagraphify(model, static_input_idxs=(), **kwargs):
        def run(inputs):
            if not recorded:
                recorded.extend(model(inputs))
            inputs.clear()
            return list(recorded)

        return run

    run = _over_one_static_input(fake_cudagraphify, torch.t)
    w = torch.randn(4, 4, device="flagos")
    for _ in range(2):
        (transposed,) = run([w])
        assert transposed.device.type == "flagos" and torch.equal(transposed.cpu(), w.t().cpu())
        assert transposed.untyped_storage()._cdata == w.untyped_storage()._cdata
    assert recorded[0].device.type == BACKING and recorded[0].data_ptr() == w.data_ptr()


def _graph_inputs() -> object:
    """GraphInputs that alias the input at position 1."""
    from torch_fl.runtime.device.core import core

    return core().GraphInputs([1])


@pytest.mark.skipif(not ACTIVE, reason="flagos is not active in this process")
def test_graph_inputs_alias_their_positions_and_pass_the_rest():
    w, x = torch.randn(4, 4, device="flagos"), torch.randn(3, device="flagos")
    inputs = [w, x, 7]
    converted = _graph_inputs().to_backing(inputs)
    assert inputs == [w, x, 7]  # the given list stays as it was
    assert converted[0] is w and converted[2] == 7
    assert converted[1].device.type == BACKING and converted[1].data_ptr() == x.data_ptr()
    assert torch.equal(converted[1].cpu(), x.cpu())
    with pytest.raises(TypeError, match="input 1 is not a tensor"):
        _graph_inputs().to_backing([w, 7])


@pytest.mark.skipif(not ACTIVE, reason="flagos is not active in this process")
def test_graph_outputs_come_back_as_flagos_over_the_storage_they_alias():
    from torch_fl.runtime import as_backing

    graph_inputs = _graph_inputs()
    w = torch.arange(6.0, device="flagos").view(2, 3)
    alias = as_backing(w)
    assert graph_inputs.outputs_as_flagos((alias, 7)) == (alias, 7)  # no output positions yet
    graph_inputs.set_outputs([0, 2])
    fresh = as_backing(torch.ones(2, device="flagos")).clone()
    view, seven, other = graph_inputs.outputs_as_flagos((alias[1], 7, fresh))
    assert view.device.type == other.device.type == "flagos" and seven == 7
    assert view.untyped_storage()._cdata == w.untyped_storage()._cdata  # over the program's own storage
    assert view.tolist() == [3.0, 4.0, 5.0] and other.tolist() == [1.0, 1.0]
    assert other.data_ptr() == fresh.data_ptr()  # an alias, not a copy
    assert isinstance(graph_inputs.outputs_as_flagos([alias, 7, fresh]), list)
    with pytest.raises(TypeError, match="output 2 is not a tensor"):
        graph_inputs.outputs_as_flagos((alias, 7, 8))


@pytest.mark.skipif(not ACTIVE, reason="flagos is not active in this process")
def test_graph_inputs_refuse_positions_outside_the_inputs_and_unordered_ones():
    from torch_fl.runtime.device.core import core

    with pytest.raises(IndexError, match="position 3 is outside the 1 inputs"):
        core().GraphInputs([3]).to_backing([torch.ones(1, device="flagos")])
    with pytest.raises(ValueError, match="positions must be increasing"):
        core().GraphInputs([1, 0])
    with pytest.raises(IndexError, match="output 1 is missing"):
        graph_inputs = core().GraphInputs([])
        graph_inputs.set_outputs([1])
        graph_inputs.outputs_as_flagos([torch.ones(1, device="flagos")])


@pytest.mark.skipif(not ACTIVE, reason="flagos is not active in this process")
def test_a_check_failing_in_the_core_raises_a_python_error():
    from torch_fl.runtime.device.core import core

    with pytest.raises(RuntimeError, match="the flagos backing is set once per process") as raised:
        core().init("cpu", 1)
    assert "Exception raised from" not in str(raised.value)  # the message, not the C++ backtrace


@pytest.mark.skipif(not ACTIVE, reason="flagos is not active in this process")
def test_the_boundary_holds_no_static_input_alive():
    """A static input the program drops is freed at once, as on the backing: transformers makes a
    new static KV cache per generate, and one the boundary held would put the next at other
    addresses, so the CUDA graphs recorded over the old ones would never replay again."""

    def fake_cudagraphify(model, static_input_idxs=(), **kwargs):
        return model

    run = _over_one_static_input(fake_cudagraphify, torch.sum)
    torch.flagos.synchronize()
    before = torch.flagos.memory_allocated()
    cache = torch.zeros(1 << 20, device="flagos")
    (total,) = run([cache])
    assert total.item() == 0 and torch.flagos.memory_allocated() >= before + cache.nbytes
    del total, cache
    assert torch.flagos.memory_allocated() == before
    (total,) = run([torch.ones(1 << 20, device="flagos")])  # a new tensor in its place
    assert total.item() == 1 << 20


@pytest.mark.skipif(not ACTIVE, reason="flagos is not active in this process")
def test_outputs_over_one_buffer_reach_the_graph_machinery_as_one_storage():
    """An output over an input's buffer shares the storage object of the input the machinery gave
    (the tree manager tells such outputs by storage object), and outputs over one new buffer share
    one storage object."""
    from torch_fl.runtime import as_backing

    given = [as_backing(torch.arange(12.0, device="flagos").view(3, 4)), 7]
    x = torch_fl.runtime.as_flagos(given[0])
    y = torch.ones(8, device="flagos")
    convert = inductor._shared_aliases(given, as_backing, recording=False)
    view_of_input, y0, y1 = convert(x[1:, ::2]), convert(y[:4]), convert(y[4:].view(2, 2))
    assert view_of_input.untyped_storage()._cdata == given[0].untyped_storage()._cdata
    assert view_of_input.tolist() == [[4.0, 6.0], [8.0, 10.0]] and view_of_input.device.type == BACKING
    assert y0.untyped_storage()._cdata == y1.untyped_storage()._cdata != view_of_input.untyped_storage()._cdata
    assert y1.storage_offset() == 4 and y1.shape == (2, 2) and y0.device.type == BACKING


def _deep_mlp(width: int, layers: int) -> nn.Module:
    blocks: list[nn.Module] = []
    for _ in range(layers):
        blocks += [nn.Linear(width, width), nn.GELU()]
    return nn.Sequential(*blocks)


def _recorded_cuda_graphs(device_index: int = 0) -> int:
    """CUDA graphs the tree manager of the device has recorded (nodes of its trees)."""
    from torch._inductor.cudagraph_trees import get_manager

    manager = get_manager(device_index, create_if_none_exists=False)
    if manager is None:
        return 0
    nodes = [node for roots in (manager.roots or {}).values() for node in roots]
    count = 0
    while nodes:
        node = nodes.pop()
        count += 1
        nodes += [child for children in node.children.values() for child in children]
    return count


@pytest.mark.cuda
@cuda_backing
def test_reduce_overhead_captures_cuda_graphs_of_a_bf16_mlp_on_flagos():
    from torch._dynamo.utils import counters

    counters.clear()
    torch.manual_seed(0)
    model = _deep_mlp(512, 8).to("flagos", torch.bfloat16).eval()
    compiled = torch.compile(model, mode="reduce-overhead")
    with torch.no_grad():
        for _ in range(4):  # warm-up, record, then replays
            x = torch.randn(32, 512, device="flagos", dtype=torch.bfloat16)
            out = compiled(x)
            assert out.device.type == "flagos"
            torch.testing.assert_close(out, model(x), rtol=2e-2, atol=2e-2)
            del out
    assert counters["inductor"]["cudagraph_skips"] == 0, dict(counters["inductor"])
    assert _recorded_cuda_graphs() >= 1


@pytest.mark.cuda
@cuda_backing
def test_reduce_overhead_trains_like_eager_with_cuda_graphs_on_flagos():
    from torch._dynamo.utils import counters

    counters.clear()
    torch.manual_seed(0)
    base = MLP(256)
    x = torch.randn(64, 256).to("flagos")
    eager = _train_losses(copy.deepcopy(base).to("flagos"), x, steps=4)
    compiled = _train_losses(torch.compile(copy.deepcopy(base).to("flagos"), mode="reduce-overhead"), x, steps=4)
    torch.testing.assert_close(compiled, eager, rtol=1e-3, atol=1e-4)
    assert counters["inductor"]["cudagraph_skips"] == 0, dict(counters["inductor"])
    assert _recorded_cuda_graphs() >= 2  # forward and backward
