"""Bad input never hangs torch-fl nor takes the runtime down, and every error names its file once.

A YAML alias bomb fails fast, a non-UTF-8 descriptor is an error naming the file and line, one
platform's broken files leave the others (and its own native/cpu routes) working, every FLAGOS_*
routing variable and routes.yaml entry is checked at activation, and a platform that cannot start
says why once, then again (naming the cause) on `device="flagos"`.
"""

from __future__ import annotations

import os
import resource
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

import torch_fl.cli.platforms  # noqa: F401  (registers the commands)
from torch_fl.cli import app
from torch_fl.platform import DescriptorError, load_descriptor
from torch_fl.platform.discovery import PlatformSource, load_all, shipped_root
from torch_fl.platform.errors import SelectionError
from torch_fl.platform.selection import select_platform
from torch_fl.routing.table import RouteTableError, parse

HOST_REF = shipped_root() / "host_ref"
_LETTERS = "abcdefghijk"
BOMB = (
    "a: &a ["
    + ", ".join(['"lol"'] * 9)
    + "]\n"
    + "".join(f"{cur}: &{cur} [" + ", ".join([f"*{prev}"] * 9) + "]\n" for prev, cur in zip(_LETTERS, _LETTERS[1:]))
)


@pytest.fixture(autouse=True)
def plain_machine(monkeypatch):
    for var in (
        "FLAGOS_PLATFORM",
        "FLAGOS_PLATFORM_PATH",
        "FLAGOS_ALLOW_UNVALIDATED",
        "FLAGOS_STRICT",
        "FLAGOS_ROUTES",
        "FLAGOS_ROUTE_DEFAULTS",
    ):
        monkeypatch.delenv(var, raising=False)
    for var in [v for v in os.environ if v.startswith("FLAGOS_ROUTE_")]:
        monkeypatch.delenv(var)


def _limit_memory() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (3 << 30, 3 << 30))


@pytest.fixture
def run_bounded(run_python):
    """run_bounded(code, env, timeout=240, limit_memory=True): `code` in a fresh interpreter with no
    FLAGOS_ variable but those of `env` and at most 3 GiB of address space (CUDA reserves more: pass
    limit_memory=False there); a hang fails the test. The process is returned, whatever its exit."""

    def run(
        code: str, env: dict[str, str | None], timeout: float = 240, limit_memory: bool = True
    ) -> subprocess.CompletedProcess:
        cleared: dict[str, str | None] = {k: None for k in os.environ if k.startswith("FLAGOS_")}
        return run_python(
            code,
            {**cleared, **env},
            check=False,
            timeout=timeout,
            preexec_fn=_limit_memory if limit_memory else None,
        )

    return run


def platform_copy(root: Path, name: str = "host_ref") -> Path:
    folder = root / name
    shutil.copytree(HOST_REF, folder)
    if name != "host_ref":
        path = folder / "platform.yaml"
        path.write_text(path.read_text().replace("name: host_ref", f"name: {name}"))
    return folder


def bomb_platform(root: Path) -> Path:
    folder = root / "bomb_chip"
    folder.mkdir(parents=True)
    (folder / "platform.yaml").write_text("schema_version: 1\n" + BOMB)
    return folder


# ---- 9: alias bombs


def test_alias_bomb_in_a_descriptor_fails_fast_naming_file_and_line(tmp_path, run_bounded):
    bomb_platform(tmp_path)
    code = """
        from torch_fl.platform.discovery import load_all
        loaded, broken = load_all()
        print(broken["bomb_chip"])
        from torch_fl.routing.table import parse, RouteTableError
        try:
            parse(open("%s").read(), "routes.yaml")
        except RouteTableError as exc:
            print(exc)
    """ % (tmp_path / "bomb_chip" / "platform.yaml")
    result = run_bounded(code, {"FLAGOS_PLATFORM_PATH": str(tmp_path)}, timeout=60)
    assert result.returncode == 0, result.stderr[-2000:]
    lines = result.stdout.splitlines()
    assert len(lines) == 2 and len(result.stdout) < 1000, result.stdout[:2000]
    assert "platform.yaml:2:" in lines[0] and "alias" in lines[0]
    assert lines[1].startswith("routes.yaml:2:") and "alias" in lines[1]


