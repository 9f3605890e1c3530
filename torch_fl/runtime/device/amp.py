"""Autocast support: the dtypes torch.autocast("flagos") accepts."""

from __future__ import annotations

import torch

_amp_dtypes: list[torch.dtype] = [torch.bfloat16, torch.float16]


def set_amp_dtypes(dtypes: list[torch.dtype]) -> None:
    _amp_dtypes[:] = dtypes


def get_amp_supported_dtype() -> list[torch.dtype]:
    return list(_amp_dtypes)


def is_bf16_supported(including_emulation: bool = True) -> bool:
    return torch.bfloat16 in _amp_dtypes
