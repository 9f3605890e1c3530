"""Interpreter exit after a backward pass on flagos, without an abort.

A backward pass on flagos runs on PyTorch's autograd device threads, and the thread that ran its
last node may let go of the pass's bookkeeping after the caller has returned. That bookkeeping can
hold Python objects (torch 2.13 keeps the caller's contextvars context in it); if the interpreter is
finalizing by then, the thread's wait for the GIL ends it inside a C++ destructor and the process
aborts ("terminate called without an active exception"), in about two of five scripts that exit as
soon as their backward pass returns on one core. At exit, before finalization, the core drains the
device threads (see autograd_threads.cpp).
"""

from __future__ import annotations

import atexit
import os
from types import ModuleType

_threads_are_the_parents = False


def install(core: ModuleType) -> None:
    """Drains the autograd device threads at interpreter exit; once per process."""

    def after_fork_in_child() -> None:
        # An engine that still lists the parent's threads in the child (it then refuses a backward
        # pass there as a bad fork) has none to drain; torch 2.13's lists none and starts its own.
        global _threads_are_the_parents
        _threads_are_the_parents = core.autograd_device_threads() > 0

    def drain() -> None:
        if not _threads_are_the_parents:
            core.drain_autograd_device_threads()

    os.register_at_fork(after_in_child=after_fork_in_child)
    atexit.register(drain)
