"""Preflight checks the environment against a descriptor from metadata alone, never importing torch."""

from __future__ import annotations

import importlib.metadata
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from torch_fl.platform import load_descriptor, preflight
from torch_fl.platform.discovery import shipped_root


def platform_with(tmp_path: Path, base: str = "host_ref", **replacements: str):
    folder = tmp_path / base
    shutil.copytree(shipped_root() / base, folder)
    path = folder / "platform.yaml"
    text = path.read_text()
    for old, new in replacements.items():
        assert old in text, old
        text = text.replace(old, new)
    path.write_text(text)
    return load_descriptor(folder)


def by_name(report):
    return {c.name: c for c in report.checks}


def test_host_ref_is_ready_here():
    report = preflight(load_descriptor(shipped_root() / "host_ref"))
    assert report.ok, report.to_dict()
    assert by_name(report)["torch"].found == importlib.metadata.version("torch")


def test_report_dict_shape():
    data = preflight(load_descriptor(shipped_root() / "host_ref")).to_dict()
    assert set(data) == {"ok", "platform", "checks"}
    assert set(data["checks"][0]) == {"name", "ok", "expected", "found", "hint"}


def test_torch_version_mismatch(tmp_path):
    report = preflight(platform_with(tmp_path, **{'torch: ">=2.11"': 'torch: ">=9.0"'}))
    torch = by_name(report)["torch"]
    assert not report.ok and not torch.ok
    assert torch.expected == ">=9.0" and 'pip install "torch>=9.0"' in torch.hint


def test_python_interpreter_line(tmp_path):
    other = "3.9" if sys.version_info[:2] != (3, 9) else "3.8"
    report = preflight(platform_with(tmp_path, **{"environment:\n": f'environment:\n  python: "{other}"\n'}))
    check = by_name(report)["python"]
    assert not check.ok and check.expected.startswith(f"{other}.x")
    here = f"{sys.version_info.major}.{sys.version_info.minor}"
    assert by_name(
        preflight(platform_with(tmp_path / "b", **{"environment:\n": f'environment:\n  python: "{here}"\n'}))
    )["python"].ok


def test_kernel_package_missing(tmp_path):
    descriptor = platform_with(tmp_path, "nvidia_h200", **{"package: flag_gems": "package: flag_gems_absent_xyz"})
    gems = by_name(preflight(descriptor))["flag_gems_absent_xyz"]
    assert not gems.ok and gems.found == "not installed" and gems.expected == "==5.0.2"
    assert 'pip install "flag_gems_absent_xyz==5.0.2"' in gems.hint


def test_kernel_package_version_must_match_exactly(tmp_path):
    # pydantic stands in for a kernel library: installed, but not at the pinned version.
    descriptor = platform_with(
        tmp_path, "nvidia_h200", **{"package: flag_gems": "package: pydantic", "version: 5.0.2": "version: 0.0.1"}
    )
    check = by_name(preflight(descriptor))["pydantic"]
    assert not check.ok and check.found == importlib.metadata.version("pydantic")


def test_disabled_kernel_set_is_not_checked(tmp_path):
    descriptor = platform_with(
        tmp_path, "nvidia_h200", **{"    vendor: nvidia\n    enabled: true": "    vendor: nvidia\n    enabled: false"}
    )
    assert "flag_gems" not in by_name(preflight(descriptor))


def test_required_packages(tmp_path):
    descriptor = platform_with(
        tmp_path,
        **{'torch: ">=2.11"\n': 'torch: ">=2.11"\n  packages:\n    pydantic: ">=2"\n    no-such-dist-xyz: ">=1"\n'},
    )
    checks = by_name(preflight(descriptor))
    assert checks["pydantic"].ok
    assert not checks["no-such-dist-xyz"].ok and checks["no-such-dist-xyz"].found == "not installed"


def test_sdk_home_variable(tmp_path, monkeypatch):
    descriptor = platform_with(
        tmp_path,
        **{
            "environment:\n": "environment:\n  sdk:\n    name: TESTSDK\n    version: '1.0'\n    home_env: TESTSDK_HOME\n"
        },
    )
    monkeypatch.delenv("TESTSDK_HOME", raising=False)
    check = by_name(preflight(descriptor))["sdk TESTSDK"]
    assert not check.ok and check.found == "unset" and "set TESTSDK_HOME" in check.hint
    monkeypatch.setenv("TESTSDK_HOME", str(tmp_path / "absent"))
    assert "no such folder" in by_name(preflight(descriptor))["sdk TESTSDK"].found
    monkeypatch.setenv("TESTSDK_HOME", str(tmp_path))
    assert by_name(preflight(descriptor))["sdk TESTSDK"].ok


def test_descriptor_only_backing_fails_the_backing_check():
    check = by_name(preflight(load_descriptor(shipped_root() / "ascend_910c")))["backing"]
    assert not check.ok and "descriptor only" in check.hint


FORBIDDEN = ("torch", "torch_fl.runtime", "flag_gems")


def imported_modules(stderr: str) -> set[str]:
    """Module names from PYTHONPROFILEIMPORTTIME's report (`import time: self | cumulative | name`)."""
    return {
        line.rsplit("|", 1)[1].strip()
        for line in stderr.splitlines()
        if line.startswith("import time:") and "|" in line
    }


@pytest.mark.parametrize("args", [["preflight", "host_ref"], ["preflight", "--matrix"], ["platforms", "list"]])
def test_commands_never_import_torch_or_the_runtime(args):
    """Run the installed `torch-fl` command as a user would, and read which modules it imported."""
    script = Path(sys.executable).with_name("torch-fl")
    if not script.exists():
        pytest.skip("the torch-fl command is not installed next to this interpreter")
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLAGOS_")}
    env["PYTHONPROFILEIMPORTTIME"] = "1"
    out = subprocess.run([str(script), *args, "--json"], capture_output=True, text=True, timeout=120, env=env)
    assert out.returncode == 0, out.stderr[-3000:]
    modules = imported_modules(out.stderr)
    assert "torch_fl.platform.preflight" in modules
    bad = sorted(m for m in modules if m.split(".")[0] in FORBIDDEN or m.startswith(FORBIDDEN[1]))
    assert not bad, bad
