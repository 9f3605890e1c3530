"""The platform descriptor: the one declarative file that defines a platform.

`platforms/<name>/platform.yaml` is validated against these models (unknown fields are errors,
values are not coerced), and the published JSON Schema is generated from them. Cross-field rules
(a route names a declared kernel set, AMP dtypes are among the dtypes, virtual devices only on a
cpu backing) are checked here too, so a model that exists is a model that is consistent.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Discriminator,
    Field,
    PrivateAttr,
    StringConstraints,
    Tag,
    field_validator,
    model_validator,
)

from torch_fl.platform.errors import DescriptorError, Issue, short
from torch_fl.platform.versions import SPEC_PATTERN

SCHEMA_VERSION = 1
OP_NAME_PATTERN = r"^aten::[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z0-9_]+)?$"
NAME_PATTERN = r"^[a-z][a-z0-9_]*$"

KERNEL_SETS: tuple[str, ...] = ("native", "flaggems", "vendor", "emulated", "cpu")
"""Every execution path, in the order the design lists them; `cpu` is implicit and never declared."""
RUNTIME_BACKINGS: frozenset[str] = frozenset({"cpu", "cuda"})
"""Backing devices the C++ runtime can drive; descriptors with other backings load as data only."""
RECORDS_DIR = "records"
"""The folder of a platform's conformance records (torch_fl.platform.record)."""
TORCH_FL_PREFIX = "FLAGOS_"
"""torch-fl's own environment variables (torch_fl.env); a descriptor may not set them."""
PROGRAM_VARIABLES = frozenset(
    """PATH SHELL BASH_ENV ENV HOME CC CXX CPP LD AR LDSHARED CFLAGS CXXFLAGS CPPFLAGS LDFLAGS CPATH
    C_INCLUDE_PATH CPLUS_INCLUDE_PATH LIBRARY_PATH NVCC_PREPEND_FLAGS NVCC_APPEND_FLAGS TORCH_EXTENSIONS_DIR
    TRITON_PTXAS_PATH TRITON_CUOBJDUMP_PATH TRITON_NVDISASM_PATH TRITON_LIBDEVICE_PATH TRITON_CACHE_DIR
    PYTEST_ADDOPTS PYTEST_PLUGINS""".split()
)
PROGRAM_PREFIXES = ("LD_", "DYLD_", "PYTHON", "GCONV_", "MALLOC_")
"""Variables that choose which program, library or interpreter code runs (compilers, the dynamic
loader, Python's path, the core build's flags): a descriptor setting them would run code that no
record binds, in every process that loads the platform, and in the core build that all platforms
share. A descriptor sets its vendor stack's own knobs only."""
PROGRAM_SUFFIXES = (
    "_PATH",
    "_HOME",
    "_ROOT",
    "_DIR",
    "_DIRS",
    "_FILE",
    "_PRELOAD",
    "_LIB",
    "_LIBS",
    "_LIBRARY",
    "_PLUGIN",
    "_BIN",
    "_FLAGS",
)
"""Name endings of variables that point at a file, folder, library or compiler flags (CUDA_HOME,
ASCEND_OPP_PATH, NCCL_NET_PLUGIN): refused whatever the prefix, for the reason above."""
VENDOR_VARIABLE_PREFIXES = (
    *("CUDA_", "NCCL_", "NVIDIA_", "TORCH_NCCL_", "PYTORCH_"),  # NVIDIA; torch's allocator and NCCL knobs
    *("ASCEND_", "HCCL_", "ACL_"),  # Huawei CANN
    *("MUSA_", "MCCL_"),  # Moore Threads MUSA
    *("TOPS_", "ECCL_", "ENFLAME_"),  # Enflame TopsRider
    *("XPU_", "XPUAPI_", "BKCL_", "XMLIR_"),  # Kunlunxin XPU
    *("HIP_", "HSA_", "ROCR_", "RCCL_", "DTK_"),  # Hygon DTK
    *("MACA_", "METAX_"),  # MetaX MACA
    *("BPU_", "HB_"),  # D-Robotics
    "THEAD_",  # T-Head
    "GEMS_",  # FlagGems
    *("OMP_", "MKL_", "KMP_", "GLOO_"),  # host threads and collectives
)
"""What `environment.variables` may set: the knobs of the vendor runtimes (device visibility,
allocators, collectives, logging, threads), named by these prefixes, less PROGRAM_SUFFIXES. An
allow-list, so a variable no one reviewed (JAVA_TOOL_OPTIONS, NODE_OPTIONS, a new loader hook) is
refused rather than passed on; a vendor whose runtime documents another prefix adds it here."""
_VARIABLE_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
RULE_KINDS: tuple[str, ...] = ("env", "python_module", "path_exists", "cuda_device_name", "always")

