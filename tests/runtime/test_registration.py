"""How flagos becomes a PyTorch device: torch.flagos, the device name, generated methods, and
the activation rule (checked in fresh interpreters)."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn
from torch.nn.utils.rnn import pack_sequence

import torch_fl

# On a CUDA machine the child processes need a platform asked for, or flagos stays contained.
PLATFORM_ENV = {"FLAGOS_PLATFORM": torch_fl.active_platform().name} if torch_fl.is_active() else {}


def test_torch_flagos_module():
    assert torch.flagos is torch_fl.runtime.device or torch.flagos.__name__ == "torch_fl.runtime.device"
    for name in (
        "device_count",
        "current_device",
        "set_device",
        "synchronize",
        "is_available",
        "Stream",
        "Event",
        "manual_seed",
        "get_rng_state",
        "memory_allocated",
        "get_amp_supported_dtype",
    ):
        assert callable(getattr(torch.flagos, name)), name
    assert torch_fl.is_active() and torch_fl.active_platform() is not None


def test_device_name_parses():
    assert torch.device("flagos").type == "flagos"
    assert torch.device("flagos:1").index == 1
    assert torch.device("flagos", 0) == torch.device("flagos:0")
    assert torch._C._get_privateuse1_backend_name() == "flagos"
    assert torch.device("privateuseone:0").type == "flagos"


def test_generated_tensor_methods():
    x = torch.ones(2)
    assert not x.is_flagos
    y = x.flagos()
    assert y.is_flagos and y.device == torch.device("flagos", 0)
    assert y.flagos() is y
    assert torch.equal(y.cpu(), x)


def test_generated_module_and_storage_methods():
    model = nn.Linear(2, 2)
    assert model.flagos() is model
    assert model.weight.is_flagos and model.bias.is_flagos
    storage = torch.ones(3).untyped_storage().flagos()
    assert storage.device.type == "flagos"
    assert torch.ones(2).untyped_storage().is_flagos is False
    assert storage.is_flagos


def test_generated_packed_sequence_method():
    packed = pack_sequence([torch.ones(3, 2), torch.ones(2, 2)])
    moved = packed.flagos()
    assert moved.data.is_flagos and moved.is_flagos


@pytest.mark.two_devices
def test_generated_methods_take_an_index():
    assert torch.ones(1).flagos(1).device.index == 1
    assert nn.Linear(1, 1).flagos(1).weight.device.index == 1


# The activation rule (torch_fl.activation): PyTorch's autoload during `import torch`, or torch_fl.activate();
# importing torch_fl or its modules activates nothing. One test per clause, each in a fresh interpreter.


@pytest.mark.own_process
def test_import_torch_alone_activates_flagos(run_python):
    result = run_python(
        """
        import sys, torch
        assert "torch_fl" in sys.modules, "the torch.backends entry point did not run"
        print(hasattr(torch, "flagos"), torch.ones(1, device="flagos").device)
        """,
        env={**PLATFORM_ENV, "TORCH_DEVICE_BACKEND_AUTOLOAD": None},
    )
    assert result.stdout.split() == ["True", "flagos:0"]


# On a machine with a real CUDA device the autoload activates at once (torch_fl.activation).
DEFERS = pytest.mark.skipif(torch.cuda.device_count() > 0, reason="a CUDA machine: the autoload does not defer")


@pytest.mark.own_process
@DEFERS
@pytest.mark.parametrize(
    "use, shown",
    [
        ("torch.tensor([1.0], device='flagos').device", "flagos:0"),
        ("torch.ones(1).to('flagos').device", "flagos:0"),
        ("torch.nn.Linear(1, 1).to('flagos').weight.device", "flagos:0"),
        ("torch.ones(1).flagos().device", "flagos:0"),
        ("torch.flagos.device_count() > 0", "True"),
        ("torch.accelerator.is_available()", "True"),
        ("torch_fl.activate().name", "PLATFORM"),
        ("torch_fl.active_platform().name", "PLATFORM"),
    ],
)
def test_first_use_activates(run_python, use, shown):
    """The autoload defers the activation to the first use of flagos, whichever it is; that use then
    sees flagos as it would have after an activation at import."""
    result = run_python(
        f"""
        import sys, torch
        from torch_fl.runtime import standby
        assert torch.device("flagos:1").index == 1 and standby.pending()
        assert "torch_fl.platform.descriptor" not in sys.modules and "torch_fl_core" not in sys.modules
        import torch_fl
        print({use})
        assert torch.flagos.__name__ == "torch_fl.runtime.device"
        print(torch_fl.active_platform().name)
        """,
        env={**PLATFORM_ENV, "TORCH_DEVICE_BACKEND_AUTOLOAD": None},
    )
    platform = result.stdout.split()[-1]
    assert result.stdout.split() == [shown.replace("PLATFORM", platform), platform], result.stderr[-3000:]


@pytest.mark.own_process
def test_autoload_off_leaves_flagos_inactive_until_activate(run_python):
    result = run_python(
        """
        import sys, torch
        print("torch_fl" in sys.modules, hasattr(torch, "flagos"))
        import torch_fl
        print(torch_fl.is_active())
        try:
            torch.device("flagos")
            print("parsed")
        except RuntimeError:
            print("unknown")
        torch_fl.activate()
        print(torch_fl.is_active(), torch.ones(1, device="flagos").device)
        """,
        env={**PLATFORM_ENV, "TORCH_DEVICE_BACKEND_AUTOLOAD": "0"},
    )
    assert result.stdout.split() == ["False", "False", "False", "unknown", "True", "flagos:0"]


@pytest.mark.own_process
def test_import_torch_fl_imports_no_torch_and_activates_nothing(run_python):
    result = run_python(
        """
        import sys, torch_fl
        print("torch" in sys.modules, torch_fl.is_active())
        """,
        env={**PLATFORM_ENV, "TORCH_DEVICE_BACKEND_AUTOLOAD": None},
    )
    assert result.stdout.split() == ["False", "False"]


# A tuned table installs a Python route kernel at activation, and PyTorch refuses a second Python kernel
# for the same op and key (seen on torch 2.11): one Router in the process shows one activation.
ONE_ROUTER_TABLE = (
    "format: 1\nops:\n  aten::_to_copy:\n    candidates: [native, emulated]\n"
    "    buckets:\n      - {max_numel: 64, dtype: float32, choice: native}\n"
)


@pytest.mark.own_process
@pytest.mark.parametrize("program", ["import torch_fl, torch", "import torch_fl; torch_fl.activate(); import torch"])
def test_torch_fl_before_torch_activates_once(run_python, tmp_path, program):
    """`import torch_fl` first, then torch: its autoload activates. `torch_fl.activate()` first: it imports
    torch, whose autoload leaves the activation to it. Either way the platform is activated once."""
    table = tmp_path / "routes.yaml"
    table.write_text(ONE_ROUTER_TABLE)
    result = run_python(
        f"""
        import gc
        {program}
        from torch_fl.routing.runtime import Router
        print(torch_fl.is_active(), torch.ones(1, device="flagos").device)
        print(sum(isinstance(o, Router) for o in gc.get_objects()), "router")
        """,
        env={**PLATFORM_ENV, "TORCH_DEVICE_BACKEND_AUTOLOAD": None, "FLAGOS_ROUTES": str(table)},
        check=False,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.split() == ["True", "flagos:0", "1", "router"]


@pytest.mark.own_process
@pytest.mark.parametrize(
    "module",
    [
        "torch_fl.routing.explanation",
        "torch_fl.routing.runtime",
        "torch_fl.runtime",
        "torch_fl.kernels.base",
        "torch_fl.numerics",
        "torch_fl.conformance.compare",
        "torch_fl.workloads.decoder",
    ],
)
def test_a_module_of_ours_imported_before_torch_lets_autoload_activate(run_python, module):
    """The first `import torch` may come from inside one of our modules; the autoload it runs must not
    find that module half-imported."""
    result = run_python(
        f"""
        import {module}
        import torch, torch_fl
        print(torch_fl.is_active(), torch.ones(1, device="flagos").device)
        """,
        env={**PLATFORM_ENV, "TORCH_DEVICE_BACKEND_AUTOLOAD": None},
        check=False,
    )
    assert result.returncode == 0 and "not activated" not in result.stderr, result.stderr[-3000:]
    assert result.stdout.split() == ["True", "flagos:0"]


def test_every_module_that_imports_torch_is_imported_after_it():
    """torch_fl.activation.NEEDS_TORCH names every module whose own top-level code imports torch."""
    import ast
    from pathlib import Path

    from torch_fl.activation import NEEDS_TORCH

    root = Path(__file__).resolve().parents[2]
    folders = {"torch_fl": root / "torch_fl", "torch_fl.conformance": root / "conformance"}
    unlisted = []
    for package, folder in folders.items():
        for path in folder.rglob("*.py"):
            parts = path.relative_to(folder).with_suffix("").parts
            name = ".".join((package, *parts)).removesuffix(".__init__")
            tree = ast.parse(path.read_text())
            imports_torch = any(
                isinstance(node, ast.Import)
                and any(a.name == "torch" or a.name.startswith("torch.") for a in node.names)
                or isinstance(node, ast.ImportFrom)
                and node.module is not None
                and (node.module == "torch" or node.module.startswith("torch."))
                for node in tree.body
            )
            if imports_torch and not name.startswith(NEEDS_TORCH):
                unlisted.append(name)
    assert not unlisted, f"import torch at top level but not in NEEDS_TORCH: {sorted(unlisted)}"


@pytest.mark.own_process
def test_cli_activates_nothing(run_python):
    """The torch-fl command imports its modules without torch, and its process stays inactive even when
    a command imports torch: it activates only the platform a command names."""
    result = run_python(
        """
        import sys
        from torch_fl.cli import commands, main
        print("torch" in sys.modules)
        sys.argv = ["torch-fl", "--help"]
        try:
            main()
        except SystemExit as exit:
            assert not exit.code, exit.code
        import torch, torch_fl
        print(torch_fl.is_active(), hasattr(torch, "flagos"))
        """,
        env={**PLATFORM_ENV, "TORCH_DEVICE_BACKEND_AUTOLOAD": None},
        check=False,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "Usage" in result.stdout
    assert result.stdout.split()[0] == "False" and result.stdout.split()[-2:] == ["False", "False"], result.stdout


@pytest.mark.own_process
def test_failed_start_is_reported_again_on_retry(run_python):
    """If a late step of the runtime's start fails, a second activation (e.g. `torch_fl.activate()` after
    a failed autoload) must fail with that same cause, or succeed; not with a follow-on error from
    the half-started core."""
    result = run_python(
        """
        import torch, torch_fl
        from torch_fl.runtime import inductor

        def broken(backing):
            raise RuntimeError("injected failure")

        inductor.register = broken
        for attempt in (1, 2):
            try:
                torch_fl.activate()
                print(attempt, "ok")
            except Exception as exc:
                print(attempt, type(exc).__name__, exc)
        """,
        env={**PLATFORM_ENV, "TORCH_DEVICE_BACKEND_AUTOLOAD": "0"},
    )
    lines = result.stdout.strip().splitlines()
    assert lines[0] == "1 RuntimeError injected failure", result.stdout
    assert lines[1] in ("2 RuntimeError injected failure", "2 ok"), result.stdout


@pytest.mark.own_process
def test_a_route_filter_replaces_the_native_claim_without_pytorchs_warning(run_python):
    """Each gated route installs a filter over the op's PrivateUse1 kernel (the core's native claim):
    meant, so PyTorch's multi-line "Overriding a previously registered kernel" warning must not
    print at every activation of a platform with vendor kernels."""
    result = run_python(
        """
        import torch
        from torch_fl.runtime import core
        core()  # the first use of flagos registers its kernels
        assert torch._C._dispatch_has_kernel_for_dispatch_key("aten::neg", "PrivateUse1")
        handles = [core().install_route_filter(op, [], [], False) for op in ("aten::neg", "aten::silu")]
        print(torch.neg(torch.ones(2, device="flagos")).cpu().tolist())
        """,
        env=PLATFORM_ENV,
    )
    assert result.stdout.split() == ["[-1.0,", "-1.0]"]
    assert "Overriding a previously registered kernel" not in result.stderr, result.stderr
