"""The schedule formulas' array operations on torch tensors (`schedules.NumpyArrays`' methods),
registered with the vocabulary on import: a packed batch whose cu_seqlens are on the GPU gets
its work table written there, from them (`schedules.DeviceVarlenLaunch`). Nothing here reads a
value back to the host, so a table written with these is asynchronous and a CUDA graph can
capture it."""
from __future__ import annotations

import torch

from wavefront.schedules import register_array_library


class TorchArrays:
    """`NumpyArrays` for torch tensors, on their device."""

    @staticmethod
    def minimum(a, b):
        if not isinstance(a, torch.Tensor):
            a, b = b, a
        # A bound that is a plain int stays one: a tensor made of it would be copied from the
        # host, which a CUDA graph cannot capture.
        return torch.minimum(a, b) if isinstance(b, torch.Tensor) else torch.clamp(a, max=b)

    @staticmethod
    def maximum(a, b):
        if not isinstance(a, torch.Tensor):
            a, b = b, a
        return torch.maximum(a, b) if isinstance(b, torch.Tensor) else torch.clamp(a, min=b)

    @staticmethod
    def where(condition, a, b):
        return torch.where(condition.bool(), a, b)

    @staticmethod
    def divmod(a, b):
        return a // b, a % b

    @staticmethod
    def cumsum(x):
        return torch.cumsum(x, 0)

    @staticmethod
    def arange(n: int, like):
        return torch.arange(n, dtype=torch.int64, device=like.device)

    @staticmethod
    def int64(x):
        return x.to(torch.int64)

    @staticmethod
    def searchsorted_right(sorted_values, values):
        return torch.searchsorted(sorted_values, values, right=True)

    @staticmethod
    def argsort_stable(keys):
        return torch.argsort(keys, stable=True)


register_array_library("torch", TorchArrays)