BackingDevice = Literal["cpu", "cuda", "npu", "musa", "gcu", "xpu_kunlun", "bpu"]
KernelSetName = Literal["native", "flaggems", "vendor", "emulated", "cpu"]
DType = Literal[
    "float64",
    "float32",
    "float16",
    "bfloat16",
    "float8_e4m3fn",
    "float8_e5m2",
    "float8_e4m3fnuz",
    "float8_e5m2fnuz",
    "complex128",
    "complex64",
    "complex32",
    "int64",
    "int32",
    "int16",
    "int8",
    "uint64",
    "uint32",
    "uint16",
    "uint8",
    "bool",
]
AmpDType = Literal["float16", "bfloat16"]
DistributedBackend = Literal["gloo", "nccl", "hccl", "rccl", "mccl", "flagcx", "bkcl", "none"]
DistributedFeature = Literal["basic", "ddp", "fsdp2", "data_parallel"]
CompilePath = Literal["inductor-cpp", "inductor-triton", "flagtree", "vendor-triton", "fx-bpu", "none"]
DeviceFeature = Literal["fused_attention", "flex_attention", "flex_attention_compiled", "sparse"]
ProfilerTracer = Literal["none", "kineto-cpu", "cupti", "roctracer", "mupti", "mspti", "topspti", "mcpti"]
SharingMechanism = Literal["shared_memory", "cuda_ipc", "none"]

