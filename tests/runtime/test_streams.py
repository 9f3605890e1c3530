"""Streams and events on flagos: torch.flagos.Stream/Event, stream contexts, current/default streams,
event timing and synchronisation. On the host backing work is synchronous (events record wall-clock
time); on CUDA they are CUDA streams and events under a flagos label."""

from __future__ import annotations

import time

import pytest
import torch


def test_new_stream_is_a_flagos_stream():
    s = torch.flagos.Stream()
    assert isinstance(s, torch.Stream)
    assert s.device == torch.device("flagos", 0)
    assert s != torch.flagos.default_stream()
    assert s.query()
    s.synchronize()
    assert torch.flagos.Stream() != s  # each call is a new stream


def test_current_and_default_stream():
    default = torch.flagos.default_stream()
    assert torch.flagos.current_stream() == default
    assert torch.flagos.current_stream("flagos:0") == default
    assert default.device == torch.device("flagos", 0)


def test_stream_context_sets_and_restores(same):
    s = torch.flagos.Stream()
    before = torch.flagos.current_stream()
    with torch.flagos.stream(s):
        assert torch.flagos.current_stream() == s
        x = torch.ones(64, 64, device="flagos") @ torch.ones(64, 64, device="flagos")
    assert torch.flagos.current_stream() == before
    s.synchronize()
    same(x, torch.full((64, 64), 64.0))
    with torch.flagos.stream(None):  # None is a no-op, as for torch.cuda.stream
        assert torch.flagos.current_stream() == before


def test_torch_stream_context_manager():
    s = torch.Stream(device="flagos")
    with s:
        assert torch.flagos.current_stream() == s
    assert torch.flagos.current_stream() == torch.flagos.default_stream()


def test_set_stream():
    s = torch.flagos.Stream()
    torch.flagos.set_stream(s)
    assert torch.flagos.current_stream() == s
    assert torch.accelerator.current_stream() == s
    torch.accelerator.set_stream(torch.flagos.default_stream())
    assert torch.flagos.current_stream() == torch.flagos.default_stream()


def test_event_timing():
    start, end = torch.flagos.Event(enable_timing=True), torch.flagos.Event(enable_timing=True)
    assert isinstance(start, torch.Event)
    start.record()
    x = torch.randn(256, 256, device="flagos")
    for _ in range(5):
        x = x @ x.tanh()
    time.sleep(0.01)  # host time passes on any backing
    end.record()
    end.synchronize()
    assert start.query() and end.query()
    elapsed = start.elapsed_time(end)
    assert isinstance(elapsed, float) and elapsed > 0


def test_event_on_a_side_stream_and_wait(same):
    side = torch.flagos.Stream()
    done = torch.flagos.Event()
    with torch.flagos.stream(side):
        y = torch.arange(10.0, device="flagos") * 2
        done.record(side)
    torch.flagos.current_stream().wait_event(done)
    same(y + 1, torch.arange(10.0) * 2 + 1)
    torch.flagos.current_stream().wait_stream(side)
    done.wait()
    done.synchronize()


def test_stream_record_event_and_record_stream():
    s = torch.flagos.Stream()
    e = s.record_event()
    assert isinstance(e, torch.Event) and e.query()
    x = torch.empty(1024, device="flagos")
    x.record_stream(s)  # allowed on flagos tensors, as on CUDA ones
    del x
    torch.flagos.synchronize()


def test_event_without_timing_refuses_elapsed_time():
    a, b = torch.flagos.Event(), torch.flagos.Event()
    a.record()
    b.record()
    b.synchronize()
    with pytest.raises((RuntimeError, ValueError), match="enable_timing"):
        a.elapsed_time(b)


@pytest.mark.two_devices
def test_streams_per_device():
    s1 = torch.flagos.Stream("flagos:1")
    assert s1.device == torch.device("flagos", 1)
    with torch.flagos.stream(s1):
        assert torch.flagos.current_stream(1) == s1
        assert torch.flagos.current_stream(0) == torch.flagos.default_stream(0)
    assert torch.flagos.current_stream(1) == torch.flagos.default_stream(1)


@pytest.mark.backing_cuda
def test_cuda_streams_underneath():
    s = torch.flagos.Stream()
    with torch.flagos.stream(s):
        assert torch.cuda.current_stream().stream_id == s.stream_id  # the same CUDA stream
    start, end = torch.flagos.Event(enable_timing=True), torch.flagos.Event(enable_timing=True)
    start.record()
    a = torch.randn(2048, 2048, device="flagos")
    for _ in range(10):
        a = a @ a
    end.record()
    end.synchronize()
    assert start.elapsed_time(end) > 0
