"""Decode against a KV cache: how close to the DRAM bandwidth one step's attention runs.

One query per sequence (B, H, 1, D) against a full cache of `context` keys per sequence. The
step reads every K/V byte once (GQA packed), so its speed is K/V bytes / time, against the
read bandwidth the toolkit's microbenchmark measures (`microbench.read_bandwidth`).
Contenders, each checked against a float32 reference on sequence 0 before it is timed:
- wavefront's cache call (`wavefront.attention_with_kvcache`) on the contiguous cache (batch,
  context, kv_heads, D), lengths on the GPU as a decode loop holds them, splits from the
  shape;
- the same call on a paged copy of it (pages of `page_size`, shuffled in the pool);
- torch SDPA on the same contiguous cache, (B, H, 1, D) against (B, H_kv, S, D) views with
  `enable_gqa`, under each backend torch offers it (cuDNN, flash, memory-efficient); a backend
  that refuses the call is left out and said so.
Every contender rotates over input sets so that a set's K/V were last read at least 4x the L2
of other bytes ago (a decode step does not find its cache in L2), as `measure.rounds` does.
"""
from __future__ import annotations

import math

# Input sets are rotated until this many L2s of other K/V lie between two reads of one set.
ROTATE_L2S = 4
# The sets (contiguous and paged copies) must fit in this share of the free GPU memory.
MEMORY_SHARE = 0.8


def kv_bytes(batch: int, context: int, kv_heads: int, head_dim: int,
             element_bytes: int = 2) -> int:
    """K and V of every sequence, read once by a decode step."""
    return 2 * batch * context * kv_heads * head_dim * element_bytes


