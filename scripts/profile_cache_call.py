"""Where the cache call's host time goes, eager, as a decode loop makes it: cProfile over
repeated calls, the top functions by own time and by cumulative time, and the host time per
call (perf_counter, median of the profiled-free calls) beside torch SDPA's on the same inputs.

    python scripts/profile_cache_call.py [--mode fixed|growing|generate] [--calls N]

fixed: B1 H32 KV8 D128 bf16, a 4k cache whose lengths are on the GPU, the caller's output (as
`wavefront bench-decode` calls it). growing: the same, the cache one key longer at every call,
made by torch.cat as transformers' DynamicCache makes it (a new shape every step). generate:
the generate experiment's model, one DynamicCache generate call under the profiler.
"""
import cProfile
import io
import pstats
import statistics
import time

import click


def _inputs(context: int, torch):
    g = torch.Generator(device="cuda").manual_seed(0)
    q = torch.randn(1, 1, 32, 128, generator=g, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(1, context, 8, 128, generator=g, device="cuda", dtype=torch.bfloat16)
    v = torch.randn(1, context, 8, 128, generator=g, device="cuda", dtype=torch.bfloat16)
    return q, k, v


def _host_us(fn, calls: int, torch) -> float:
    times = []
    for i in range(calls):
        began = time.perf_counter()
        fn(i)
        times.append((time.perf_counter() - began) * 1e6)
        if i % 16 == 15:
            torch.cuda.synchronize()  # the queue never fills: host time, not back-pressure
    return statistics.median(times)


def _report(profile, top: int) -> None:
    for key in ("tottime", "cumulative"):
        stream = io.StringIO()
        pstats.Stats(profile, stream=stream).sort_stats(key).print_stats(top)
        print(f"--- by {key}")
        print("\n".join(stream.getvalue().splitlines()[6:]))


@click.command()
@click.option("--mode", type=click.Choice(["fixed", "growing", "generate"]), default="fixed")
@click.option("--calls", type=int, default=400, show_default=True)
@click.option("--top", type=int, default=30, show_default=True)
def main(mode, calls, top):
    import torch
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.nn.functional import scaled_dot_product_attention as sdpa

    import wavefront
    if mode == "generate":
        import experiments.generate as gen
        models = gen._models()
        ids = torch.randint(0, gen.MODEL["vocab_size"], (gen.BATCH, gen.PROMPT), device="cuda")
        for path, model in models.items():
            gen._generate(model, ids, "dynamic")  # warm-up: compiles
            torch.cuda.synchronize()
            profile = cProfile.Profile()
            began = time.perf_counter()
            profile.enable()
            gen._generate(model, ids, "dynamic")
            torch.cuda.synchronize()
            profile.disable()
            print(f"=== generate {path}: {time.perf_counter() - began:.3f} s (profiled)")
            _report(profile, top)
        return
    base = 4096
    q, k, v = _inputs(base, torch)
    lengths = torch.full((1,), base, dtype=torch.int32, device="cuda")
    out = torch.empty_like(q)
    # DynamicCache keeps (B, H_kv, L, D) and concatenates each step's key; a layer hands the
    # attention function that, and the cache call sees its (B, L, H_kv, D) transpose
    grown = {"k": k.transpose(1, 2).contiguous(), "v": v.transpose(1, 2).contiguous()}
    step_k = torch.randn(1, 8, 1, 128, device="cuda", dtype=torch.bfloat16)

    def cache(i):
        if mode == "fixed":
            return k, v, lengths
        if grown["k"].shape[2] > base + 2 * calls:
            grown["k"], grown["v"] = (x[:, :, :base] for x in (grown["k"], grown["v"]))
        grown["k"] = torch.cat([grown["k"], step_k], dim=2)
        grown["v"] = torch.cat([grown["v"], step_k], dim=2)
        length = grown["k"].shape[2]
        return (grown["k"].transpose(1, 2), grown["v"].transpose(1, 2),
                torch.full((1,), length, dtype=torch.int32, device="cuda"))

    def ours(i):
        kk, vv, ll = cache(i)
        return wavefront.attention_with_kvcache(q, kk, vv, ll, out=out)

    def theirs(i):
        kk, vv, _ = cache(i)
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            return sdpa(q.transpose(1, 2), kk.transpose(1, 2), vv.transpose(1, 2),
                        enable_gqa=True)

    for fn in (ours, theirs):
        for i in range(20):
            fn(i)
    torch.cuda.synchronize()
    rows = {name: _host_us(fn, calls, torch) for name, fn in (("wavefront", ours),
                                                              ("SDPA cudnn", theirs))}
    profile = cProfile.Profile()
    profile.enable()
    for i in range(calls):
        ours(i)
    torch.cuda.synchronize()
    profile.disable()
    _report(profile, top)
    print(f"=== {mode}: host us per call (median of {calls}): "
          + ", ".join(f"{n} {us:.1f}" for n, us in rows.items()))


if __name__ == "__main__":
    main()
