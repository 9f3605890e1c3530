"""Bad names and options get a clear error, and nothing at all is written."""

from __future__ import annotations

import pytest
from onboard_helpers import cli, make, snapshot

from torch_fl.onboarding.errors import OnboardError
from torch_fl.onboarding.names import RESERVED, check_name


@pytest.mark.parametrize(
    ("name", "words"),
    [
        ("", "empty"),
        ("a/b", "is a path"),
        ("../x", "is a path"),
        ("..", "is a path"),
        ("a\\b", "is a path"),
        ("Acme", "upper-case"),
        ("acme-x1", "not a valid platform name"),
        ("1chip", "not a valid platform name"),
        ("chip x", "not a valid platform name"),
        ("cpu", "reserved"),
        ("cuda", "reserved"),
        ("native", "reserved"),
        ("flagos", "reserved"),
        ("a" * 49, "longer than"),
    ],
)
def test_bad_names_write_nothing(repo, name, words):
    before = snapshot(repo)
    data = cli("onboard", "--chip", name, "--platforms-dir", "plats", code=1)
    assert data["ok"] is False and words in data["error"]
    assert snapshot(repo) == before


def test_every_kernel_set_name_is_reserved():
    assert {"native", "flaggems", "vendor", "emulated", "cpu"} <= RESERVED


def test_good_name():
    assert check_name("acme_x1") == "acme_x1"


def test_existing_platform_needs_force(repo):
    before = snapshot(repo)
    data = cli("onboard", "--chip", "host_ref", "--platforms-dir", "plats", code=1)
    assert "already exists" in data["error"] and "--force" in data["error"]
    assert snapshot(repo) == before
    forced = cli("onboard", "--chip", "host_ref", "--platforms-dir", "plats", "--force")
    assert forced["ok"] and (repo / "plats/host_ref/platform.yaml").is_file()


def test_folder_with_a_foreign_platform_yaml_needs_force(repo):
    (repo / "plats/mine").mkdir()
    (repo / "plats/mine/platform.yaml").write_text("# someone's\n")
    with pytest.raises(OnboardError, match="did not write"):
        make(repo, "mine")
    assert (repo / "plats/mine/platform.yaml").read_text() == "# someone's\n"


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (("--like", "no_such_platform"), "unknown platform"),
        (("--like", "demo_chip"), "cannot start from itself"),
    ],
)
def test_bad_like_writes_nothing(repo, args, words):
    before = snapshot(repo)
    data = cli("onboard", "--chip", "demo_chip", "--platforms-dir", "plats", *args, code=1)
    assert words in data["error"]
    assert snapshot(repo) == before


def test_bad_backing_is_a_usage_error(repo):
    from onboard_helpers import runner

    from torch_fl.cli import app

    result = runner.invoke(app, ["onboard", "--chip", "demo_chip", "--backing", "tpu"])
    assert result.exit_code == 2 and not (repo / "platforms").exists()


def test_platforms_dir_that_is_a_file(repo):
    (repo / "plats/demo_chip").write_text("not a folder")
    with pytest.raises(OnboardError, match="not a folder"):
        make(repo)


def test_a_near_miss_of_an_existing_name_does_not_offer_that_name(repo):
    data = cli("onboard", "--chip", "Host_Ref", "--platforms-dir", "plats", code=1)
    assert "upper-case" in data["error"] and "host_ref already exists" in data["error"], data["error"]
    assert "e.g. 'host_ref'" not in data["error"]
