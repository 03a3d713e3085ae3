"""What `ct.launch` costs the host, by the kind and number of a kernel's arguments (GPU host).

The public call's launch takes about 12 us of host time on the H100 hosts, half of the whole
call (data/public_call/4448846/). This times launches of trivial kernels that differ only in
their parameters (arrays, run-time scalars, compile-time constants) and the attention kernel's
own launch with its arguments given in different forms, to see what a launch pays per argument.
Median of batches of 200 launches, host time (the GPU runs nothing of note).

    python scripts/launch_cost.py
"""
import statistics
import time

import cuda.tile as ct
import torch

ConstInt = ct.Constant[int]


def _touch(A):
    tile = ct.load(A, index=(0,), shape=(16,))
    ct.store(A, index=(0,), tile=tile)


@ct.kernel
def one_array(A):
    _touch(A)


@ct.kernel
def eleven_arrays(A, B, C, D, E, F, G, H, I, J, K):
    _touch(A)


@ct.kernel
def one_array_three_scalars(A, x: float, n: int, m: int):
    _touch(A)


@ct.kernel
def one_array_fifteen_constants(A, c1: ConstInt, c2: ConstInt, c3: ConstInt, c4: ConstInt,
                                c5: ConstInt, c6: ConstInt, c7: ConstInt, c8: ConstInt,
                                c9: ConstInt, c10: ConstInt, c11: ConstInt, c12: ConstInt,
                                c13: ConstInt, c14: ConstInt, c15: ConstInt):
    _touch(A)


def batches_us(fn, n=200, batches=15) -> list:
    """Host us per call of `fn`, one number per batch of `n` calls, sorted."""
    out = []
    for _ in range(batches):
        began = time.perf_counter()
        for _ in range(n):
            fn()
        out.append((time.perf_counter() - began) / n * 1e6)
        torch.cuda.synchronize()
    return sorted(out)


def per_call_us(fn, n=200, batches=9) -> float:
    """The median of `batches_us`."""
    return statistics.median(batches_us(fn, n, batches))


def spread_us(fn) -> tuple:
    """(median, 20%, 80%) of `batches_us`."""
    out = batches_us(fn)
    return statistics.median(out), out[len(out) // 5], out[-1 - len(out) // 5]


class Described:
    """An array as a CUDA Array Interface dict made once (what the launcher does for its own
    buffers)."""

    def __init__(self, array):
        self.__cuda_array_interface__ = dict(array.__cuda_array_interface__)
        self.owner = array


def main():
    print(torch.cuda.get_device_name(), "host us per ct.launch, median [20%, 80%]")
    stream = torch.cuda.current_stream().cuda_stream
    arrays = [torch.zeros(16, device="cuda") for _ in range(11)]
    described = [Described(a) for a in arrays]
    cases = {
        "1 array (torch)": (one_array, (arrays[0],)),
        "1 array (CUDA array interface)": (one_array, (described[0],)),
        "11 arrays (torch)": (eleven_arrays, tuple(arrays)),
        "11 arrays (CUDA array interface)": (eleven_arrays, tuple(described)),
        "1 array + 3 scalars": (one_array_three_scalars, (arrays[0], 1.5, 3, 4)),
        "1 array + 15 constants": (one_array_fifteen_constants, (arrays[0], *range(1, 16))),
    }
    for name, (kernel, args) in cases.items():
        ct.launch(stream, (1,), kernel, args)  # compiled
        torch.cuda.synchronize()
        median, low, high = spread_us(lambda: ct.launch(stream, (1,), kernel, args))
        print(f"{name:40s} {median:6.2f} [{low:.2f}, {high:.2f}]")

    # The attention kernel's own launch, B1 H8 S1k D64 (the public call's).
    import wavefront
    from wavefront.kernel import launcher as L
    q = torch.randn(1, 8, 1024, 64, device="cuda", dtype=torch.bfloat16)
    k, v = torch.randn_like(q), torch.randn_like(q)
    wavefront.attention(q, k, v)
    launcher = next(iter(L._launchers.values()))
    out = torch.empty_like(q)
    per_call = (q, k, v, out, launcher._lse_argument)
    rows = {
        "attention: as the launcher launches": per_call + launcher._bound_args,
        "attention: q, k, v, out described": tuple(Described(x) for x in (q, k, v, out))
        + (launcher._lse_argument,) + launcher._bound_args,
    }
    for name, args in rows.items():
        ct.launch(stream, launcher.grid, launcher.kernel, args)
        torch.cuda.synchronize()
        median, low, high = spread_us(
            lambda: ct.launch(stream, launcher.grid, launcher.kernel, args))
        print(f"{name:40s} {median:6.2f} [{low:.2f}, {high:.2f}]")
    kinds = {}
    for value in launcher._bound_args:
        kinds[type(value).__name__] = kinds.get(type(value).__name__, 0) + 1
    print("the attention launch's bound arguments by type:", kinds)


if __name__ == "__main__":
    main()