def test_an_anchor_alone_is_refused_too(tmp_path):
    text = "format: 1\nops:\n  aten::mm: &same {candidates: [native]}\n"
    with pytest.raises(RouteTableError, match=r"routes.yaml:3: .*anchors and aliases"):
        parse(text, "routes.yaml")


def test_error_messages_cap_long_values(tmp_path, monkeypatch):
    huge = "x" * 100_000
    with pytest.raises(RouteTableError) as info:
        parse(f"ops:\n  aten::mm: {{candidates: [{huge}]}}\n", "routes.yaml")
    assert len(str(info.value)) < 400
    with pytest.raises(RouteTableError) as info:
        parse(f"ops:\n  {huge[:1000]}: {{candidates: [native]}}\n", "routes.yaml")  # YAML keys: 1024 at most
    assert "expected a qualified op name" in str(info.value) and len(str(info.value)) < 400
    monkeypatch.setenv("FLAGOS_PLATFORM", huge)
    with pytest.raises(SelectionError) as selection:
        select_platform()
    assert len(str(selection.value).split(";")[0]) < 200


def test_route_table_errors_name_their_line_in_a_persons_words():
    text = "format: 1\nops:\n  aten::mm:\n    candidates: [native]\n    buckets:\n      - {max_numel: lots, choice: native}\n"
    with pytest.raises(RouteTableError) as info:
        parse(text, "routes.yaml")
    message = str(info.value)
    assert message.startswith('routes.yaml:6: ops["aten::mm"].buckets[0].max_numel: expected an integer'), message
    assert "input should be" not in message.lower() and "pydantic" not in message


# ---- 10: encodings and one platform's broken files


def test_non_utf8_descriptor_is_an_error_naming_file_and_line(tmp_path):
    folder = tmp_path / "latin_chip"
    folder.mkdir()
    (folder / "platform.yaml").write_bytes(b"schema_version: 1\nname: latin_chip\ndisplay_name: caf\xe9\n")
    with pytest.raises(DescriptorError) as info:
        load_descriptor(folder)
    assert str(info.value).endswith("platform.yaml:3: not UTF-8 text (byte 0xe9); save the file as UTF-8")
    _, broken = load_all({"latin_chip": PlatformSource("latin_chip", folder, "path")})
    assert "latin_chip" in broken


ACTIVATES = """
    import warnings
    warnings.simplefilter("always")
    import torch, torch_fl
    x = torch.ones(2, device="flagos") + 1
    print("active", torch_fl.active_platform().name, x.device.type, torch_fl.explain("aten::mm").platform)
"""


def test_broken_platforms_on_the_path_do_not_stop_another(tmp_path, run_bounded):
    bomb_platform(tmp_path)
    latin = tmp_path / "latin_chip"
    latin.mkdir()
    (latin / "platform.yaml").write_bytes(b"schema_version: 1\nname: caf\xe9\n")
    broken = tmp_path / "schema_chip"
    broken.mkdir()
    (broken / "platform.yaml").write_text("schema_version: 1\nname: schema_chip\n")
    result = run_bounded(ACTIVATES, {"FLAGOS_PLATFORM_PATH": str(tmp_path)})
    assert result.returncode == 0, result.stderr[-3000:]
    assert "active host_ref flagos host_ref" in result.stdout
    for name, line in (("bomb_chip", 2), ("latin_chip", 2), ("schema_chip", 1)):
        assert result.stderr.count(f"platform {name} skipped: ") == 1, result.stderr[-3000:]
        assert f"{name}{os.sep}platform.yaml:{line}: " in result.stderr


def test_broken_route_table_leaves_native_and_cpu_routes(tmp_path, run_bounded):
    folder = platform_copy(tmp_path)
    (folder / "routes.yaml").write_text(
        "format: 1\nops:\n  aten::mm:\n    candidates: [native]\n    buckets:\n"
        "      - {max_numel: lots, choice: native}\n"
    )
    result = run_bounded(ACTIVATES, {"FLAGOS_PLATFORM_PATH": str(tmp_path)})
    assert result.returncode == 0, result.stderr[-3000:]
    assert "active host_ref flagos host_ref" in result.stdout
    assert result.stderr.count("routes.yaml:6:") == 1, result.stderr[-3000:]
    assert "input should be" not in result.stderr.lower()


