"""What the autoloaded `import torch` brings in. The time itself is measured by bench/import_time.py
(timed tests fail on loaded machines); this checks the reasons it stays short: the autoload only names
the device (no platform data, no core), and the activation at first use imports the runtime and the
platform data only, never the CLI, the conformance harness, onboarding or a kernel library."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

import torch_fl

# Packages only the tools need; any of them at activation would cost every process that uses flagos.
TOOLS_ONLY = ("torch_fl.cli", "conformance", "onboarding", "flag_gems", "typer", "rich", "jinja2", "ruamel", "pytest")
# What activating costs, and so what `import torch` alone must not import.
ACTIVATION_ONLY = (
    "pydantic",
    "yaml",
    "torch_fl.platform",
    "torch_fl.routing",
    "torch_fl.kernels",
    "torch_fl.runtime.build",
    "torch_fl.runtime.device",
    "torch_fl_core",
    "filelock",
    *TOOLS_ONLY,
)


def imported(code: str) -> list[str]:
    """The modules a fresh interpreter has imported after `code`, under the autoload."""
    env = dict(os.environ, TORCH_DEVICE_BACKEND_AUTOLOAD="1", FLAGOS_PLATFORM=torch_fl.active_platform().name)
    probe = f"import json, sys\n{code}\nprint(json.dumps(sorted(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", probe], env=env, check=True, capture_output=True, text=True)
    return json.loads(out.stdout.splitlines()[-1])


def under(modules: list[str], packages: tuple[str, ...]) -> list[str]:
    return [m for m in modules if any(m == p or m.startswith(p + ".") for p in packages)]


@pytest.mark.skipif(torch.cuda.device_count() > 0, reason="a CUDA machine: the autoload activates at once")
def test_import_torch_names_flagos_and_imports_no_platform_data():
    modules = imported("import torch; assert torch.device('flagos').type == 'flagos'")
    assert "torch_fl" in modules, "the torch.backends entry point did not run"
    assert under(modules, ACTIVATION_ONLY) == []


def test_first_use_activates_without_tool_packages():
    modules = imported("import torch; assert torch.ones(1, device='flagos').device.type == 'flagos'")
    assert under(modules, TOOLS_ONLY) == []
    assert "torch_fl.runtime.device" in modules and "torch_fl.platform.descriptor" in modules
