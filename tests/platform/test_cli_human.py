"""The human (non --json) output of the CLI: every command runs and says what a person needs.

Triage prints absolute record paths and re-run commands that work as printed; onboard suggests
names that are valid; `platforms list` says why a platform is stale, `show` prints one status,
`routes stats` has column headers, preflight checks that a CUDA backing has a CUDA build of torch;
the onboarding hints point to a script that exists; the first-import build says how long it takes
and only one of several processes says it builds.
"""

from __future__ import annotations

import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from torch_fl.cli import _register, app
from torch_fl.cli import output as cli_output
from torch_fl.conformance import recordfile
from torch_fl.onboarding.errors import OnboardError
from torch_fl.onboarding.names import check_name
from torch_fl.onboarding.onboard import next_steps
from torch_fl.platform import load_platform
from torch_fl.platform.discovery import shipped_root
from torch_fl.platform.preflight import preflight
from torch_fl.platform.record import Case, current_status, installed_version, record_path
from torch_fl.platform.versions import minor_line

_register()
runner = CliRunner()
REPO = Path(__file__).resolve().parents[2]
PREFLIGHT = sys.modules["torch_fl.platform.preflight"]  # the package exports a function of the same name


@pytest.fixture(autouse=True)
def plain_machine(monkeypatch):
    for var in ("FLAGOS_PLATFORM", "FLAGOS_PLATFORM_PATH", "FLAGOS_ALLOW_UNVALIDATED", "FLAGOS_ROUTES"):
        monkeypatch.delenv(var, raising=False)
    for shared in (cli_output.console, cli_output.err_console):
        monkeypatch.setattr(shared, "width", 400)  # no wrapping: tests read whole lines


def human(*args: str, code: int = 0) -> str:
    result = runner.invoke(app, list(args))
    assert result.exit_code == code, f"exit {result.exit_code}\n{result.output}\n{result.exception!r}"
    return result.output


def chip_on_path(tmp_path: Path, monkeypatch, name: str = "demo_chip") -> Path:
    """A copy of host_ref named `name` in an absolute FLAGOS_PLATFORM_PATH folder."""
    folder = tmp_path / "plats" / name
    shutil.copytree(shipped_root() / "host_ref", folder)
    path = folder / "platform.yaml"
    path.write_text(path.read_text().replace("name: host_ref", f"name: {name}"))
    monkeypatch.setenv("FLAGOS_PLATFORM_PATH", str(tmp_path / "plats"))
    return folder


def failing_record(folder: Path) -> Path:
    cases = [
        Case(
            id="ops/relu/float32/emulated/aten::relu",
            suite="ops",
            op="aten::relu",
            dtype="float32",
            path="emulated",
            keys=["float32@tiny"],
            status="failed",
            message="[/bold] 3/16 elements differ [red]x[/red] (rtol 1e-5)",
        ),
        Case(
            id="ops/add/float32/native",
            suite="ops",
            op="aten::add.Tensor",
            dtype="float32",
            path="native",
            status="passed",
        ),
    ]
    torch_line = minor_line(installed_version("torch"))
    binding = {"descriptor_hash": "sha256:x", "torch": torch_line, "torch_version": installed_version("torch")}
    path = record_path(folder, torch_line)
    header = {"platform": folder.name, "binding": binding, "started": "2026-01-01T00:00:00Z"}
    recordfile.write_cases(path, header, [c.model_dump() for c in cases])
    return path


# ---- 13: triage


def test_triage_human_output_with_an_absolute_record_path(tmp_path, monkeypatch):
    folder = chip_on_path(tmp_path, monkeypatch)
    record = failing_record(folder)
    assert record.is_absolute()
    output = human("triage", "demo_chip")
    assert f"demo_chip: 2 cases, 1 passed, 1 failing in 1 group(s)  {record}" in output
    assert "[/bold] 3/16 elements differ [red]x[/red]" in output  # data, not markup
    assert "torch-fl conformance run demo_chip --suite ops" in output


class _Captured(Exception):
    def __init__(self, options):
        self.options = options


def test_triage_rerun_command_works_as_printed(tmp_path, monkeypatch):
    folder = chip_on_path(tmp_path, monkeypatch)
    failing_record(folder)
    monkeypatch.chdir(tmp_path)
    line = next(row.strip() for row in human("triage", "demo_chip").splitlines() if "conformance run" in row)
    command = shlex.split(line.split(": ", 1)[1])
    assert command[:4] == ["torch-fl", "conformance", "run", "demo_chip"]

    def capture(options):
        raise _Captured(options)

    monkeypatch.setattr("torch_fl.conformance.runner.run", capture)
    monkeypatch.chdir(tmp_path / "plats")  # printed in one folder, run from another
    result = runner.invoke(app, command[1:])
    options = result.exception.options
    assert options.record_dir == tmp_path / ".conformance-runs" / "rerun-demo_chip"
    assert options.k == "relu-float32" and options.suites == ["ops"] and options.paths == ["native", "emulated"]