# ---- 11: every routing variable and routes.yaml entry is checked


def _problems(descriptor=None) -> list[str]:
    from torch_fl.routing.checks import check_routing

    descriptor = descriptor or load_descriptor(HOST_REF)
    return [str(p) for p in check_routing(descriptor).problems]


def test_routing_variables_are_checked(monkeypatch, tmp_path):
    assert _problems() == []
    monkeypatch.setenv("FLAGOS_ROUTE_mm", "garbage")
    monkeypatch.setenv("FLAGOS_ROUTE_nosuchop", "native")
    monkeypatch.setenv("FLAGOS_ROUTE_relu", "vendor,native")
    monkeypatch.setenv("FLAGOS_ROUTE_DEFAULTS", "garbage")
    monkeypatch.setenv("FLAGOS_ROUTES", str(tmp_path / "nonexistent.yaml"))
    problems = _problems()
    assert "FLAGOS_ROUTE_mm: unknown path 'garbage'; expected native, flaggems, vendor, emulated or cpu" in problems
    assert any(p.startswith("FLAGOS_ROUTE_nosuchop: unknown op 'aten::nosuchop'") for p in problems), problems
    assert any(p.startswith("FLAGOS_ROUTE_relu: 'vendor': host_ref declares no vendor kernels") for p in problems)
    assert (
        "FLAGOS_ROUTE_DEFAULTS: unknown path 'garbage'; expected native, flaggems, vendor, emulated or cpu" in problems
    )
    assert any(p.startswith(f"FLAGOS_ROUTES: {tmp_path / 'nonexistent.yaml'}: no such file") for p in problems)
    assert len(problems) == 5


def test_route_table_entries_are_checked_with_their_line(tmp_path):
    folder = platform_copy(tmp_path)
    (folder / "routes.yaml").write_text(
        "format: 1\nops:\n  aten::mm:\n    candidates: [native]\n  aten::nosuchop:\n    candidates: [native]\n"
        "  aten::relu:\n    candidates: [vendor, native]\n"
    )
    problems = _problems(load_descriptor(folder))
    where = str(folder / "routes.yaml")
    assert problems == [
        f"{where}:5: ops[\"aten::nosuchop\"]: unknown op 'aten::nosuchop': this torch has no such operator or overload",
        f"{where}:8: ops[\"aten::relu\"].candidates[0]: 'vendor': host_ref declares no vendor kernels "
        "(kernels.vendor in platform.yaml)",
    ]


def test_strict_makes_routing_problems_errors(monkeypatch):
    from torch_fl.routing.checks import RoutingError, check_routing

    monkeypatch.setenv("FLAGOS_ROUTE_mm", "garbage")
    monkeypatch.setenv("FLAGOS_STRICT", "1")
    with pytest.raises(RoutingError, match="FLAGOS_ROUTE_mm: unknown path 'garbage'"):
        check_routing(load_descriptor(HOST_REF)).enforce(strict=True)


FAILS_CLEARLY = """
    import warnings
    warnings.simplefilter("always")
    import torch, torch_fl
    print("active", torch_fl.is_active())
    try:
        torch.randn(1, device="flagos")
    except RuntimeError as exc:
        print("device error:", exc)
"""


def test_strict_routing_error_leaves_nothing_half_active(run_bounded):
    result = run_bounded(FAILS_CLEARLY, {"FLAGOS_ROUTE_mm": "garbage", "FLAGOS_STRICT": "1"})
    assert result.returncode == 0, result.stderr[-3000:]
    assert "active False" in result.stdout
    assert result.stderr.count("FLAGOS_ROUTE_mm: unknown path 'garbage'") == 1, result.stderr[-3000:]
    assert "device error: flagos is not active in this process" in result.stdout
    assert "FLAGOS_ROUTE_mm" in result.stdout.split("device error:")[1]


def test_routing_warning_is_given_once_and_activation_goes_on(run_bounded):
    result = run_bounded(ACTIVATES, {"FLAGOS_ROUTE_mm": "garbage"})
    assert result.returncode == 0, result.stderr[-3000:]
    assert "active host_ref flagos host_ref" in result.stdout
    assert result.stderr.count("FLAGOS_ROUTE_mm: unknown path 'garbage'") == 1, result.stderr[-3000:]


