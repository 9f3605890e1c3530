"""Builds the C++ core against the installed torch, once per torch version and source hash.

The core is compiled at first use rather than shipped as a binary, so one checkout serves every
PyTorch line it supports (no ABI pin). Later imports load the cached library directly, without
running the build tool, which keeps `import torch` fast.
"""

from __future__ import annotations

import collections
import contextlib
import hashlib
import importlib.machinery
import importlib.util
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import sysconfig
import time
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import torch
from filelock import FileLock, Timeout

from torch_fl import env

CSRC = Path(__file__).parent / "csrc"
MODULE_NAME = "torch_fl_core"
# NDEBUG: c10 headers' debug-only checks sit on the hot path. Hidden visibility: the core exports
# only its module's entry point, so its calls between its own functions (and into the c10 inline
# functions it instantiates) are direct, with no PLT jump or GOT load; in a model's decode that cut
# the core's L1 instruction-cache misses by a tenth and its data-cache misses by a fifth. -O3: its
# inlining leaves a routed call fewer cache lines to fetch (simulated over a host decode, 8% fewer
# instruction and 10% fewer data misses per routed call than -O2; -Os ran 23% more, -O3 with LTO 6-8% more).
CFLAGS = [
    "-O3",
    "-DNDEBUG",
    "-std=c++20",
    "-fvisibility=hidden",
    "-fvisibility-inlines-hidden",
    "-fno-semantic-interposition",
]

env.register("FLAGOS_BUILD_DIR", None, "Where the compiled C++ core is cached (default: ~/.cache/torch_fl/build).")
env.register("FLAGOS_BUILD_VERBOSE", "0", "Set to 1 to show the compiler output while the core builds.")


class CompilerNotFound(RuntimeError):
    """No C++ compiler: the core cannot be built."""


def sources() -> list[Path]:
    return sorted(CSRC.glob("*.cpp"))


def build_key() -> str:
    """Changes whenever the library would differ: sources, torch build, Python ABI, flags."""
    h = hashlib.sha256()
    for path in sorted(CSRC.iterdir()):
        h.update(path.name.encode())
        h.update(path.read_bytes())
    h.update(torch.__version__.encode())
    h.update(str(torch._C._GLIBCXX_USE_CXX11_ABI).encode())
    h.update(sysconfig.get_config_var("EXT_SUFFIX").encode())
    h.update(" ".join(CFLAGS).encode())
    h.update(_compiler_identity().encode())
    return h.hexdigest()[:16]


def _compiler_identity() -> str:
    """The compiler a build would run (CXX, else c++), resolved, with its size and mtime: a library
    built by another compiler is another library (a cheap stat, not a `--version` per import)."""
    name = os.environ.get("CXX", "c++")
    path = shutil.which(name)
    if path is None:
        return name
    stat = os.stat(path)
    return f"{os.path.realpath(path)}:{stat.st_size}:{stat.st_mtime_ns}"


def build_dir() -> Path:
    root = env.get("FLAGOS_BUILD_DIR") or os.path.join(Path.home(), ".cache", "torch_fl", "build")
    tag = torch.__version__.replace("+", "_")
    return Path(root) / f"torch-{tag}-{build_key()}"


def _library(directory: Path) -> Path:
    return directory / f"{MODULE_NAME}.so"


def _import_library(path: Path) -> ModuleType:
    loader = importlib.machinery.ExtensionFileLoader(MODULE_NAME, str(path))
    spec = importlib.util.spec_from_file_location(MODULE_NAME, str(path), loader=loader)
    assert spec is not None
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


def _check_compiler() -> None:
    compiler = os.environ.get("CXX", "c++")
    if shutil.which(compiler) is None:
        raise CompilerNotFound(
            f"torch_fl builds its small C++ core once per torch version and needs a C++ compiler, but "
            f"'{compiler}' was not found. Install one (Debian/Ubuntu: `apt install g++`; Fedora: "
            f"`dnf install gcc-c++`; conda: `conda install -c conda-forge gxx_linux-64`) or point CXX at it."
        )


