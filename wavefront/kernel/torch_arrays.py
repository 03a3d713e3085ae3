"""The schedule formulas' array operations on torch tensors (`schedules.NumpyArrays`' methods),
registered with the vocabulary on import: a packed batch whose cu_seqlens are on the GPU gets
its work table written there, from them (`schedules.DeviceVarlenLaunch`). Nothing here reads a
value back to the host, so a table written with these is asynchronous and a CUDA graph can
capture it."""
from __future__ import annotations

import functools

import torch

from wavefront.kernel.streams import cupy_stream
from wavefront.schedules import group_by_budget, register_array_library


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
    def int32(x):
        return x.to(torch.int32)

    @staticmethod
    def searchsorted_right(sorted_values, values):
        return torch.searchsorted(sorted_values, values, right=True)

    @staticmethod
    def argsort_stable(keys):
        return torch.argsort(keys, stable=True)

    @staticmethod
    def expand(counts, total: int):
        ends = torch.cumsum(counts, 0)
        slot = torch.arange(total, dtype=torch.int64, device=counts.device)
        owner = torch.clamp(torch.searchsorted(ends, slot, right=True), max=len(counts) - 1)
        return owner, slot - (ends[owner] - counts[owner])

    @staticmethod
    def scatter(size: int, index, values):
        out = torch.zeros(size + 1, dtype=torch.int64, device=values.device)
        out[index] = values
        return out[:size]

    @staticmethod
    def group_by_budget(unit_bytes, budget: float):
        """`schedules.group_by_budget`, whose greedy fill goes unit by unit: on the GPU one
        thread of `GROUP_BY_BUDGET` walks the units (sequences x K/V heads), on torch's
        current stream."""
        if not unit_bytes.is_cuda:
            return torch.from_numpy(group_by_budget(unit_bytes.numpy(), budget))
        import cupy
        unit_bytes = unit_bytes.contiguous()
        groups = torch.empty_like(unit_bytes)
        with cupy.cuda.Device(unit_bytes.device.index):
            stream = cupy_stream(torch.cuda.current_stream().cuda_stream)
            arguments = (cupy.uint64(unit_bytes.data_ptr()), cupy.uint64(groups.data_ptr()),
                         cupy.int64(unit_bytes.numel()), cupy.float64(budget))
            _group_kernel()((1,), (GROUP_THREADS,), arguments, stream=stream)
        return groups


# `schedules.group_by_budget` in CUDA: the same fill, unit by unit, in doubles as Python's. The
# fill is a chain from unit to unit, so one thread walks it; the block first stages a chunk of
# the units' sizes in shared memory, so that the walk does not wait on global memory per unit.
GROUP_THREADS = 256
GROUP_BY_BUDGET = r"""
extern "C" __global__ void group_by_budget(const long long* __restrict__ unit_bytes,
                                           long long* __restrict__ groups, long long units,
                                           double budget) {
    __shared__ double sizes[%(threads)d];
    long long group = 0;
    double filled = 0.0;
    for (long long first = 0; first < units; first += blockDim.x) {
        long long i = first + threadIdx.x;
        sizes[threadIdx.x] = i < units ? (double)unit_bytes[i] : 0.0;
        __syncthreads();
        if (threadIdx.x == 0) {
            int last = (int)min(units - first, (long long)blockDim.x);
            #pragma unroll 8
            for (int j = 0; j < last; ++j) {
                if (filled != 0.0 && filled + sizes[j] > budget) {
                    group += 1;
                    filled = 0.0;
                }
                groups[first + j] = group;
                filled += sizes[j];
            }
        }
        __syncthreads();
    }
}
""" % {"threads": GROUP_THREADS}


@functools.lru_cache(maxsize=None)
def _group_kernel():
    import cupy
    return cupy.RawKernel(GROUP_BY_BUDGET, "group_by_budget")


register_array_library("torch", TorchArrays)
