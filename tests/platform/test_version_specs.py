"""Version specifiers as descriptors and the preflight use them."""

from __future__ import annotations

import re

import pytest

from torch_fl.platform.versions import SPEC_PATTERN, minor_line, release, satisfies


@pytest.mark.parametrize(
    "version, spec, expected",
    [
        ("2.13.0+cpu", ">=2.11", True),
        ("2.11.0+cu130", ">=2.11,<2.12", True),
        ("2.10.1", ">=2.11", False),
        ("5.0.2", "==5.0.2", True),
        ("5.0.3", "==5.0.2", False),
        ("5.0", "==5.0.0", True),
        ("3.12.4", "==3.12.*", True),
        ("3.13.0", "==3.12.*", False),
        ("3.11.2", "!=3.11.*", False),
        ("2.13.0a0+git1234", ">=2.13", True),
        ("1.4.5", "~=1.4.2", True),
        ("1.5.0", "~=1.4.2", False),
        ("2.0", "~=2.0", True),
        ("3.0", "~=2.0", False),
        ("1.0", "", True),
        ("1.0", ">1.0", False),
        ("1.0", "<=1.0", True),
    ],
)
def test_satisfies(version, spec, expected):
    assert satisfies(version, spec) is expected


def test_release_and_minor_line():
    assert release("2.13.0+cpu") == (2, 13, 0)
    assert minor_line("2.11.0+cu130") == "2.11"
    assert minor_line("3") == "3.0"
    with pytest.raises(ValueError):
        release("latest")


@pytest.mark.parametrize("spec", [">=2.11", "==5.0.2", ">=3.10,<3.13", "==2.11.*", "~=1.4"])
def test_spec_pattern_accepts(spec):
    assert re.match(SPEC_PATTERN, spec)


@pytest.mark.parametrize("spec", ["2.11", ">=", ">=two", "=>2.11", ">=2.11,"])
def test_spec_pattern_rejects(spec):
    assert not re.match(SPEC_PATTERN, spec)


def test_bad_clause_raises():
    with pytest.raises(ValueError):
        satisfies("1.0", "=>1.0")
    with pytest.raises(ValueError):
        satisfies("1.0", ">=1.*")
