"""A descriptor cannot lift its own gate nor import code from outside its folder.

It may not set torch-fl's own FLAGOS_* variables (FLAGOS_ALLOW_UNVALIDATED would enable its own
unvalidated kernels), and its vendor module is a regular `.py` file inside the platform folder
after resolving links: a symlink out of the folder or an importable module name is refused with
file:line:field.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from torch_fl.platform import DescriptorError, load_descriptor
from torch_fl.platform.discovery import shipped_root

HOST_REF = shipped_root() / "host_ref"
VENDOR = "kernels:\n  vendor:\n    module: {module}\n    ops: {{aten::relu: relu}}\n"


def chip(tmp_path: Path, replace: tuple[str, str] | None = None, append: str = "") -> Path:
    folder = tmp_path / "platforms" / "evil_chip"
    shutil.copytree(HOST_REF, folder)
    path = folder / "platform.yaml"
    text = path.read_text().replace("name: host_ref", "name: evil_chip")
    if replace is not None:
        assert replace[0] in text
        text = text.replace(*replace)
    path.write_text(text + append)
    return folder


def line_of(folder: Path, needle: str) -> int:
    text = (folder / "platform.yaml").read_text()
    return next(i for i, line in enumerate(text.splitlines(), 1) if needle in line)


def error_of(folder: Path) -> DescriptorError:
    with pytest.raises(DescriptorError) as info:
        load_descriptor(folder)
    return info.value


@pytest.mark.parametrize(
    "variable", ["FLAGOS_ALLOW_UNVALIDATED", "FLAGOS_ROUTE_mm", "FLAGOS_ROUTES", "FLAGOS_PLATFORM"]
)
def test_descriptor_may_not_set_gating_or_routing_variables(tmp_path, variable):
    folder = chip(tmp_path, ("variables: {}", f'variables: {{GEMS_VENDOR: nvidia, {variable}: "1"}}'))
    error = error_of(folder)
    assert len(error.issues) == 1
    assert error.line == line_of(folder, "variables:")
    assert error.field == f"environment.variables.{variable}"
    assert "torch-fl setting" in error.message
    assert f"platform.yaml:{error.line}: environment.variables.{variable}: " in str(error)


def test_vendor_stack_variables_are_still_allowed(tmp_path):
    folder = chip(tmp_path, ("variables: {}", "variables: {GEMS_VENDOR: nvidia}"))
    assert load_descriptor(folder).environment.variables == {"GEMS_VENDOR": "nvidia"}


def _with_vendor(tmp_path: Path, module: str) -> Path:
    folder = chip(tmp_path)
    text = (folder / "platform.yaml").read_text()
    start = text.index("kernels:")
    end = text.index("\n\n", start)
    (folder / "platform.yaml").write_text(text[:start] + VENDOR.format(module=module) + text[end:])
    return folder


def test_vendor_module_symlinked_out_of_the_folder_is_refused(tmp_path):
    outside = tmp_path / "elsewhere.py"
    outside.write_text("def relu(x):\n    return x\n")
    folder = _with_vendor(tmp_path, "vendor_kernels.py")
    (folder / "vendor_kernels.py").symlink_to(outside)
    error = error_of(folder)
    assert error.field == "kernels.vendor.module" and error.line == line_of(folder, "module: vendor_kernels.py")
    assert f"resolves to {outside}, outside the platform folder" in error.message


def test_vendor_module_that_is_not_a_regular_file_is_refused(tmp_path):
    folder = _with_vendor(tmp_path, "vendor_kernels.py")
    (folder / "vendor_kernels.py").mkdir()
    error = error_of(folder)
    assert error.field == "kernels.vendor.module" and "is not a regular file" in error.message


def test_vendor_module_through_a_link_is_refused_even_inside_the_folder(tmp_path):
    folder = _with_vendor(tmp_path, "vendor_kernels.py")
    (folder / "real_kernels.py").write_text("def relu(x):\n    return x\n")
    (folder / "vendor_kernels.py").symlink_to(folder / "real_kernels.py")
    error = error_of(folder)
    assert error.field == "kernels.vendor.module" and "through a link" in error.message


def test_vendor_module_in_a_linked_subfolder_is_refused(tmp_path):
    folder = _with_vendor(tmp_path, "sub/vendor_kernels.py")
    (folder / "real").mkdir()
    (folder / "real" / "vendor_kernels.py").write_text("def relu(x):\n    return x\n")
    (folder / "sub").symlink_to(folder / "real")
    error = error_of(folder)
    assert error.field == "kernels.vendor.module" and "through a link" in error.message


@pytest.mark.parametrize("module", ["records/vendor_kernels.py", "__pycache__/vendor_kernels.py", "a/__pycache__/k.py"])
def test_vendor_module_in_a_folder_that_is_never_hashed_is_refused(tmp_path, module):
    folder = _with_vendor(tmp_path, module)
    error = error_of(folder)
    assert error.field == "kernels.vendor.module" and "not hashed" in error.message


def test_the_vendor_module_runs_from_its_source_never_a_planted_bytecode_file(tmp_path):
    import importlib.util
    import py_compile

    pytest.importorskip("torch")
    from torch_fl.kernels.vendor import load_vendor_module

    folder = _with_vendor(tmp_path, "vendor_kernels.py")
    source = folder / "vendor_kernels.py"
    source.write_text("VALUE = 'hashed'\n\ndef relu(x):\n    return x\n")
    planted = tmp_path / "planted.py"
    planted.write_text("VALUE = 'planted'\n\ndef relu(x):\n    return x\n")
    cache = Path(importlib.util.cache_from_source(str(source)))
    py_compile.compile(str(planted), cfile=str(cache), invalidation_mode=py_compile.PycInvalidationMode.UNCHECKED_HASH)
    planted_bytes = cache.read_bytes()
    module = load_vendor_module(load_descriptor(folder))
    assert module.VALUE == "hashed"
    assert sorted(folder.rglob("*.pyc")) == [cache] and cache.read_bytes() == planted_bytes  # no bytecode written


def test_the_vendor_module_imports_its_kernel_files_from_their_source(tmp_path, monkeypatch):
    """`from NAME import f` in the vendor module imports NAME.py of the platform folder, like the
    vendor module itself: from the hashed bytes (a planted bytecode file is not run), listed among
    the imported sources, and no bytecode written."""
    import hashlib
    import importlib.util
    import py_compile
    import sys

    pytest.importorskip("torch")
    from torch_fl.kernels.vendor import imported_sources, load_vendor_module

    name = "evil_chip_kernel_file"
    monkeypatch.delitem(sys.modules, "torch_fl_vendor_evil_chip", raising=False)
    monkeypatch.delitem(sys.modules, name, raising=False)
    folder = _with_vendor(tmp_path, "vendor_kernels.py")
    (folder / "vendor_kernels.py").write_text(f"from {name} import relu\n")
    kernel_file = folder / f"{name}.py"
    kernel_file.write_text("VALUE = 'hashed'\n\ndef relu(x):\n    return VALUE\n")
    planted = tmp_path / "planted.py"
    planted.write_text("VALUE = 'planted'\n\ndef relu(x):\n    return VALUE\n")
    cache = Path(importlib.util.cache_from_source(str(kernel_file)))
    py_compile.compile(str(planted), cfile=str(cache), invalidation_mode=py_compile.PycInvalidationMode.UNCHECKED_HASH)
    finders = list(sys.meta_path)
    try:
        module = load_vendor_module(load_descriptor(folder))
        assert module.relu(None) == "hashed"
        digest = "sha256:" + hashlib.sha256(kernel_file.read_bytes()).hexdigest()
        assert imported_sources()[f"{name}.py"] == digest
        assert sorted(folder.rglob("*.pyc")) == [cache]  # no bytecode written
        assert sys.meta_path == finders  # the folder is importable only while the vendor module loads
    finally:
        sys.modules.pop(name, None)
        sys.modules.pop("torch_fl_vendor_evil_chip", None)


def test_a_kernel_file_that_is_a_link_is_not_imported(tmp_path, monkeypatch):
    import sys

    pytest.importorskip("torch")
    from torch_fl.kernels.vendor import load_vendor_module

    name = "evil_chip_linked_file"
    monkeypatch.delitem(sys.modules, "torch_fl_vendor_evil_chip", raising=False)
    folder = _with_vendor(tmp_path, "vendor_kernels.py")
    (folder / "vendor_kernels.py").write_text(f"from {name} import relu\n")
    outside = tmp_path / "elsewhere.py"
    outside.write_text("raise SystemExit('imported from outside the platform folder')\n")
    (folder / f"{name}.py").symlink_to(outside)
    with pytest.raises(ImportError, match="is a link"):
        load_vendor_module(load_descriptor(folder))
    assert "torch_fl_vendor_evil_chip" not in sys.modules and name not in sys.modules


@pytest.mark.parametrize("module", ["os.path", "evil", "pkg.vendor_kernels"])
def test_importable_module_names_are_refused(tmp_path, module):
    folder = _with_vendor(tmp_path, module)
    error = error_of(folder)
    assert error.field == "kernels.vendor.module" and error.line == line_of(folder, f"module: {module}")


def test_vendor_loader_refuses_a_link_made_after_loading(tmp_path):
    pytest.importorskip("torch")
    from torch_fl.kernels.vendor import load_vendor_module

    folder = _with_vendor(tmp_path, "vendor_kernels.py")
    descriptor = load_descriptor(folder)  # the file does not exist yet: nothing to refuse
    outside = tmp_path / "elsewhere.py"
    outside.write_text("raise SystemExit('imported from outside the platform folder')\n")
    (folder / "vendor_kernels.py").symlink_to(outside)
    with pytest.raises(DescriptorError, match="outside the platform folder"):
        load_vendor_module(descriptor)


@pytest.mark.parametrize("variable", ["CXX", "PATH", "LD_PRELOAD", "PYTHONPATH", "LDSHARED", "TRITON_PTXAS_PATH"])
def test_descriptor_may_not_set_toolchain_loader_or_interpreter_variables(tmp_path, variable):
    folder = chip(tmp_path, ("variables: {}", f'variables: {{GEMS_VENDOR: nvidia, {variable}: "/tmp/x"}}'))
    error = error_of(folder)
    assert len(error.issues) == 1 and error.field == f"environment.variables.{variable}"
    assert "chooses which program or library runs" in error.message
    assert f"platform.yaml:{error.line}: environment.variables.{variable}: " in str(error)


@pytest.mark.parametrize(("entry", "why"), [('"A=B": "1"', "not a variable name"), ('GEMS_X: "a\\0b"', "NUL")])
def test_variable_names_and_values_are_checked_at_load(tmp_path, entry, why):
    folder = chip(tmp_path, ("variables: {}", f"variables: {{{entry}}}"))
    error = error_of(folder)
    assert why in error.message and error.field.startswith("environment.variables")


@pytest.mark.parametrize(
    "variable", ["JAVA_TOOL_OPTIONS", "NODE_OPTIONS", "MY_SETTING", "CUDA_HOME", "ASCEND_OPP_PATH", "NCCL_NET_PLUGIN"]
)
def test_only_the_vendor_runtime_knobs_the_schema_lists_may_be_set(tmp_path, variable):
    folder = chip(tmp_path, ("variables: {}", f'variables: {{GEMS_VENDOR: nvidia, {variable}: "1"}}'))
    error = error_of(folder)
    assert len(error.issues) == 1 and error.field == f"environment.variables.{variable}"
    assert f"platform.yaml:{error.line}: environment.variables.{variable}: " in str(error)
    assert not _schema_allows_variable(variable)


@pytest.mark.parametrize(
    "variable",
    ["CUDA_VISIBLE_DEVICES", "NCCL_DEBUG", "ASCEND_RT_VISIBLE_DEVICES", "PYTORCH_NPU_ALLOC_CONF", "OMP_NUM_THREADS"],
)
def test_vendor_runtime_knobs_are_allowed(tmp_path, variable):
    folder = chip(tmp_path, ("variables: {}", f'variables: {{{variable}: "1=2"}}'))
    assert load_descriptor(folder).environment.variables == {variable: "1=2"}
    assert _schema_allows_variable(variable)


def _schema_allows_variable(name: str) -> bool:
    """Whether the committed JSON Schema accepts `name` in environment.variables, as the loader does."""
    import jsonschema

    from torch_fl.platform.schema import schema_text

    schema = json.loads(schema_text())
    names = schema["$defs"]["Environment"]["properties"]["variables"]["propertyNames"]
    return jsonschema.Draft202012Validator(names).is_valid(name)
