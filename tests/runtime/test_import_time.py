"""What the autoloaded `import torch` brings in. The time itself is measured by bench/import_time.py
(timed tests fail on loaded machines); this checks the reason it stays short: activation imports
the runtime and the platform data only, never the CLI, the conformance harness, onboarding or a
kernel library."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import torch_fl

# Packages only the tools need; any of them at activation would cost every `import torch`.
TOOLS_ONLY = ("torch_fl.cli", "conformance", "onboarding", "flag_gems", "typer", "rich", "jinja2", "ruamel", "pytest")


def test_autoload_imports_no_tool_package():
    env = dict(os.environ, TORCH_DEVICE_BACKEND_AUTOLOAD="1", FLAGOS_PLATFORM=torch_fl.active_platform().name)
    probe = "import json, sys, torch; assert hasattr(torch, 'flagos'); print(json.dumps(sorted(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", probe], env=env, check=True, capture_output=True, text=True)
    modules = json.loads(out.stdout.splitlines()[-1])
    loaded = [m for m in modules if any(m == p or m.startswith(p + ".") for p in TOOLS_ONLY)]
    assert loaded == []
    assert "torch_fl.runtime.device" in modules