OpName = Annotated[str, StringConstraints(pattern=OP_NAME_PATTERN)]
VersionSpec = Annotated[str, StringConstraints(pattern=SPEC_PATTERN)]
Identifier = Annotated[str, StringConstraints(pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")]
NonEmpty = Annotated[str, StringConstraints(min_length=1)]
_OP_KEYS_ONLY: dict[str, Any] = {"additionalProperties": False}


class _Model(BaseModel):
    """Strict, closed, immutable: a typo is an error, `"2"` is not 2, and a loaded model stays as validated."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)


class Backing(_Model):
    """The device whose memory and aten kernels back flagos tensors."""

    device: BackingDevice = Field(
        description="Backing device type; the runtime drives cpu and cuda, others load as descriptors only."
    )
    virtual_devices: int | None = Field(
        None, ge=1, description="Number of flagos devices emulated on the host (cpu backing only; default 2)."
    )
    note: str | None = Field(None, description="How the backing relates to the vendor's stack.")

    @model_validator(mode="before")
    @classmethod
    def _cpu_default(cls, data: Any) -> Any:
        if isinstance(data, dict) and data.get("device") == "cpu" and "virtual_devices" not in data:
            return {**data, "virtual_devices": 2}
        return data

    @model_validator(mode="after")
    def _virtual_only_on_cpu(self) -> Backing:
        if self.device != "cpu" and self.virtual_devices is not None:
            raise DescriptorError(
                [Issue("only a cpu backing has virtual devices; remove it", ("backing", "virtual_devices"))]
            )
        return self


class EnvRule(_Model):
    env: NonEmpty = Field(description="Matches when this environment variable is set (non-empty).")


class PythonModuleRule(_Model):
    python_module: NonEmpty = Field(description="Matches when this module is importable (found without importing it).")


class PathExistsRule(_Model):
    path_exists: NonEmpty = Field(description="Matches when this path exists, e.g. a device node.")


class CudaDeviceNameRule(_Model):
    cuda_device_name: NonEmpty = Field(
        description="Regex searched in each CUDA device name; evaluated only when torch is already imported and CUDA is available."
    )

    @field_validator("cuda_device_name")
    @classmethod
    def _compiles(cls, value: str) -> str:
        try:
            re.compile(value)
        except re.error as exc:
            raise ValueError(f"not a valid regular expression: {exc}") from None
        return value


class AlwaysRule(_Model):
    always: Literal[True] = Field(description="Always matches (the fallback platform).")


def _rule_kind(value: Any) -> str | None:
    if isinstance(value, dict) and len(value) == 1:
        key = next(iter(value))
        return key if key in RULE_KINDS else None
    if isinstance(value, BaseModel):
        return next(iter(type(value).model_fields))
    return None


Rule = Annotated[
    (
        Annotated[EnvRule, Tag("env")]
        | Annotated[PythonModuleRule, Tag("python_module")]
        | Annotated[PathExistsRule, Tag("path_exists")]
        | Annotated[CudaDeviceNameRule, Tag("cuda_device_name")]
        | Annotated[AlwaysRule, Tag("always")]
    ),
    Discriminator(
        _rule_kind,
        custom_error_type="rule_kind",
        custom_error_message="a rule is a mapping with exactly one of: " + ", ".join(RULE_KINDS),
    ),
]


class Detect(_Model):
    """How to recognise the platform on this machine: any rule matching is a match."""

    priority: int = Field(description="Among matching platforms the highest priority wins.")
    rules: list[Rule] = Field(
        description="Any one matching rule matches the platform; an empty list is never detected (select it with FLAGOS_PLATFORM)."
    )


class Sdk(_Model):
    name: NonEmpty = Field(description="The vendor SDK, e.g. CUDA, CANN, DTK.")
    version: str | None = Field(None, description="The SDK version the platform is built against.")
    home_env: Identifier | None = Field(None, description="Variable that points at the SDK install directory.")


class Environment(_Model):
    sdk: Sdk | None = None
    variables: dict[str, str] = Field(
        default_factory=dict,
        description="The vendor runtime's knobs, set in the process before the platform loads (unless already set): "
        "names with a vendor runtime's prefix (CUDA_, NCCL_, ASCEND_, HCCL_, MUSA_, XPU_, HIP_, GEMS_, OMP_, ...), "
        "none naming a file, folder, library or flags (_PATH, _HOME, _DIR, _LIB, _PLUGIN, _FLAGS, ...). "
        "torch-fl's own FLAGOS_* settings are the user's, and toolchain, loader and interpreter variables "
        "(PATH, CXX, LD_*, PYTHON*, ...) choose what code runs: all are refused.",
        json_schema_extra={
            "propertyNames": {
                "pattern": "^(" + "|".join(VENDOR_VARIABLE_PREFIXES) + ")[A-Za-z0-9_]*$",
                "not": {
                    "pattern": "^(" + "|".join(sorted(PROGRAM_VARIABLES)) + ")$|(" + "|".join(PROGRAM_SUFFIXES) + ")$"
                },
            }
        },
    )
    python: Annotated[str, StringConstraints(pattern=r"^3\.\d+$")] | None = Field(
        None, description="The one interpreter line the platform's wheels are built for, e.g. '3.12'."
    )

    @model_validator(mode="after")
    def _no_torch_fl_settings(self) -> Environment:
        # FLAGOS_* variables select the platform and decide gating and routing (FLAGOS_ALLOW_UNVALIDATED,
        # FLAGOS_ROUTE_*, ...): a descriptor setting them would enable its own unvalidated kernels.
        issues = [
            Issue(
                f"{short(key)} is a torch-fl setting, the user's to choose (FLAGOS_* variables decide selection, "
                "gating and routing); a descriptor sets only its vendor stack's variables",
                ("environment", "variables", key),
            )
            for key in self.variables
            if key.startswith(TORCH_FL_PREFIX)
        ]
        for key, value in self.variables.items():
            where = ("environment", "variables", key)
            if key.startswith(TORCH_FL_PREFIX):
                continue  # said above
            if not _VARIABLE_NAME.fullmatch(key):
                issues.append(Issue(f"{short(key)} is not a variable name (letters, digits and _)", where))
            elif key in PROGRAM_VARIABLES or key.startswith(PROGRAM_PREFIXES) or key.endswith(PROGRAM_SUFFIXES):
                issues.append(
                    Issue(
                        f"{key} chooses which program or library runs (toolchain, loader or interpreter); "
                        "a descriptor sets only its vendor stack's own variables",
                        where,
                    )
                )
            elif not key.startswith(VENDOR_VARIABLE_PREFIXES):
                issues.append(
                    Issue(
                        f"{key} is not a vendor runtime knob: a descriptor sets only variables whose prefix names a "
                        "vendor runtime (CUDA_, NCCL_, ASCEND_, HCCL_, MUSA_, XPU_, HIP_, GEMS_, OMP_, ...; "
                        "`torch-fl schema` lists them)",
                        where,
                    )
                )
            elif any(c in value for c in "\0\n\r"):
                issues.append(Issue("a value may not hold NUL or line breaks", where))
        if issues:
            raise DescriptorError(issues)
        return self


class DimLimit(_Model):
    """Where a kernel may run along one named extent (torch_fl.platform.extents), inclusive."""

    min: int | None = Field(None, ge=0, description="Smallest extent the kernel serves.")
    max: int | None = Field(None, ge=0, description="Largest extent the kernel serves.")

    @model_validator(mode="after")
    def _a_limit(self) -> DimLimit:
        if self.min is None and self.max is None:
            raise ValueError("a limit needs min, max or both")
        if self.min is not None and self.max is not None and self.min > self.max:
            raise ValueError(f"min {self.min} is above max {self.max}")
        return self


class _GatedKernels(_Model):
    constraints: dict[OpName, dict[str, DimLimit]] = Field(
        default_factory=dict,
        description="aten overload -> named extent (numel, rank, last; M, K, N for matmuls; seq, kv_seq, head_dim "
        "for attention) -> limits. Calls outside go to the next candidate; conformance proves the kernel inside "
        "and tries both sides of each limit, and failures outside do not refuse it.",
        json_schema_extra=_OP_KEYS_ONLY,
    )

    @field_validator("constraints")
    @classmethod
    def _known_dims(cls, value: dict[str, dict[str, DimLimit]]) -> dict[str, dict[str, DimLimit]]:
        from torch_fl.platform.extents import dims_of

        for op, limits in value.items():
            unknown = sorted(set(limits) - set(dims_of(op)))
            if unknown:
                raise ValueError(f"{op}: unknown extent(s) {unknown}; {op} is measured by {list(dims_of(op))}")
        return value


class NativeKernels(_Model):
    enabled: bool = Field(True, description="Run the backing device's own aten kernels on zero-copy aliases.")


class FlagGemsKernels(_GatedKernels):
    package: NonEmpty = Field("flag_gems", description="Import and distribution name of FlagGems.")
    version: NonEmpty = Field(description="The exact FlagGems version the routes are checked against.")
    vendor: NonEmpty = Field(description="FlagGems backend name (GEMS_VENDOR), e.g. nvidia.")
    enabled: bool = True


class PackagePin(_Model):
    name: NonEmpty
    version: NonEmpty


class VendorKernels(_GatedKernels):
    module: Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9_./-]+\.py$")] = Field(
        description="A file `name.py` inside the descriptor's folder, reached without links and not under records/ "
        "or __pycache__/ (what runs is what the record hashes); never an importable module name, which would "
        "import code from wherever the import path points."
    )
    package: PackagePin | None = Field(
        None, description="The distribution that provides the module, when it is installed separately."
    )
    ops: dict[OpName, Identifier] = Field(
        default_factory=dict,
        description="aten overload -> function name in the module.",
        json_schema_extra=_OP_KEYS_ONLY,
    )

    @field_validator("module")
    @classmethod
    def _stays_inside(cls, value: str) -> str:
        parts = Path(value).parts
        if value.endswith(".py") and (value.startswith("/") or ".." in parts):
            raise ValueError("a module file must lie inside the platform folder")
        if parts[:1] == (RECORDS_DIR,) or "__pycache__" in parts:
            raise ValueError(
                "records/ and __pycache__/ are not hashed into the record: a vendor module must be a file the record binds"
            )
        return value


class EmulatedKernels(_GatedKernels):
    fp8: bool = Field(False, description="FP8 by scaled upcast on chips without FP8 hardware.")


class Kernels(_Model):
    """The kernel sets this platform provides (cpu is implicit and always available)."""

    native: NativeKernels = Field(default_factory=NativeKernels)
    flaggems: FlagGemsKernels | None = None
    vendor: VendorKernels | None = None
    emulated: EmulatedKernels | None = None

    def declared(self) -> tuple[str, ...]:
        """Kernel set names routes may use, in the canonical order (cpu always last)."""
        optional = {"flaggems": self.flaggems, "vendor": self.vendor, "emulated": self.emulated}
        return tuple(name for name in KERNEL_SETS if optional.get(name, True) is not None)

    def constraints(self, path: str) -> dict[str, dict[str, DimLimit]]:
        """The declared constraints of kernel set `path` (none for native and cpu)."""
        kernels = {"flaggems": self.flaggems, "vendor": self.vendor, "emulated": self.emulated}.get(path)
        return kernels.constraints if kernels is not None else {}


class Rng(_Model):
    generator: NonEmpty = Field(
        "backing", description="'backing' (the backing device's generator), 'none', or a vendor generator name."
    )


class Distributed(_Model):
    backend: DistributedBackend = "none"
    library: str | None = Field(None, description="The collective library underneath the backend.")
    features: list[DistributedFeature] = Field(default_factory=list)


class Compile(_Model):
    path: CompilePath = "none"


class Profiler(_Model):
    tracer: ProfilerTracer = "none"


class Sharing(_Model):
    mechanism: SharingMechanism = Field(
        "none",
        description="How flagos tensors reach other processes (torch.multiprocessing, DataLoader workers): "
        "shared_memory on a host backing, cuda_ipc on a CUDA one, none where they cannot.",
    )


class Capabilities(_Model):
    """What the platform claims; conformance checks each claim on the board."""

    dtypes: list[DType] = Field(min_length=1, description="torch dtype names the platform computes in.")
    amp_dtypes: list[AmpDType] = Field(default_factory=list, description="Autocast dtypes; each must be in dtypes.")
    rng: Rng = Field(default_factory=Rng)
    distributed: Distributed = Field(default_factory=Distributed)
    compile: Compile = Field(default_factory=Compile)
    profiler: Profiler = Field(default_factory=Profiler)
    sharing: Sharing = Field(default_factory=Sharing)
    features: list[DeviceFeature] = Field(
        default_factory=list,
        description="PyTorch features served on the device: fused_attention (SDPA through the backing's fused "
        "kernels), flex_attention (eager), flex_attention_compiled (under torch.compile), sparse (COO and "
        "compressed layouts on the backing's sparse kernels).",
    )

    @model_validator(mode="after")
    def _amp_in_dtypes(self) -> Capabilities:
        for i, dtype in enumerate(self.amp_dtypes):
            if dtype not in self.dtypes:
                raise DescriptorError(
                    [Issue(f"{dtype!r} is not in capabilities.dtypes", ("capabilities", "amp_dtypes", i))]
                )
        return self


class Routes(_Model):
    """Where the route table lives and the candidate order for ops it does not list."""

    file: NonEmpty = Field("routes.yaml", description="Route table, relative to the descriptor's folder.")
    defaults: list[KernelSetName] = Field(
        default_factory=lambda: list[KernelSetName](["native", "cpu"]),
        min_length=1,
        description="Candidate kernel sets, in order, for ops the route table gives no order (no entry, no default).",
    )
    overrides: dict[OpName, list[KernelSetName]] = Field(
        default_factory=dict,
        description="aten overload -> candidate kernel sets, in order.",
        json_schema_extra=_OP_KEYS_ONLY,
    )


class Ci(_Model):
    runner_labels: list[NonEmpty] = Field(min_length=1, description="Labels of the CI runner that has the board.")
    setup: list[str] = Field(default_factory=list, description="Shell lines run before the conformance run.")
    timeout_minutes: int = Field(60, ge=1)
    conformance_args: str | None = Field(None, description="Extra arguments for `torch-fl conformance run`.")


class Requirements(_Model):
    python: VersionSpec | None = None
    torch: VersionSpec = Field(description="Supported torch versions, e.g. '>=2.11'.")
    packages: dict[NonEmpty, VersionSpec] = Field(
        default_factory=dict, description="Distribution name -> version specifier."
    )


class PlatformDescriptor(_Model):
    """One platform: identity, backing device, detection, environment, kernels, capabilities, routes, CI."""

    model_config = ConfigDict(title="torch-fl platform descriptor")

    schema_version: Literal[1] = Field(description="Version of this descriptor format.")
    name: Annotated[str, StringConstraints(pattern=NAME_PATTERN)] = Field(
        description="Must equal the platform's folder name."
    )
    display_name: NonEmpty
    vendor: NonEmpty
    boards: list[NonEmpty] = Field(min_length=1, description="Shipping boards served by this descriptor.")
    status: Literal["validated", "unvalidated"] = Field(
        description="What the descriptor claims; the conformance record decides what actually loads."
    )
    backing: Backing
    detect: Detect
    environment: Environment = Field(default_factory=Environment)
    kernels: Kernels = Field(default_factory=Kernels)
    capabilities: Capabilities
    routes: Routes = Field(default_factory=Routes)
    ci: Ci
    requirements: Requirements
    notes: str | None = None
    sources: list[str] = Field(default_factory=list, description="Where the facts in this descriptor come from.")

    _source: Path | None = PrivateAttr(None)

    @model_validator(mode="after")
    def _routes_use_declared_sets(self) -> PlatformDescriptor:
        declared = self.kernels.declared()
        issues = []
        places: list[tuple[tuple[str | int, ...], str]] = [
            (("routes", "defaults", i), s) for i, s in enumerate(self.routes.defaults)
        ]
        for op, sets in self.routes.overrides.items():
            places += [(("routes", "overrides", op, i), s) for i, s in enumerate(sets)]
        for loc, kernel_set in places:
            if kernel_set not in declared:
                issues.append(Issue(f"unknown kernel set {kernel_set!r}: declared are {', '.join(declared)}", loc))
        if issues:
            raise DescriptorError(issues)
        return self

    @property
    def source_path(self) -> Path | None:
        """The platform.yaml this model was loaded from (None when built in code)."""
        return self._source

    @property
    def directory(self) -> Path | None:
        """The platform's folder, where routes, records and vendor modules live."""
        return self._source.parent if self._source is not None else None

    def op_names(self) -> list[tuple[tuple[str, ...], str]]:
        """Every aten op the descriptor names, with the field path that names it."""
        found: list[tuple[tuple[str, ...], str]] = [(("routes", "overrides", op), op) for op in self.routes.overrides]
        if self.kernels.vendor is not None:
            found += [(("kernels", "vendor", "ops", op), op) for op in self.kernels.vendor.ops]
        return found
