"""The public call's 64th call with cuTile's disk cache off (GPU host).

A launcher prepares its launch on its 64th launch. Until fadd9fd it exported the kernel's
binary then: cuTile's front end ran again to key its disk cache, and with the cache off
(`CUDA_TILE_CACHE_DIR=off`) the kernel was compiled again, inside that call (d2a44df then
refused to prepare with the cache off). Since fadd9fd it loads the binary the JIT compiled,
recorded as the JIT made it. Here 70 calls at B1 H8 S1k D64, each synchronised: each call's
host time, the slowest after the first (which compiles), whether the launcher prepared (or
why not) and from which binary, and the last output against float32 SDPA.

    CUDA_TILE_CACHE_DIR=off python scripts/cache_off.py [--tree DIR]

`--tree`: a directory holding another commit's `wavefront/` (`git archive C wavefront | tar -x
-C DIR`), imported instead of this tree's.
"""
import argparse
import sys
import time
from pathlib import Path

parser = argparse.ArgumentParser()
parser.add_argument("--tree", type=Path, help="import wavefront from this directory")
args = parser.parse_args()
if args.tree:
    sys.path.insert(0, str(args.tree.resolve()))

import torch  # noqa: E402

import wavefront  # noqa: E402
from wavefront.kernel import launcher as L  # noqa: E402

torch.manual_seed(0)
q, k, v = (torch.randn(1, 8, 1024, 64, device="cuda", dtype=torch.bfloat16) for _ in range(3))
ms = []
for _ in range(70):
    began = time.perf_counter()
    out = wavefront.attention(q, k, v)
    torch.cuda.synchronize()
    ms.append((time.perf_counter() - began) * 1e3)
(launcher,) = L._launchers.values()
ref = torch.nn.functional.scaled_dot_product_attention(q.float(), k.float(), v.float())
err = float((out.float() - ref).norm() / ref.norm())
slowest = max(range(1, 70), key=ms.__getitem__)
print(f"wavefront from {Path(L.__file__).parent.parent}")
print(f"call 1 {ms[0]:.0f} ms; slowest after it: call {slowest + 1}, {ms[slowest]:.1f} ms; "
      f"median {sorted(ms)[35]:.3f} ms; prepared {launcher.launches_prepared}, "
      f"binary: {getattr(launcher._prepared, 'binary_from', 'export')}, "
      f"why not: {getattr(launcher, 'prepare_failure', None)}; relative error {err:.2e}")
