"""Re-running onboard changes nothing: same bytes, every file reported unchanged."""

from __future__ import annotations

from onboard_helpers import cli, make, snapshot


def test_second_run_is_byte_identical(repo):
    first = cli("onboard", "--chip", "demo_chip", "--platforms-dir", "plats")
    assert first["ok"] and {f["action"] for f in first["files"]} == {"created"}
    before = snapshot(repo)
    second = cli("onboard", "--chip", "demo_chip", "--platforms-dir", "plats")
    assert second["ok"] and {f["action"] for f in second["files"]} == {"unchanged"}
    assert snapshot(repo) == before


def test_json_report_shape(repo):
    data = cli("onboard", "--chip", "demo_chip", "--platforms-dir", "plats")
    assert set(data) >= {"ok", "platform", "files", "next_steps"}
    assert data["platform"] == "demo_chip"
    paths = [f["path"] for f in data["files"]]
    assert paths == [
        "plats/demo_chip/platform.yaml",
        "plats/demo_chip/vendor_kernels.py",
        "plats/demo_chip/routes.yaml",
        "plats/demo_chip/README.md",
        ".github/workflows/flagos-demo_chip.yml",
        "plats/demo_chip/.onboard.json",
    ]
    # plats is on FLAGOS_PLATFORM_PATH here, so the next steps are plain commands
    assert "torch-fl conformance run demo_chip --json" in data["next_steps"]


def test_rerun_repeats_the_recorded_options(repo):
    make(repo, "gpu_chip", like="nvidia_h200")
    before = snapshot(repo)
    again = make(repo, "gpu_chip")  # no --like: the manifest remembers it
    assert {f.action for f in again.files} == {"unchanged"}
    assert snapshot(repo) == before


def test_changed_options_update_unedited_files(repo):
    make(repo)
    report = make(repo, backing="cuda")
    actions = {f.path.name: f.action for f in report.files}
    assert actions["platform.yaml"] == "updated" and actions["flagos-demo_chip.yml"] == "updated"
    assert report.ok
    assert "device: cuda" in (repo / "plats/demo_chip/platform.yaml").read_text()


def test_checkout_layout_needs_no_platform_path(tmp_path, monkeypatch):
    """In a torch-fl checkout the platform ships: no FLAGOS_PLATFORM_PATH in CI or next steps."""
    root = tmp_path / "checkout"
    root.mkdir()
    (root / "pyproject.toml").write_text('[project]\nname = "torch-fl"\n')
    monkeypatch.chdir(root)
    data = cli("onboard", "--chip", "demo_chip")
    assert (root / "platforms/demo_chip/platform.yaml").is_file()
    workflow = (root / ".github/workflows/flagos-demo_chip.yml").read_text()
    assert "FLAGOS_PLATFORM_PATH" not in workflow and "pip install -e ." in workflow
    assert all("FLAGOS_PLATFORM_PATH" not in step for step in data["next_steps"])


def test_a_new_like_brings_its_own_backing(repo, monkeypatch):
    monkeypatch.setattr("torch_fl.onboarding.descriptor.torch_cuda_version", lambda: "12.8")  # a CUDA machine
    make(repo, "gpu_chip", like="host_ref")
    report = make(repo, "gpu_chip", like="nvidia_h200")  # no --backing: the first run's cpu is not kept
    assert report.ok and "device: cuda" in (repo / "plats/gpu_chip/platform.yaml").read_text()
    assert not report.warnings


def test_a_backing_unlike_the_like_platforms_is_warned_about(repo):
    report = make(repo, "gpu_chip", like="host_ref", backing="cuda", dry_run=True)
    assert any("differs from --like host_ref's backing 'cpu'" in w and "gloo" in w for w in report.warnings)


def test_a_cuda_backing_on_a_machine_without_cuda_is_warned_about(repo, monkeypatch):
    """The skill's `--backing cuda` on a CPU-only machine: the dry run says so before anything is written."""
    monkeypatch.setattr("torch_fl.onboarding.descriptor.torch_cuda_version", lambda: None)
    report = make(repo, "gpu_chip", like="nvidia_h200", backing="cuda", dry_run=True)
    assert report.ok and any("CPU-only build" in w and "--backing cpu" in w for w in report.warnings)
    monkeypatch.setattr("torch_fl.onboarding.descriptor.torch_cuda_version", lambda: "12.8")
    assert not make(repo, "gpu_chip", like="nvidia_h200", backing="cuda", dry_run=True).warnings
