"""A file a person edited is never overwritten without --force; it is reported and the exit code says so."""

from __future__ import annotations

from onboard_helpers import cli, make

ARGS = ("onboard", "--chip", "demo_chip", "--platforms-dir", "plats")


def test_edited_file_is_kept_and_reported(repo):
    cli(*ARGS)
    readme = repo / "plats/demo_chip/README.md"
    readme.write_text(readme.read_text() + "\nOur notes.\n")
    edited = readme.read_bytes()
    data = cli(*ARGS, code=3)
    assert data["ok"] is False
    entry = next(f for f in data["files"] if f["path"].endswith("README.md"))
    assert entry["action"] == "skipped-edited" and "--force" in entry["reason"]
    assert {f["action"] for f in data["files"] if f is not entry} == {"unchanged"}
    assert readme.read_bytes() == edited
    # still recognised as edited on the next run (the manifest keeps the hash onboard wrote)
    assert cli(*ARGS, code=3)["ok"] is False
    assert readme.read_bytes() == edited


def test_force_overwrites_the_edit(repo):
    cli(*ARGS)
    routes = repo / "plats/demo_chip/routes.yaml"
    original = routes.read_bytes()
    routes.write_text("# mine\n" + routes.read_text())
    data = cli(*ARGS, "--force")
    entry = next(f for f in data["files"] if f["path"].endswith("routes.yaml"))
    assert data["ok"] and entry["action"] == "updated"
    assert routes.read_bytes() == original
    assert {f["action"] for f in cli(*ARGS)["files"]} == {"unchanged"}


def test_a_file_onboard_never_wrote_is_not_taken_over(repo):
    workflow = repo / ".github/workflows/flagos-demo_chip.yml"
    workflow.parent.mkdir(parents=True)
    workflow.write_text("name: ours\n")
    report = make(repo)
    entry = next(f for f in report.files if f.path == workflow)
    assert entry.action == "skipped-edited" and "not written by onboard" in entry.reason
    assert workflow.read_text() == "name: ours\n"
    assert not report.ok


def test_unedited_generated_file_is_updated_after_a_change_of_options(repo):
    make(repo)
    vendor = repo / "plats/demo_chip/vendor_kernels.py"
    vendor.write_text(vendor.read_text() + "\n# our kernel\n")
    report = make(repo, backing="cuda")
    actions = {f.path.name: f.action for f in report.files}
    assert actions["vendor_kernels.py"] == "skipped-edited"
    assert actions["platform.yaml"] == "updated"
    assert vendor.read_text().endswith("# our kernel\n")
