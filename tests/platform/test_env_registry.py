"""The environment-variable registry: every variable read is declared, documented and listed."""

from __future__ import annotations

import pytest

from torch_fl import env


def test_platform_variables_are_declared():
    table = env.table_markdown()
    for name in ("FLAGOS_PLATFORM", "FLAGOS_PLATFORM_PATH", "FLAGOS_ALLOW_UNVALIDATED"):
        assert f"| `{name}` |" in table


def test_get_and_flag(monkeypatch):
    monkeypatch.delenv("FLAGOS_ALLOW_UNVALIDATED", raising=False)
    assert env.get("FLAGOS_ALLOW_UNVALIDATED") == "0" and env.flag("FLAGOS_ALLOW_UNVALIDATED") is False
    for value in ("1", "true", "YES", "on"):
        monkeypatch.setenv("FLAGOS_ALLOW_UNVALIDATED", value)
        assert env.flag("FLAGOS_ALLOW_UNVALIDATED") is True
    monkeypatch.setenv("FLAGOS_PLATFORM", "")
    assert env.get("FLAGOS_PLATFORM") is None


def test_undeclared_variable_is_an_error():
    with pytest.raises(KeyError, match="not declared"):
        env.get("FLAGOS_SOMETHING_UNDECLARED")


def test_register_is_idempotent_but_not_contradictory():
    var = env.register("FLAGOS_TEST_ONLY_VAR", None, "Used by the registry test.")
    assert env.register("FLAGOS_TEST_ONLY_VAR", None, "Used by the registry test.") == var
    with pytest.raises(ValueError, match="already declared"):
        env.register("FLAGOS_TEST_ONLY_VAR", "1", "Something else.")


def test_table_is_sorted_markdown():
    lines = env.table_markdown().splitlines()
    assert lines[0] == "| variable | default | what it does |"
    names = [line.split("`")[1] for line in lines[2:]]
    assert names == sorted(names)
