"""The prepared launch with the kernel's parameter block handed over whole against one pointer
per parameter, on one launcher, in one process (GPU host): host us per launch.

    python scripts/param_block.py [--rounds 25] [--shape 1,8,1024,64]

The public call's launcher at the shape (torch tensors, the mask off, then on) is prepared,
then batches of 200 `PreparedLaunch.launch` calls alternate between the two forms in random
order; the outputs of one launch of each form, poisoned with NaN first, must be equal bit for
bit. Median [20%, 80%] of the rounds, and the paired difference.
"""
import argparse
import random
import statistics
import time

import torch

import wavefront
from wavefront.kernel import launcher as L


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=25)
    parser.add_argument("--shape", default="1,8,1024,64")
    args = parser.parse_args()
    b, h, s, d = map(int, args.shape.split(","))
    for causal in (False, True):
        q, k, v = (torch.randn(b, h, s, d, device="cuda", dtype=torch.bfloat16)
                   for _ in range(3))
        for _ in range(L.PREPARE_AFTER_LAUNCHES + 2):
            wavefront.attention(q, k, v, causal=causal)
        torch.cuda.synchronize()
        launcher = next(x for x in L._plain_launchers.values()
                        if x.launch.problem.causal == causal)
        prepared = launcher._prepared
        raw = torch._C._cuda_getCurrentRawStream(0)
        outs = {}
        for packed in (True, False):
            prepared.packed = packed
            out = torch.full_like(q, float("nan"))
            assert prepared.launch(raw, launcher._addresses(q, k, v, out,
                                                            launcher._lse_argument))
            torch.cuda.synchronize()
            outs[packed] = out
        assert torch.equal(outs[True].view(torch.int16), outs[False].view(torch.int16))
        assert not outs[True].isnan().any()
        addresses = launcher._addresses(q, k, v, outs[True], launcher._lse_argument)
        times = {True: [], False: []}
        for _ in range(args.rounds):
            for packed in random.sample([True, False], 2):
                prepared.packed = packed
                began = time.perf_counter()
                for _ in range(200):
                    prepared.launch(raw, addresses)
                times[packed].append((time.perf_counter() - began) / 200 * 1e6)
                torch.cuda.synchronize()
        prepared.packed = True
        diff = sorted(a - b for a, b in zip(times[True], times[False]))
        n = len(diff)
        print(f"{torch.cuda.get_device_name()} {args.shape} causal={causal}: host us per "
              f"prepared launch, median [20%, 80%] of {n} rounds of 200")
        for packed in (False, True):
            t = sorted(times[packed])
            print(f"  {'parameter block' if packed else 'pointer per parameter':24s}"
                  f"{statistics.median(t):6.2f} [{t[n // 5]:.2f}, {t[-1 - n // 5]:.2f}]")
        print(f"  {'block minus pointers':24s}{statistics.median(diff):+6.2f} "
              f"[{diff[n // 5]:+.2f}, {diff[-1 - n // 5]:+.2f}] (paired)")


if __name__ == "__main__":
    main()
