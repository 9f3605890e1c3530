"""torch.flagos.init() and the fork rules, as torch.cuda's: flagos is initialised by its first use in a
process (or init()); a child forked after that is in a bad fork, and initialising flagos there raises
a clear error, on every backing (spawn is the start method that works). On a CUDA backing the first
use is the activation itself, which creates the CUDA context."""

from __future__ import annotations

import multiprocessing
from multiprocessing.connection import Connection

import pytest
import torch

TIMEOUT = 60
FORK_ERROR = "Cannot re-initialize flagos in forked subprocess"


def test_init_initialises():
    torch.flagos.init()
    assert torch.flagos.is_initialized()
    assert not torch.flagos._is_in_bad_fork()


def _report_fork_state(conn: Connection) -> None:
    state = {"bad_fork": torch.flagos._is_in_bad_fork(), "initialized": torch.flagos.is_initialized()}
    for name, use in (("tensor", lambda: torch.empty(2, device="flagos")), ("init", torch.flagos.init)):
        try:
            use()
            state[name] = "no error"
        except RuntimeError as exc:
            state[name] = str(exc)
    conn.send(state)


def test_a_child_forked_after_init_cannot_initialise_flagos():
    torch.empty(1, device="flagos")
    parent_end, child_end = multiprocessing.Pipe()
    child = multiprocessing.get_context("fork").Process(target=_report_fork_state, args=(child_end,))
    child.start()
    try:
        assert parent_end.poll(TIMEOUT), "the forked child never reported"
        state = parent_end.recv()
    finally:
        child.join(TIMEOUT)
        if child.is_alive():
            child.kill()
    assert state["bad_fork"] and not state["initialized"], state
    assert FORK_ERROR in state["tensor"] and "'spawn' start method" in state["tensor"], state
    assert FORK_ERROR in state["init"], state
    assert not torch.flagos._is_in_bad_fork() and torch.flagos.is_initialized()  # the parent is unaffected


@pytest.mark.own_process
@pytest.mark.backing_cpu  # a CUDA backing's context exists from activation: flagos is initialised there
def test_first_use_initialises_and_a_fork_before_it_is_fine(run_python):
    result = run_python(
        """
        import os, torch, torch_fl
        assert torch_fl.is_active()
        assert not torch.flagos.is_initialized()
        pid = os.fork()
        if pid == 0:  # forked before flagos was initialised: the child may use it
            ok = torch.ones(2, device="flagos").sum().item() == 2 and not torch.flagos._is_in_bad_fork()
            os._exit(0 if ok else 1)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
        torch.ones(1, device="flagos")
        assert torch.flagos.is_initialized()
        print("ok")
        """,
        timeout=TIMEOUT * 3,
    )
    assert result.stdout.strip().endswith("ok")
