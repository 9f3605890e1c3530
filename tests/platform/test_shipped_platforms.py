"""The shipped descriptors: all load, are honest about validation, and carry the release-note facts."""

from __future__ import annotations

import pytest

from torch_fl.platform import load_all
from torch_fl.platform.discovery import discover

EXPECTED = {
    "host_ref",
    "nvidia_h200",
    "nvidia_a100",
    "ascend_910c",
    "hygon_bw1000",
    "metax_c550",
    "thead_zw810e",
    "mthreads_s5000",
    "enflame_s60",
    "kunlunxin_p800",
    "drobotics_bpu_s600",
}


@pytest.fixture(scope="module")
def shipped():
    loaded, broken = load_all({n: s for n, s in discover(path_env="").items() if s.origin == "shipped"})
    assert not broken, {n: str(e) for n, e in broken.items()}
    return loaded


def test_every_platform_is_shipped(shipped):
    assert set(shipped) == EXPECTED


def test_descriptors_point_editors_at_the_schema():
    for name, source in discover(path_env="").items():
        first = source.descriptor_path.read_text().splitlines()[0]
        assert first == "# yaml-language-server: $schema=../../torch_fl/platform/platform.schema.json", name


def test_descriptors_never_claim_validation(shipped):
    # The record decides; a descriptor that says "validated" would be a claim nobody checked.
    assert {d.status for d in shipped.values()} == {"unvalidated"}


def test_detection_priorities_are_unique_and_host_ref_is_the_fallback(shipped):
    priorities = [d.detect.priority for d in shipped.values()]
    assert len(set(priorities)) == len(priorities)
    host = shipped["host_ref"]
    assert host.detect.priority == min(priorities)
    assert [r.model_dump() for r in host.detect.rules] == [{"always": True}]


def test_host_ref(shipped):
    d = shipped["host_ref"]
    assert (d.backing.device, d.backing.virtual_devices) == ("cpu", 2)
    assert d.kernels.flaggems is None
    assert {"uint16", "uint32", "uint64"} <= set(d.capabilities.dtypes)
    assert set(d.capabilities.amp_dtypes) == {"bfloat16", "float16"}
    assert (d.capabilities.distributed.backend, d.capabilities.compile.path) == ("gloo", "inductor-cpp")


def test_nvidia_h200(shipped):
    d = shipped["nvidia_h200"]
    assert d.backing.device == "cuda"
    assert (d.environment.sdk.name, d.environment.sdk.version) == ("CUDA", "13.0")
    assert (d.kernels.flaggems.version, d.kernels.flaggems.vendor) == ("5.0.2", "nvidia")
    assert d.capabilities.distributed.backend == "nccl"
    assert (d.capabilities.compile.path, d.capabilities.profiler.tracer) == ("inductor-triton", "cupti")
    assert [r.model_dump() for r in d.detect.rules] == [{"cuda_device_name": "H200"}]


def test_h800_is_a_board_of_the_a100_descriptor(shipped):
    assert shipped["nvidia_a100"].boards == ["A100", "H800"]


@pytest.mark.parametrize(
    "name, python",
    [
        ("nvidia_a100", "3.12"),
        ("metax_c550", "3.12"),
        ("thead_zw810e", "3.12"),
        ("enflame_s60", "3.12"),
        ("hygon_bw1000", "3.10"),
        ("mthreads_s5000", "3.10"),
        ("ascend_910c", "3.11"),
        ("kunlunxin_p800", None),
        ("drobotics_bpu_s600", None),
    ],
)
def test_interpreter_lines_from_the_release_notes(shipped, name, python):
    assert shipped[name].environment.python == python


@pytest.mark.parametrize(
    "name, compile_path, tracer",
    [
        ("nvidia_a100", "flagtree", "cupti"),
        ("ascend_910c", "flagtree", "mspti"),
        ("hygon_bw1000", "flagtree", "roctracer"),
        ("metax_c550", "flagtree", "mcpti"),
        ("thead_zw810e", "flagtree", "cupti"),
        ("mthreads_s5000", "flagtree", "mupti"),
        ("enflame_s60", "vendor-triton", "topspti"),
        ("kunlunxin_p800", "none", "none"),
        ("drobotics_bpu_s600", "fx-bpu", "none"),
    ],
)
def test_compile_and_profiler_from_the_release_notes(shipped, name, compile_path, tracer):
    caps = shipped[name].capabilities
    assert (caps.compile.path, caps.profiler.tracer) == (compile_path, tracer)


def test_bpu_runs_eager_on_cpu_only(shipped):
    d = shipped["drobotics_bpu_s600"]
    assert d.kernels.native.enabled is False
    assert d.routes.defaults == ["cpu"]
    assert d.capabilities.distributed.backend == "none" and d.capabilities.amp_dtypes == []


def test_vendor_platforms_cite_the_release_notes(shipped):
    for name, d in shipped.items():
        if name not in ("host_ref", "nvidia_h200"):
            assert any("2.10.0 release notes" in s for s in d.sources), name
