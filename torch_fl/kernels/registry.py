"""Builds the execution paths a platform declares."""

from __future__ import annotations

from torch_fl.kernels.base import KernelSet
from torch_fl.kernels.cpu import CpuKernels
from torch_fl.kernels.native import NativeKernels
from torch_fl.platform import PlatformDescriptor


def build_kernel_sets(descriptor: PlatformDescriptor) -> dict[str, KernelSet]:
    """native and cpu always; flaggems, vendor and emulated when the descriptor declares them."""
    sets: dict[str, KernelSet] = {"native": NativeKernels(), "cpu": CpuKernels()}
    kernels = descriptor.kernels
    if kernels.flaggems is not None and kernels.flaggems.enabled:
        from torch_fl.kernels.flaggems import FlagGemsKernels

        sets["flaggems"] = FlagGemsKernels(kernels.flaggems)
    if kernels.vendor is not None:
        from torch_fl.kernels.vendor import VendorKernels

        sets["vendor"] = VendorKernels(descriptor)
    if kernels.emulated is not None:
        from torch_fl.kernels.emulated import EmulatedKernels

        sets["emulated"] = EmulatedKernels(kernels.emulated)
    return sets
