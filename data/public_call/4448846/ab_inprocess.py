"""In-process A/B of the public call's hot path: the old launcher module (519b952, loaded
from gpu_old/ under another name, its own cache and launcher class) against today's, batches
interleaved in random order; the bound launch on the same tensors as the reference."""
import importlib.util, random, statistics, sys, time
import torch
from wavefront.kernel import launcher as new
from wavefront.point import LEVERS

spec = importlib.util.spec_from_file_location("old_launcher", "gpu_old/wavefront/kernel/launcher.py")
old = importlib.util.module_from_spec(spec); sys.modules["old_launcher"] = old
spec.loader.exec_module(old)
NO = (None,) * len(LEVERS)
q = torch.randn(1, 8, 1024, 64, device="cuda", dtype=torch.bfloat16)
k, v = torch.randn_like(q), torch.randn_like(q)
out = torch.empty_like(q)
raw = torch._C._cuda_getCurrentRawStream(0)
for m in (old, new):
    m.attention_positional(q, k, v, False, None, None, None, None, False, None, None, None, None, None, *NO)
bound = next(iter(new._launchers.values()))
shape = bound.view.shape
fast_out = bound.new_output
variants = {
    "old (519b952)": lambda: old.attention_positional(q, k, v, False, None, None, None, None, False, None, None, None, None, None, *NO),
    "new": lambda: new.attention_positional(q, k, v, False, None, None, None, None, False, None, None, None, None, None, *NO),
    "new, new_empty out": "toggle",
    "bound launch (torch, same out)": lambda: bound(q, k, v, out, raw),
}
variants["new, new_empty out"] = variants["new"]
samples = {name: [] for name in variants}
torch.cuda.synchronize()
for r in range(25):
    order = list(variants); random.shuffle(order)
    for name in order:
        bound.new_output = (lambda q: q.new_empty(shape)) if name == "new, new_empty out" else fast_out
        fn = variants[name]
        t = time.perf_counter()
        for _ in range(200):
            fn()
        samples[name].append((time.perf_counter() - t) / 200 * 1e6)
        torch.cuda.synchronize()
ref = samples["old (519b952)"]
for name, s in samples.items():
    d = sorted(a - b for a, b in zip(s, ref))
    print(f"{name:32s} median {statistics.median(s):6.2f} us  [{sorted(s)[5]:.2f}, {sorted(s)[19]:.2f}]"
          f"  minus old, paired: {statistics.median(d):+6.2f} [{d[5]:+.2f}, {d[19]:+.2f}]")