# ---- 14: names


@pytest.mark.parametrize("name", ["Bad Name!", "1chip", "Acme-X1", "CPU", "con", "---", "a" * 60, "Nul"])
def test_suggested_names_are_valid(name):
    from torch_fl.onboarding.names import suggest

    with pytest.raises(OnboardError) as info:
        check_name(name)
    suggestion = suggest(name)
    assert repr(suggestion) in str(info.value)
    assert check_name(suggestion) == suggestion


@pytest.mark.parametrize("name", ["con", "nul", "prn", "aux", "com1", "lpt9"])
def test_windows_device_names_are_reserved(name):
    with pytest.raises(OnboardError, match="reserved"):
        check_name(name)


def test_onboard_bad_name_human_output_suggests_a_valid_name(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    output = human("onboard", "--chip", "Bad Name!", "--dry-run", code=1)
    assert "'bad_name'" in output and "'bad name!'" not in output


# ---- 15: platforms list/show, routes stats, preflight


def test_platforms_list_says_why_a_platform_is_stale(tmp_path, monkeypatch):
    folder = chip_on_path(tmp_path, monkeypatch, "host_ref")
    path = folder / "platform.yaml"
    path.write_text(path.read_text().replace("display_name: ", "display_name: Changed "))
    status = current_status(load_platform("host_ref"))
    assert status.state == "stale" and status.reasons
    output = human("platforms", "list")
    assert f"host_ref is stale: {status.reasons[0]}" in " ".join(output.split())


def test_platforms_show_prints_one_status():
    descriptor = load_platform("host_ref")
    state = {"valid": "validated", "stale": "stale", "missing": "unvalidated"}[current_status(descriptor).state]
    output = human("platforms", "show", "host_ref")
    assert "descriptor says" not in output
    if state != descriptor.status:
        assert f"(platform.yaml claims {descriptor.status}; the conformance record decides)" in " ".join(output.split())


def test_routes_stats_has_column_headers():
    pytest.importorskip("torch")
    import torch_fl

    if not torch_fl.is_active() or torch_fl.active_platform().name != "host_ref":
        pytest.skip("routes stats activates host_ref in this process")
    output = human("routes", "stats", "host_ref", "--steps", "1")
    header = next(row for row in output.splitlines() if "calls" in row and "path" in row)
    assert "path" in header and "op" in header
    assert any("native" in row for row in output.splitlines())


def test_preflight_needs_a_cuda_build_of_torch_for_a_cuda_backing(monkeypatch):
    import torch

    assert PREFLIGHT.torch_cuda_version() == torch.version.cuda
    h200 = load_platform("nvidia_h200")
    monkeypatch.setattr(PREFLIGHT, "torch_cuda_version", lambda: None)
    check = next(c for c in preflight(h200).checks if c.name == "torch cuda build")
    assert not check.ok and check.found == "a CPU-only torch" and "CUDA build of torch" in check.hint
    monkeypatch.setattr(PREFLIGHT, "torch_cuda_version", lambda: "12.8")
    assert next(c for c in preflight(h200).checks if c.name == "torch cuda build").ok
    assert all(c.name != "torch cuda build" for c in preflight(load_platform("host_ref")).checks)


def test_preflight_human_output_on_a_cpu_only_torch(monkeypatch):
    monkeypatch.setattr(PREFLIGHT, "torch_cuda_version", lambda: None)
    output = human("preflight", "nvidia_h200", code=1)
    assert "torch cuda build" in output and "not ready" in output


# ---- 16: the last step of onboarding exists


def test_onboarding_hints_and_readme_run_a_script_that_exists(tmp_path):
    from torch_fl.onboarding.layout import Layout

    steps = next_steps("acme_x1", Layout(name="acme_x1", root=tmp_path, platforms_dir=tmp_path / "plats"))
    script = next(word for word in shlex.split(steps[-1]) if word.endswith(".py"))
    assert (REPO / script).is_file(), steps[-1]
    for doc in ("README.md", "docs/onboarding.md", "onboarding/templates/README.md.j2"):
        assert "python train.py" not in (REPO / doc).read_text(), doc


# ---- 17: the first-import build


def test_build_message_states_a_realistic_time(tmp_path, monkeypatch, capsys):
    from torch_fl.runtime import build

    monkeypatch.setenv("FLAGOS_BUILD_DIR", str(tmp_path))
    monkeypatch.setattr(build, "build_library", lambda directory, files: None)
    monkeypatch.setattr(build, "_import_library", lambda path: "built")
    assert build.load_core() == "built"
    message = capsys.readouterr().err
    assert "building the flagos core" in message and "about 3 minutes on 2 CPU cores" in message
    assert "about a minute" not in message


def test_a_second_process_says_it_waits_for_the_build(tmp_path, monkeypatch, capsys):
    from torch_fl.runtime import build

    monkeypatch.setenv("FLAGOS_BUILD_DIR", str(tmp_path))
    directory = build.build_dir()
    directory.mkdir(parents=True)
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time; from filelock import FileLock; lock = FileLock(sys.argv[1]); "
            "lock.acquire(); print('held', flush=True); time.sleep(3); open(sys.argv[2], 'w').close()",
            str(directory / "build.lock"),
            str(directory / f"{build.MODULE_NAME}.so"),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert holder.stdout.readline().strip() == "held"
    monkeypatch.setattr(build, "build_library", lambda directory, files: pytest.fail("the waiting process built too"))
    monkeypatch.setattr(build, "_import_library", lambda path: f"loaded {path.name}")
    assert build.load_core() == f"loaded {build.MODULE_NAME}.so"
    holder.wait(timeout=30)
    message = capsys.readouterr().err
    assert "another process is building the flagos core" in message and "waiting for it" in message
    assert "torch_fl: building" not in message


def test_a_build_killed_midway_does_not_block_the_next_one(tmp_path, monkeypatch):
    # torch's own build leaves a `lock` file behind when killed; waiting on it would hang forever.
    from torch_fl.runtime import build

    monkeypatch.setenv("FLAGOS_BUILD_DIR", str(tmp_path))
    directory = build.build_dir()
    directory.mkdir(parents=True)
    (directory / "lock").touch()

    def build_library(directory, files):
        assert not (directory / "lock").exists()

    monkeypatch.setattr(build, "build_library", build_library)
    monkeypatch.setattr(build, "_import_library", lambda path: "built")
    assert build.load_core() == "built"


# ---- every other command's human output


def test_platforms_preflight_env_schema_and_skills_human_output(tmp_path):
    assert "active: host_ref" in human("platforms", "list")
    assert "kernel sets" in human("platforms", "show", "host_ref")
    assert "ready" in human("preflight", "host_ref")
    assert "host_ref" in human("preflight", "--matrix")
    assert "FLAGOS_PLATFORM" in human("env")
    assert '"$schema"' in human("schema")
    assert "onboard-new-chip" in human("skills", "list")
    assert "torch-fl onboard" in human("skills", "show", "onboard-new-chip")
    assert "SKILL.md" in human("skills", "install", str(tmp_path / "skills"))


def test_routes_show_and_explain_human_output():
    pytest.importorskip("torch")
    import torch_fl

    if not torch_fl.is_active() or torch_fl.active_platform().name != "host_ref":
        pytest.skip("routes explain activates host_ref in this process")
    assert "candidates" in human("routes", "show", "host_ref")
    assert "aten::mm" in human("routes", "explain", "host_ref", "aten::mm")


def test_onboard_and_kernel_add_human_output(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("FLAGOS_PLATFORM_PATH", str(tmp_path / "plats"))
    output = human("onboard", "--chip", "acme_x1", "--root", str(tmp_path), "--platforms-dir", str(tmp_path / "plats"))
    assert "platform.yaml" in output and "next steps:" in output and "examples/train_demo.py" in output
    assert "aten::silu" in human("kernel", "add", "acme_x1", "--op", "aten::silu")


def _torch_fl(*args: str, cwd: Path, timeout: float = 600) -> str:
    """The human output of `torch-fl ARGS` run as a command (these commands start worker processes)."""
    command = [str(Path(sys.executable).with_name("torch-fl")), *args]
    result = subprocess.run(
        command,
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**__import__("os").environ, "COLUMNS": "200"},
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return result.stdout


@pytest.mark.slow
def test_routes_tune_dry_run_human_output(tmp_path):
    output = _torch_fl("routes", "tune", "host_ref", "--dry-run", "--steps", "1", cwd=tmp_path)
    assert "not written" in output and "ms/step" in output


@pytest.mark.slow
def test_routes_tune_check_zoo_names_what_it_takes(tmp_path):
    command = [str(Path(sys.executable).with_name("torch-fl")), "routes", "tune", "host_ref", "--dry-run"]
    bad = subprocess.run(
        [*command, "--check-zoo", "gpt2,nosuch", "--json"], cwd=tmp_path, capture_output=True, text=True
    )
    assert bad.returncode == 2
    assert "unknown architecture(s) ['nosuch']" in bad.stdout and "'llama'" in bad.stdout
    output = _torch_fl("routes", "tune", "host_ref", "--dry-run", "--steps", "1", "--check-zoo", "gpt2", cwd=tmp_path)
    assert "not written" in output


@pytest.mark.slow
def test_conformance_run_human_output(tmp_path):
    output = _torch_fl(
        "conformance",
        "run",
        "host_ref",
        "--suite",
        "ops",
        "-k",
        "abs and float32",
        "--paths",
        "native",
        "-n",
        "1",
        "--record-dir",
        str(tmp_path / "records"),
        cwd=tmp_path,
    )
    assert "suite ops" in output and "pass rate" in output
    assert f"record: {tmp_path / 'records'}" in output
