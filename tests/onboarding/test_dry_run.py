"""--dry-run reports what would happen and writes nothing."""

from __future__ import annotations

from onboard_helpers import cli, snapshot

ARGS = ("onboard", "--chip", "demo_chip", "--platforms-dir", "plats")


def test_dry_run_on_nothing(repo):
    before = snapshot(repo)
    data = cli(*ARGS, "--dry-run")
    assert data["ok"] and data["dry_run"] is True
    assert {f["action"] for f in data["files"]} == {"created"}
    assert snapshot(repo) == before and not (repo / "plats/demo_chip").exists()


def test_dry_run_reports_updates_and_edits_without_writing(repo):
    cli(*ARGS)
    readme = repo / "plats/demo_chip/README.md"
    readme.write_text("edited\n")
    before = snapshot(repo)
    data = cli(*ARGS, "--backing", "cuda", "--dry-run", code=3)
    actions = {f["path"].rsplit("/", 1)[-1]: f["action"] for f in data["files"]}
    assert actions["platform.yaml"] == "updated" and actions["README.md"] == "skipped-edited"
    assert actions[".onboard.json"] == "updated"
    assert snapshot(repo) == before


def test_dry_run_human_output(repo):
    from onboard_helpers import runner

    from torch_fl.cli import app

    result = runner.invoke(app, [*ARGS, "--dry-run"])
    assert result.exit_code == 0 and "would write" in result.stdout and "created" in result.stdout
    assert not (repo / "plats/demo_chip").exists()