# ---- 12: a platform that cannot start says so once; device="flagos" then names the cause


def test_unknown_forced_platform_one_message_then_a_clear_device_error(run_bounded):
    result = run_bounded(FAILS_CLEARLY, {"FLAGOS_PLATFORM": "nosuch"})
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stderr.count("FLAGOS_PLATFORM=nosuch: unknown platform") == 1, result.stderr[-3000:]
    assert "Expected one of" not in result.stdout + result.stderr
    assert (
        "device error: flagos is not active in this process: FLAGOS_PLATFORM=nosuch: unknown platform" in result.stdout
    )


def test_every_first_use_names_the_cause(run_bounded):
    """A tensor made on flagos, a tensor or module moved there: each raises the cause, not PyTorch's
    "not linked with support for flagos devices"; the cause is warned once."""
    result = run_bounded(
        """
        import warnings
        warnings.simplefilter("always")
        import torch
        uses = {
            "tensor": lambda: torch.tensor([1.0], device="flagos"),
            "to": lambda: torch.ones(1).to("flagos"),
            "module": lambda: torch.nn.Linear(1, 1).to("flagos"),
            "method": lambda: torch.ones(1).flagos(),
            "query": lambda: torch.flagos.device_count(),
        }
        for name, use in uses.items():
            try:
                use()
            except RuntimeError as exc:
                print(name, "error:", exc)
        print("available", torch.flagos.is_available())
        """,
        {"FLAGOS_PLATFORM": "nosuch"},
    )
    assert result.returncode == 0, result.stderr[-3000:]
    lines = result.stdout.splitlines()
    cause = "error: flagos is not active in this process: FLAGOS_PLATFORM=nosuch: unknown platform"
    assert [line.split(" ", 1)[0] for line in lines] == ["tensor", "to", "module", "method", "query", "available"]
    assert all(cause in line for line in lines[:-1]), result.stdout
    assert lines[-1] == "available False"
    assert result.stderr.count("FLAGOS_PLATFORM=nosuch: unknown platform") == 1, result.stderr[-3000:]


def test_broken_forced_descriptor_one_message_naming_the_file(tmp_path, run_bounded):
    path = platform_copy(tmp_path, "schema_chip") / "platform.yaml"
    text = path.read_text()
    path.write_text(text.replace("status: unvalidated", "status: bogus"))
    line = next(i for i, row in enumerate(text.splitlines(), 1) if row.startswith("status:"))
    result = run_bounded(FAILS_CLEARLY, {"FLAGOS_PLATFORM": "schema_chip", "FLAGOS_PLATFORM_PATH": str(tmp_path)})
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stderr.count(f"schema_chip{os.sep}platform.yaml:{line}: status: ") == 1, result.stderr[-3000:]
    assert "device error: flagos is not active in this process" in result.stdout
    assert "Expected one of" not in result.stdout + result.stderr


def test_platforms_list_with_a_broken_descriptor_says_so(tmp_path, monkeypatch):
    folder = platform_copy(tmp_path)
    (folder / "platform.yaml").write_text("schema_version: 1\nname: host_ref\n")
    monkeypatch.setenv("FLAGOS_PLATFORM_PATH", str(tmp_path))
    monkeypatch.delitem(sys.modules, "torch", raising=False)
    result = CliRunner().invoke(app, ["platforms", "list"])
    assert result.exit_code == 0, result.output
    assert "no platform's detection rules match this machine" not in result.output
    assert "host_ref could not be loaded" in result.output


@pytest.mark.cuda
@pytest.mark.skipif(
    not __import__("torch").cuda.is_available(), reason="needs a real CUDA device (runs on the GPU board)"
)
def test_failed_activation_on_a_cuda_machine_leaves_cuda_alone(run_bounded):
    code = """
        import warnings
        warnings.simplefilter("always")
        import torch, torch_fl
        x = torch.ones(4, device="cuda", requires_grad=True)
        (x * 2).sum().backward()
        print("cuda autograd ok", x.grad.sum().item(), hasattr(torch, "flagos"))
    """
    result = run_bounded(code, {"FLAGOS_PLATFORM": "nosuch"}, limit_memory=False)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "cuda autograd ok 8.0 False" in result.stdout
    assert result.stderr.count("FLAGOS_PLATFORM=nosuch: unknown platform") == 1