def input_sets(one_set_bytes: int, l2_bytes: int, free_bytes: int, copies: int) -> int:
    """Sets to rotate over: enough that ROTATE_L2S x L2 of other sets lie between two reads of
    one, as many as fit (`copies` arrays of one set's bytes each); 0 where not even one fits."""
    wanted = 1 + math.ceil(ROTATE_L2S * l2_bytes / one_set_bytes)
    fit = int(MEMORY_SHARE * free_bytes // (copies * one_set_bytes))
    return min(wanted, fit)


# A contender replayed from CUDA graphs (one per input set) is named so: what a serving engine
# that graphs its decode step gets, the call's host work gone.
GRAPHED = " graphed"


def launched_alike(name: str, other: str) -> bool:
    """Whether two contenders are launched the same way (both eager, or both graphed): a
    contender is compared with the fastest SDPA backend launched as it is."""
    return name.endswith(GRAPHED) == other.endswith(GRAPHED)


def decode_contenders(*, batch: int, context: int, heads: int, kv_heads: int, head_dim: int,
                      page_size: int, l2_bytes: int, seed: int = 1, graphs: bool = True,
                      variants: dict | None = None, log=print):
    """-> (Contenders of `measure.rounds`, K/V bytes one step reads, input sets, notes): every
    contender checked first. Paged is left out (and noted) where its copy does not fit. With
    `graphs`, every contender also runs as "<name> graphed": its call captured once per input
    set into a CUDA graph and replayed, checked as the eager call is (set 0's output against the
    float32 reference, after every graph's output was poisoned and replayed). `variants`:
    {name: cache-call options (num_splits, ctas_per_sm)}, each one more contiguous contender
    "wavefront contiguous <name>" (a split or occupancy sweep beside the planned launch)."""
    import torch
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.nn.functional import scaled_dot_product_attention as sdpa

    from wavefront.kernel.kvcache import attention_with_kvcache, check_kvcache_flags
    from wavefront.measure.bench import IncorrectResult
    from wavefront.measure.rounds import Contender
    from wavefront.results.measurement import CORRECTNESS_TOLERANCE
    if context % page_size:
        raise ValueError(f"context ({context}) must be a multiple of page_size ({page_size})")
    dtype = torch.bfloat16
    step_bytes = kv_bytes(batch, context, kv_heads, head_dim)
    # The shapes before this one freed their caches and graphs into torch's (and CuPy's) pools,
    # which the driver counts as taken: on an H100, B64 128k found 41.2 GB free after B64 32k
    # and failed. Give them back before asking.
    import gc

    import cupy
    gc.collect()
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    cupy.get_default_memory_pool().free_all_blocks()
    free, _ = torch.cuda.mem_get_info()
    notes = []
    paged = input_sets(step_bytes, l2_bytes, free, copies=2) >= 1
    sets = input_sets(step_bytes, l2_bytes, free, copies=2 if paged else 1)
    if sets < 1:
        raise ValueError(f"the cache ({step_bytes / 1e9:.1f} GB of K/V) does not fit in "
                         f"{MEMORY_SHARE:.0%} of the free GPU memory ({free / 1e9:.1f} GB)")
    if not paged:
        notes.append(f"paged left out: a copy of {step_bytes / 1e9:.1f} GB of K/V beside the "
                     f"contiguous cache does not fit in {free / 1e9:.1f} GB free")
    g = torch.Generator(device="cuda").manual_seed(seed)
    pages = context // page_size
    inputs = []
    for _ in range(sets):
        k_cache = torch.randn(batch, context, kv_heads, head_dim, generator=g, device="cuda",
                              dtype=dtype)
        v_cache = torch.randn(batch, context, kv_heads, head_dim, generator=g, device="cuda",
                              dtype=dtype)
        q = torch.randn(batch, 1, heads, head_dim, generator=g, device="cuda", dtype=dtype)
        entry = {"q": q, "k": k_cache, "v": v_cache}
        if paged:
            table = torch.randperm(batch * pages, generator=g, device="cuda").to(torch.int32)
            table = table.reshape(batch, pages)
            pool_k = torch.empty(batch * pages, page_size, kv_heads, head_dim, device="cuda",
                                 dtype=dtype)
            pool_v = torch.empty_like(pool_k)
            # the same logical cache, its pages scattered over the pool
            pool_k[table.long()] = k_cache.view(batch, pages, page_size, kv_heads, head_dim)
            pool_v[table.long()] = v_cache.view(batch, pages, page_size, kv_heads, head_dim)
            entry.update(pool_k=pool_k, pool_v=pool_v, table=table)
        inputs.append(entry)
    lengths = torch.full((batch,), context, dtype=torch.int32, device="cuda")
    outs = [torch.empty_like(e["q"]) for e in inputs]

    first = inputs[0]
    rep = heads // kv_heads
    ks = first["k"][0].float().transpose(0, 1).repeat_interleave(rep, 0)  # (H, S, D)
    vs = first["v"][0].float().transpose(0, 1).repeat_interleave(rep, 0)
    scores = (first["q"][0].float().transpose(0, 1) @ ks.transpose(1, 2)) / math.sqrt(head_dim)
    reference = (torch.softmax(scores, -1) @ vs).transpose(0, 1)  # (1, H, D)
    del ks, vs, scores

    def error(out):
        got = out[0].float()
        if not torch.isfinite(got).all():
            return math.inf
        return float((got - reference).norm() / reference.norm())

    runs = {}

    # the planned launch (no options), then each sweep variant
    for label, options in {"": {}, **(variants or {})}.items():
        def wavefront_contiguous(i, options=options):
            e = inputs[i % sets]
            return attention_with_kvcache(e["q"], e["k"], e["v"], lengths, out=outs[i % sets],
                                          **options)
        runs[f"wavefront contiguous {label}".rstrip()] = wavefront_contiguous
    if paged:
        def wavefront_paged(i):
            e = inputs[i % sets]
            return attention_with_kvcache(e["q"], e["pool_k"], e["pool_v"], lengths,
                                          block_table=e["table"], out=outs[i % sets])
        runs[f"wavefront paged {page_size}"] = wavefront_paged
    for label, backend in (("cudnn", SDPBackend.CUDNN_ATTENTION),
                           ("flash", SDPBackend.FLASH_ATTENTION),
                           ("efficient", SDPBackend.EFFICIENT_ATTENTION)):
        def run(i, backend=backend):
            e = inputs[i % sets]
            with sdpa_kernel(backend):
                out = sdpa(e["q"].transpose(1, 2), e["k"].transpose(1, 2),
                           e["v"].transpose(1, 2), enable_gqa=rep > 1)
            return out.transpose(1, 2)
        runs[f"SDPA {label}"] = run
    flops = 4.0 * batch * heads * context * head_dim
    # The planned launches fail the shape if they fail; a sweep variant (a split count or an
    # occupancy that does not compile, say) is left out and noted like a refusing backend.
    planned = {"wavefront contiguous", f"wavefront paged {page_size}"}
    contenders = []
    for name, run in runs.items():
        try:
            err = error(run(0))
            torch.cuda.synchronize()
        except Exception as exc:  # a backend that refuses the call is a result, not a crash
            if name in planned:
                raise
            log(f"{name}: left out ({type(exc).__name__}: {str(exc)[:160]})")
            notes.append(f"{name} left out: {type(exc).__name__}")
            continue
        if not err < CORRECTNESS_TOLERANCE:
            if name in planned:
                raise IncorrectResult(f"{name}: relative error {err:.3g}")
            log(f"{name}: left out (relative error {err:.3g})")
            notes.append(f"{name} left out: relative error {err:.3g}")
            continue
        contenders.append(Contender(name, run, flops))
    if graphs:
        for contender in list(contenders):
            try:
                replay, graphed_outs = _graphed(contender.run, sets)
                err = error(graphed_outs[0])
            except Exception as exc:  # a call that cannot be captured is a result, not a crash
                log(f"{contender.name}{GRAPHED}: left out ({type(exc).__name__}: "
                    f"{str(exc)[:160]})")
                notes.append(f"{contender.name}{GRAPHED} left out: {type(exc).__name__}")
                continue
            if not err < CORRECTNESS_TOLERANCE:
                log(f"{contender.name}{GRAPHED}: left out (relative error {err:.3g})")
                notes.append(f"{contender.name}{GRAPHED} left out: relative error {err:.3g}")
                continue
            contenders.append(Contender(contender.name + GRAPHED, replay, flops))
    check_kvcache_flags()
    return contenders, step_bytes, sets, notes


def _graphed(run, sets: int):
    """`run(i)` captured into one CUDA graph per input set -> (replay(i), the graphs' outputs,
    set 0's first, written by a replay of each graph)."""
    import torch
    graphs, outs = [], []
    for i in range(sets):  # compiled and warm before the capture
        run(i)
    torch.cuda.synchronize()
    for i in range(sets):
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            outs.append(run(i))
        graphs.append(graph)
    for i, graph in enumerate(graphs):  # outputs poisoned first: a replay must write them
        outs[i].fill_(float("nan"))
        graph.replay()
    torch.cuda.synchronize()

    def replay(i):
        graphs[i % sets].replay()
    return replay, outs


def gbps(step_bytes: int, ms: float) -> float:
    return step_bytes / (ms * 1e-3) / 1e9
