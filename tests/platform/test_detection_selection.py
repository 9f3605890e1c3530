"""Detection rules and platform selection (FLAGOS_PLATFORM forces; otherwise highest priority match)."""

from __future__ import annotations

import sys
import types

import pytest

from torch_fl.platform import DescriptorError, SelectionError, detect, evaluate_rule, select_platform
from torch_fl.platform.descriptor import PlatformDescriptor
from torch_fl.platform.discovery import discover, load_all, shipped_root
from torch_fl.platform.loader import load_descriptor

HOST = load_descriptor(shipped_root() / "host_ref")


def platform(name: str, priority: int, rules: list[dict]) -> PlatformDescriptor:
    data = HOST.model_dump(mode="json")
    data.update(name=name, detect={"priority": priority, "rules": rules})
    return PlatformDescriptor.model_validate(data)


def rule(**kind):
    return platform("x", 1, [kind]).detect.rules[0]


@pytest.fixture
def fake_torch(monkeypatch):
    """A stand-in torch in sys.modules, so cuda_device_name rules run without a GPU or real torch."""
    fake = types.SimpleNamespace(
        cuda=types.SimpleNamespace(
            is_available=lambda: True, device_count=lambda: 2, get_device_name=lambda i: "NVIDIA H200"
        )
    )
    monkeypatch.setitem(sys.modules, "torch", fake)
    return fake


def test_env_rule(monkeypatch):
    monkeypatch.delenv("FLAGOS_TEST_CHIP", raising=False)
    assert evaluate_rule(rule(env="FLAGOS_TEST_CHIP")).matched is False
    monkeypatch.setenv("FLAGOS_TEST_CHIP", "1")
    assert evaluate_rule(rule(env="FLAGOS_TEST_CHIP")).matched is True


def test_python_module_rule_does_not_import(monkeypatch):
    assert evaluate_rule(rule(python_module="json")).matched is True
    assert evaluate_rule(rule(python_module="no_such_module_xyz")).matched is False
    assert evaluate_rule(rule(python_module="no_such_pkg_xyz.sub")).matched is False


def test_path_exists_rule(tmp_path):
    assert evaluate_rule(rule(path_exists=str(tmp_path))).matched is True
    assert evaluate_rule(rule(path_exists=str(tmp_path / "dev0"))).matched is False


def test_cuda_rule_is_skipped_without_torch_imported(monkeypatch):
    monkeypatch.delitem(sys.modules, "torch", raising=False)
    result = evaluate_rule(rule(cuda_device_name="H200"))
    assert result.matched is None and result.reason == "skipped: torch is not imported"


def test_cuda_rule_with_torch_imported(fake_torch):
    assert evaluate_rule(rule(cuda_device_name="H200")).matched is True
    miss = evaluate_rule(rule(cuda_device_name="A100|H800"))
    assert miss.matched is False and "NVIDIA H200" in miss.reason
    fake_torch.cuda.is_available = lambda: False
    assert evaluate_rule(rule(cuda_device_name="H200")).reason == "CUDA is not available"


def test_highest_priority_match_wins(monkeypatch, tmp_path):
    monkeypatch.delenv("FLAGOS_PLATFORM", raising=False)
    descriptors = {
        "low": platform("low", 0, [{"always": True}]),
        "mid": platform("mid", 5, [{"path_exists": str(tmp_path)}]),
        "high": platform("high", 9, [{"path_exists": str(tmp_path / "absent")}]),
    }
    assert [d.name for d in detect(descriptors)] == ["high", "mid", "low"]
    chosen = select_platform(descriptors)
    assert (chosen.name, chosen.forced) == ("mid", False)
    assert "priority 5" in chosen.reason and "exists" in chosen.reason


def test_selection_says_which_rules_were_skipped(monkeypatch):
    monkeypatch.delenv("FLAGOS_PLATFORM", raising=False)
    monkeypatch.delitem(sys.modules, "torch", raising=False)
    descriptors = {
        "host": platform("host", 0, [{"always": True}]),
        "gpu": platform("gpu", 9, [{"cuda_device_name": "H200"}]),
    }
    chosen = select_platform(descriptors)
    assert chosen.name == "host"
    assert "rules of gpu skipped: torch is not imported" in chosen.reason


def test_cuda_device_name_selects_the_h200_when_torch_is_imported(monkeypatch, fake_torch):
    monkeypatch.delenv("FLAGOS_PLATFORM", raising=False)
    loaded, _ = load_all(discover(path_env=""))
    assert select_platform(loaded).name == "nvidia_h200"


def test_shipped_platforms_select_host_ref_on_a_plain_machine(monkeypatch):
    monkeypatch.delenv("FLAGOS_PLATFORM", raising=False)
    monkeypatch.delenv("FLAGOS_PLATFORM_PATH", raising=False)
    monkeypatch.delitem(sys.modules, "torch", raising=False)
    assert select_platform().name == "host_ref"


def test_flagos_platform_forces(monkeypatch):
    monkeypatch.setenv("FLAGOS_PLATFORM", "nvidia_a100")
    chosen = select_platform()
    assert (chosen.name, chosen.forced) == ("nvidia_a100", True)
    assert "FLAGOS_PLATFORM=nvidia_a100" in chosen.reason


def test_unknown_forced_name_lists_known_ones(monkeypatch):
    monkeypatch.setenv("FLAGOS_PLATFORM", "nvidia_b300")
    with pytest.raises(SelectionError, match="unknown platform; known platforms: .*host_ref.*nvidia_h200"):
        select_platform()


def test_forcing_a_broken_platform_raises_its_error(monkeypatch, tmp_path):
    folder = tmp_path / "broken_chip"
    folder.mkdir()
    (folder / "platform.yaml").write_text("schema_version: 1\nname: broken_chip\n")
    monkeypatch.setenv("FLAGOS_PLATFORM_PATH", str(tmp_path))
    monkeypatch.setenv("FLAGOS_PLATFORM", "broken_chip")
    with pytest.raises(DescriptorError):
        select_platform()


def test_no_match_is_an_error(monkeypatch, tmp_path):
    monkeypatch.delenv("FLAGOS_PLATFORM", raising=False)
    with pytest.raises(SelectionError, match="set FLAGOS_PLATFORM"):
        select_platform({"a": platform("a", 1, [{"path_exists": str(tmp_path / "none")}])})


def test_ties_are_broken_by_name_and_said(monkeypatch):
    monkeypatch.delenv("FLAGOS_PLATFORM", raising=False)
    both = {"b": platform("b", 3, [{"always": True}]), "a": platform("a", 3, [{"always": True}])}
    chosen = select_platform(both)
    assert chosen.name == "a" and "tied with b" in chosen.reason
