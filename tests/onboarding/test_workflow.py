"""The generated CI job: a GitHub Actions workflow that validates against GitHub's workflow schema
(the copy bundled in check-jsonschema, so no network) and passes actionlint where it is installed."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from onboard_helpers import make

CHECK_JSONSCHEMA = Path(sys.executable).with_name("check-jsonschema")
LAYOUTS = [
    pytest.param({}, id="host-default"),
    pytest.param({"like": "nvidia_h200"}, id="like-h200-self-hosted"),
    pytest.param({"like": "host_ref", "backing": "cuda"}, id="cuda-backing"),
    pytest.param({"like": "ascend_910c"}, id="like-ascend"),
]


def workflow(repo: Path, chip: str = "demo_chip") -> Path:
    return repo / ".github" / "workflows" / f"flagos-{chip}.yml"


def check_schema(path: Path) -> subprocess.CompletedProcess:
    command = shutil.which("check-jsonschema") or str(CHECK_JSONSCHEMA)
    return subprocess.run(
        [command, "--builtin-schema", "vendor.github-workflows", str(path)], capture_output=True, text=True, timeout=120
    )


@pytest.mark.parametrize("options", LAYOUTS)
def test_workflow_validates_against_the_github_schema(repo, options):
    make(repo, **options)
    result = check_schema(workflow(repo))
    assert result.returncode == 0, result.stdout + result.stderr


def test_schema_check_catches_a_broken_workflow(repo):
    """The check above is real: a workflow missing runs-on fails it."""
    make(repo)
    path = workflow(repo)
    path.write_text(path.read_text().replace("    runs-on: ubuntu-latest\n", ""))
    assert check_schema(path).returncode != 0


@pytest.mark.skipif(shutil.which("actionlint") is None, reason="actionlint is not installed here")
@pytest.mark.parametrize("options", LAYOUTS)
def test_actionlint(repo, options):
    make(repo, **options)
    result = subprocess.run(["actionlint", str(workflow(repo))], capture_output=True, text=True, timeout=120, cwd=repo)
    assert result.returncode == 0, result.stdout + result.stderr


def steps(data: dict) -> list[dict]:
    return data["jobs"]["conformance"]["steps"]


def run_lines(data: dict) -> str:
    return "\n".join(step.get("run", "") for step in steps(data))


def test_host_job(repo):
    make(repo)
    data = yaml.safe_load(workflow(repo).read_text())
    job = data["jobs"]["conformance"]
    assert job["runs-on"] == "ubuntu-latest" and job["timeout-minutes"] == 60
    assert job["env"]["FLAGOS_PLATFORM_PATH"] == "${{ github.workspace }}/plats"
    lines = run_lines(data)
    assert '"torch==2.' in lines and "--index-url https://download.pytorch.org/whl/cpu" in lines  # pinned CPU torch
    assert "torch-fl preflight demo_chip" in lines
    assert "torch-fl conformance run demo_chip --json --fail-on-failure" in lines  # a failing path fails the job
    upload = next(s for s in steps(data) if s.get("uses", "").startswith("actions/upload-artifact"))
    assert upload["if"] == "${{ always() }}"
    assert "plats/demo_chip/records/" in upload["with"]["path"]
    assert "conformance-demo_chip.json" in upload["with"]["path"]
    assert any(s.get("uses", "").startswith("actions/setup-python") for s in steps(data))


def test_board_job_uses_the_descriptor(repo):
    make(repo, "gpu_chip", like="nvidia_h200")
    data = yaml.safe_load(workflow(repo, "gpu_chip").read_text())
    job = data["jobs"]["conformance"]
    assert job["runs-on"] == ["self-hosted", "gpu-chip"] and job["timeout-minutes"] == 120
    lines = run_lines(data)
    assert 'pip install "flag-gems==5.0.2"' in lines  # ci.setup of the descriptor
    assert "download.pytorch.org/whl/cpu" not in lines
    assert not any(s.get("uses", "").startswith("actions/setup-python") for s in steps(data))


def test_watched_paths(repo):
    make(repo)
    data = yaml.safe_load(workflow(repo).read_text())
    triggers = data[True] if True in data else data["on"]  # YAML 1.1 reads the key `on` as true
    assert triggers["pull_request"]["paths"] == ["plats/demo_chip/**", ".github/workflows/flagos-demo_chip.yml"]
