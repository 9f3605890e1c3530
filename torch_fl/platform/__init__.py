"""The platform layer: descriptors, discovery, selection, conformance records and gating.

Everything here is plain data and files: it never imports torch (except `validate_op_names`,
which the runtime calls once torch is loaded) nor the C++ runtime.
"""

from torch_fl.platform.descriptor import KERNEL_SETS, RUNTIME_BACKINGS, PlatformDescriptor
from torch_fl.platform.detection import Detection, RuleResult, detect, evaluate_rule
from torch_fl.platform.discovery import PlatformSource, discover, load_all, load_platform, shipped_root
from torch_fl.platform.errors import DescriptorError, PlatformError, RecordError, SelectionError
from torch_fl.platform.gating import Gate
from torch_fl.platform.loader import load_descriptor, validate_op_names
from torch_fl.platform.matrix import matrix_markdown, matrix_row
from torch_fl.platform.preflight import Check, PreflightReport, preflight
from torch_fl.platform.record import (
    Case,
    Record,
    RecordStatus,
    current_status,
    descriptor_hash,
    installed_kernel_versions,
    load_record,
    record_path,
    record_status,
)
from torch_fl.platform.schema import descriptor_json_schema, write_schema
from torch_fl.platform.selection import Selection, select_platform

__all__ = [
    "KERNEL_SETS",
    "RUNTIME_BACKINGS",
    "PlatformDescriptor",
    "Detection",
    "RuleResult",
    "detect",
    "evaluate_rule",
    "PlatformSource",
    "discover",
    "load_all",
    "load_platform",
    "shipped_root",
    "DescriptorError",
    "PlatformError",
    "RecordError",
    "SelectionError",
    "Gate",
    "load_descriptor",
    "validate_op_names",
    "matrix_markdown",
    "matrix_row",
    "Check",
    "PreflightReport",
    "preflight",
    "Case",
    "Record",
    "RecordStatus",
    "current_status",
    "descriptor_hash",
    "installed_kernel_versions",
    "load_record",
    "record_path",
    "record_status",
    "descriptor_json_schema",
    "write_schema",
    "Selection",
    "select_platform",
]
