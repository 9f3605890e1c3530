"""Built packages describe themselves (torch_fl/compatibility.json) and preflight judges them without torch."""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from test_preflight import FORBIDDEN, imported_modules
from wheel_helpers import build_wheel

from torch_fl.platform import load_all
from torch_fl.platform.compatibility import (
    WHEEL_PATH,
    build_environment,
    build_manifest,
    inspect,
    kernel_pins,
    provenance_problems,
)
from torch_fl.platform.discovery import discover

pytestmark = pytest.mark.slow  # builds wheels


def shipped() -> dict:
    loaded, broken = load_all(discover(path_env=""))
    assert not broken
    return loaded


def fake_wheel(tmp_path: Path, manifest: dict) -> Path:
    path = tmp_path / "torch_fl-0.1.0-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as wheel:
        wheel.writestr(WHEEL_PATH, json.dumps(manifest))
    return path


def complete_manifest() -> dict:
    """The shipped table restricted to the platforms whose rows carry their provenance."""
    manifest = build_manifest("0.1.0", ">=2.11", shipped())
    manifest["platforms"] = {n: r for n, r in manifest["platforms"].items() if n in ("host_ref", "nvidia_h200")}
    return manifest


def test_manifest_rows_come_from_the_descriptors():
    descriptors = shipped()
    manifest = build_manifest("0.1.0", ">=2.11", descriptors)
    assert manifest["package"] == {"name": "torch-fl", "version": "0.1.0"}
    assert manifest["torch_requirement"] == ">=2.11"
    assert manifest["built_with"] == build_environment()
    assert set(manifest["platforms"]) == set(descriptors)
    h200 = manifest["platforms"]["nvidia_h200"]
    assert h200["kernel_sets"] == list(descriptors["nvidia_h200"].kernels.declared())
    assert h200["kernel_pins"] == kernel_pins(descriptors["nvidia_h200"]) == {"flag_gems": "5.0.2"}
    assert h200["sdk"] == {"name": "CUDA", "version": "13.0"} and h200["backing"] == "cuda"
    assert manifest["platforms"]["host_ref"]["features"] == list(descriptors["host_ref"].capabilities.features)


def test_provenance_is_required_of_device_platforms_and_vendor_modules():
    manifest = complete_manifest()
    assert provenance_problems(manifest) == {}
    broken = copy.deepcopy(manifest)
    broken["platforms"]["nvidia_h200"]["sdk"] = {"name": "CUDA", "version": None}
    broken["platforms"]["host_ref"]["vendor_module"] = "acme_kernels.ops"  # installed separately, no pin
    assert provenance_problems(broken) == {
        "nvidia_h200": ["SDK version"],
        "host_ref": ["the distribution and version of the vendor module acme_kernels.ops"],
    }
    # a module file inside the platform folder ships in the package: its provenance is the package
    broken["platforms"]["host_ref"]["vendor_module"] = "kernels.py"
    assert set(provenance_problems(broken)) == {"nvidia_h200"}


def test_drift_warns_and_does_not_fail(tmp_path):
    manifest = complete_manifest()
    manifest["built_with"].update(torch_line="1.0", python="2.7")
    manifest["platforms"]["host_ref"]["kernel_pins"] = {"pydantic": "0.0.1"}
    result = inspect(fake_wheel(tmp_path, manifest), "host_ref")
    assert result.ok, result.to_dict()
    drift = {d.what: (d.built, d.here) for d in result.drift}
    assert drift["torch_line"][0] == "1.0" and drift["python"] == ("2.7", build_environment()["python"])
    assert drift["pydantic"][0] == "0.0.1"


def test_inspecting_something_without_a_manifest_fails(tmp_path):
    path = tmp_path / "other.whl"
    with zipfile.ZipFile(path, "w") as wheel:
        wheel.writestr("other/__init__.py", "")
    result = inspect(path, None)
    assert not result.ok and "carries no torch_fl/compatibility.json" in result.error


def _preflight_cli(*args: str) -> subprocess.CompletedProcess:
    script = Path(sys.executable).with_name("torch-fl")
    if not script.exists():
        pytest.skip("the torch-fl command is not installed next to this interpreter")
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLAGOS_")}
    env["PYTHONPROFILEIMPORTTIME"] = "1"
    command = [str(script), "preflight", *args, "--json"]
    return subprocess.run(command, capture_output=True, text=True, timeout=120, env=env)


def test_cli_inspects_a_wheel_without_importing_torch(tmp_path):
    manifest = complete_manifest()
    manifest["built_with"]["torch_line"] = "1.0"
    out = _preflight_cli("--wheel", str(fake_wheel(tmp_path, manifest)))
    assert out.returncode == 0, out.stdout + out.stderr[-2000:]
    data = json.loads(out.stdout)
    assert data["ok"] and [d["what"] for d in data["drift"]][:1] == ["torch_line"]
    modules = imported_modules(out.stderr)
    assert "torch_fl.platform.compatibility" in modules
    assert not sorted(m for m in modules if m.split(".")[0] in FORBIDDEN or m.startswith(FORBIDDEN[1]))

    manifest["platforms"]["nvidia_h200"]["sdk"] = None
    out = _preflight_cli("--wheel", str(fake_wheel(tmp_path, manifest)))
    assert out.returncode == 1
    assert json.loads(out.stdout)["provenance"] == {"nvidia_h200": ["SDK name", "SDK version"]}


@pytest.mark.slow
def test_every_built_wheel_carries_its_compatibility(tmp_path):
    wheel = build_wheel(tmp_path)
    with zipfile.ZipFile(wheel) as archive:
        carried = json.loads(archive.read(WHEEL_PATH))
    assert carried == build_manifest("0.1.0", ">=2.11", shipped())
    result = inspect(wheel, "host_ref")
    assert result.drift == []  # built here
    # the release table fails exactly where a shipped descriptor lacks its provenance
    lacking = {
        name
        for name, d in shipped().items()
        if d.backing.device != "cpu" and (d.environment.sdk is None or not d.environment.sdk.version)
    }
    assert set(result.provenance) == lacking and not result.ok