BUILD_TIME = "about 3 minutes on 2 CPU cores, less with more"
"""What the first import of a new torch/source combination costs, as measured on a 2-core machine."""


@contextlib.contextmanager
def _build_lock(directory: Path) -> Iterator[None]:
    """Hold the build lock of `directory`; a process that finds it held says it waits, then waits.

    Several processes often start at once (pytest-xdist workers, a DDP launch): one builds, the
    others wait for it and load its library.
    """
    lock = FileLock(str(directory / "build.lock"))
    try:
        lock.acquire(timeout=0)
    except Timeout:
        _say(f"torch_fl: another process is building the flagos core in {directory}; waiting for it ({BUILD_TIME})")
        lock.acquire()
    try:
        yield
    finally:
        lock.release()


def _say(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def load_core() -> ModuleType:
    """Returns the compiled core, building it first if this torch/source combination is new."""
    directory = build_dir()
    library = _library(directory)
    if library.exists():
        return _import_library(library)
    _check_compiler()
    directory.mkdir(parents=True, exist_ok=True)
    with _build_lock(directory):
        if library.exists():  # built by the process this one waited for
            return _import_library(library)
        _say(
            f"torch_fl: building the flagos core for torch {torch.__version__} in {directory} "
            f"(once per torch version; {BUILD_TIME})"
        )
        # torch's build waits, without end, while its own `lock` file exists; a build killed
        # midway leaves one behind. Holding our lock, no other build of this directory is running.
        (directory / "lock").unlink(missing_ok=True)
        build_library(directory, sources())
        return _import_library(library)


# The build runs in a child process leading a process group of its own (ninja and the compilers
# join it), which ends the group when its parent is gone: a build whose process was killed, even
# with SIGKILL, leaves no compiler running to race the next build over the same objects.
_CHILD = """
import json, os, signal, sys, threading, time
spec = json.loads(sys.argv[1])
def watch():
    while os.getppid() == spec["parent"]:
        time.sleep(0.5)
    os.killpg(0, signal.SIGKILL)
threading.Thread(target=watch, daemon=True).start()
from torch.utils import cpp_extension
cpp_extension.load(**spec["load"])
"""
_STEP = re.compile(r"^\[(\d+)/(\d+)\]")


class BuildFailed(RuntimeError):
    """The core did not compile; the message ends with the build's last output."""


def build_library(directory: Path, files: list[Path]) -> None:
    """Compile `files` into `directory`/torch_fl_core.so, showing each build step as it ends."""
    load = {
        "name": MODULE_NAME,
        "sources": [str(p) for p in files],
        "extra_cflags": CFLAGS,
        "build_directory": str(directory),
        "verbose": True,
        "is_python_module": True,
    }
    argv = [sys.executable, "-c", _CHILD, json.dumps({"parent": os.getpid(), "load": load})]
    # the child imports torch only to build: no backend autoload, so never torch_fl (and this lock)
    child_env = {**os.environ, "TORCH_DEVICE_BACKEND_AUTOLOAD": "0"}
    proc = subprocess.Popen(
        argv,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        text=True,
        errors="replace",
        env=child_env,
        start_new_session=True,
    )
    started, tail = time.monotonic(), collections.deque[str](maxlen=40)
    verbose = env.flag("FLAGOS_BUILD_VERBOSE")
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            tail.append(line.rstrip())
            step = _STEP.match(line)
            if step:
                # ninja, writing to a pipe, prints a step when it ends
                _say(f"torch_fl: core build: {step[1]} of {step[2]} steps done ({time.monotonic() - started:.0f} s)")
            elif verbose:
                _say(line.rstrip())
        code = proc.wait()
    except BaseException:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        raise
    if code != 0:
        raise BuildFailed(
            f"torch_fl: building the flagos core in {directory} failed (exit {code}); its last output:\n"
            + "\n".join(tail)
        )
