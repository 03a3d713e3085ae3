"""Decode batches whose sequences share a prefix, on the GPU: the paged cache built from a
`model.page_replay.SharedPrefixBatch`, the CTA orders of `wavefront.attention_with_kvcache`
timed in paired interleaved rounds, and their DRAM bytes under Nsight Compute.

The cache call is handed in (`call`: `wavefront.attention_with_kvcache`, which the measure
layer may not import: the experiment passes it). `run_worker` is the ncu worker that
`profile_orders` runs through the experiment's own program: every order of every batch
launched once per repeat under its own NVTX range (`wf:<n>`) between cudaProfilerStart/Stop,
after a warm-up with the profiler off, so only the measured launches' kernels are counted (all
of them: the decode kernel and any combine).
"""
from __future__ import annotations

import json
import os
import tempfile

from wavefront.measure.profiling import COLD_REPLAY, RESULT_MARK, ProfilerError, tag_for
from wavefront.model.page_replay import CTA_ORDERS, SharedPrefixBatch

SPLITS = 1  # one split: every item a whole sequence, as the replay assumes
CORRECTNESS_TOLERANCE = 2e-2


def make_inputs(spec: SharedPrefixBatch, seed: int = 0, device: str = "cuda"):
    """(q (B, 1, H, D), k_pool, v_pool (num_pages, page_size, H_kv, D), block_table int32,
    cache_seqlens int32): bfloat16 standard normal values, on `device`."""
    import torch
    g = torch.Generator(device=device).manual_seed(seed)
    dtype = torch.bfloat16
    q = torch.randn(spec.batch, 1, spec.heads, spec.head_dim, generator=g, device=device,
                    dtype=dtype)
    pool = (spec.num_pages, spec.page_size, spec.kv_heads, spec.head_dim)
    k = torch.randn(pool, generator=g, device=device, dtype=dtype)
    v = torch.randn(pool, generator=g, device=device, dtype=dtype)
    table = torch.from_numpy(spec.block_table()).to(device)
    seqlens = torch.from_numpy(spec.cache_seqlens()).to(device)
    return q, k, v, table, seqlens


def reference_rows(spec: SharedPrefixBatch, q, k, v, rows=(0, 1)):
    """The float32 attention of sequences `rows` over their gathered pages: (len(rows), 1, H,
    D)."""
    import torch
    table = spec.block_table()
    out = []
    group = spec.heads // spec.kv_heads
    for b in rows:
        pages = torch.as_tensor(table[b], device=k.device, dtype=torch.long)
        keys = k[pages].reshape(-1, spec.kv_heads, spec.head_dim)[:spec.context].float()
        values = v[pages].reshape(-1, spec.kv_heads, spec.head_dim)[:spec.context].float()
        keys = keys.repeat_interleave(group, dim=1).transpose(0, 1)  # (H, L, D)
        values = values.repeat_interleave(group, dim=1).transpose(0, 1)
        query = q[b, 0].float()[:, None, :]  # (H, 1, D)
        scores = query @ keys.transpose(1, 2) / spec.head_dim ** 0.5
        out.append((scores.softmax(-1) @ values).transpose(0, 1))  # (1, H, D)
    return torch.stack(out)


def decode_call(spec: SharedPrefixBatch, inputs, order: str, out, call):
    """run(): one decode launch of `order` into `out` through `call`."""
    q, k, v, table, seqlens = inputs

    def run():
        call(q, k, v, seqlens, block_table=table, causal=True, num_splits=SPLITS,
             cta_order=order, out=out)
    return run


def check_order(spec: SharedPrefixBatch, inputs, order: str, call) -> float:
    """Relative error of `order`'s output (into a NaN-poisoned tensor) against the float32
    reference on two sequences of different groups; inf where an element is left unwritten."""
    import torch
    q = inputs[0]
    out = torch.full_like(q, float("nan"))
    decode_call(spec, inputs, order, out, call)()
    if out.is_cuda:
        torch.cuda.synchronize()
    if not bool(torch.isfinite(out).all()):
        return float("inf")
    rows = (0, 1) if spec.batch > 1 else (0,)
    ref = reference_rows(spec, *inputs[:3], rows=rows)
    got = out[list(rows)].float()
    return float((got - ref).norm() / ref.norm())


def time_orders(spec: SharedPrefixBatch, call, *, rounds: int = 10, per_round: int = 5,
                seed: int = 0) -> list[dict]:
    """Every CTA order of `spec` timed in the same interleaved rounds (`measure.rounds`), each
    checked against the reference first (a wrong one is recorded as failed, not timed).
    -> one row per order and round: ms, the round's SM clock, throttled rounds of the order."""
    import torch

    from wavefront.device import current_device
    from wavefront.measure.rounds import Contender, run_rounds
    from wavefront.measure.timing import input_sets_needed
    dev = current_device()
    sets = [make_inputs(spec, seed + i) for i in range(
        input_sets_needed(spec.compulsory_kv_bytes(), dev.l2_bytes))]
    outs = [torch.empty_like(s[0]) for s in sets]
    rows, contenders = [], []
    for order in CTA_ORDERS:
        try:
            err = check_order(spec, sets[0], order, call)
        except Exception as exc:  # a refused order is a result, the others go on
            rows.append({"kind": "failed", "cta_order": order,
                         "error": f"{type(exc).__name__}: {exc}"[:300]})
            continue
        if not err < CORRECTNESS_TOLERANCE:
            rows.append({"kind": "failed", "cta_order": order,
                         "error": f"relative error {err:.3g} against the reference"})
            continue
        runs = [decode_call(spec, s, order, o, call) for s, o in zip(sets, outs)]
        contenders.append(Contender(order, lambda i, runs=runs: runs[i % len(runs)](),
                                    useful_flops=4.0 * spec.batch * spec.heads * spec.context
                                    * spec.head_dim))
    if len(contenders) >= 2:
        for r in run_rounds(contenders, rounds=rounds, per_round=per_round, seed=seed):
            for i, ms in enumerate(r.samples_ms):
                rows.append({"kind": "round", "cta_order": r.name, "point": r.name,
                             "round": i, "ms": ms,
                             "sm_clock_mhz": (r.sm_clock_mhz[i] if i < len(r.sm_clock_mhz)
                                              else None),
                             "throttled_rounds": r.throttled_rounds})
    return rows


def run_worker(batches: list[dict], repeats: int, call) -> None:
    """Under ncu: each order of each batch once per repeat, under its own NVTX tag."""
    import cupy
    import torch
    from cupy.cuda import nvtx
    n = 0
    for spec_dict in batches:
        spec = SharedPrefixBatch(**spec_dict)
        inputs = make_inputs(spec)
        out = torch.empty_like(inputs[0])
        usable = {}
        for order in CTA_ORDERS:  # warm-up (compiles) with the profiler off
            try:
                run = decode_call(spec, inputs, order, out, call)
                run()
                torch.cuda.synchronize()
                usable[order] = run
            except Exception as exc:
                print(RESULT_MARK + json.dumps({"batch": spec.label(), "cta_order": order,
                                                "error": f"{type(exc).__name__}: {exc}"[:200]}),
                      flush=True)
        for repeat in range(repeats):
            for order, run in usable.items():
                tag = tag_for(n)
                torch.cuda.synchronize()
                nvtx.RangePush(tag)
                cupy.cuda.runtime.profilerStart()
                run()
                torch.cuda.synchronize()
                cupy.cuda.runtime.profilerStop()
                nvtx.RangePop()
                print(RESULT_MARK + json.dumps({"tag": tag, "batch": spec.label(),
                                                "cta_order": order, "repeat": repeat}),
                      flush=True)
                n += 1


def profile_orders(batches: list[SharedPrefixBatch], worker: list[str], *, repeats: int = 2,
                   timeout_s: float = 600) -> list[dict]:
    """DRAM bytes of every order of every batch from cold-L2 kernel replay: one row per
    (batch, order, repeat) with the summed metrics of its kernels (or its error). `worker`:
    the program that runs `run_worker` with the cache call, given the batches as JSON and
    the repeats as its last two arguments."""
    from wavefront.device import find_ncu
    from wavefront.measure.exposure_profile import DRAM_METRICS, run_marked, tagged_totals
    ncu = find_ncu()
    if ncu is None:
        raise ProfilerError("Nsight Compute (ncu) not found")
    with tempfile.TemporaryDirectory() as tmp:
        program = [*worker, json.dumps([b.as_dict() for b in batches]), str(repeats)]
        marks, actions = run_marked(ncu, [*COLD_REPLAY, "--nvtx", "--metrics",
                                          ",".join(DRAM_METRICS)], program,
                                    os.path.join(tmp, "shared_prefix.ncu-rep"), timeout_s)
    rows = []
    for mark in marks:
        if "error" in mark:
            rows.append({"kind": "failed", **mark})
            continue
        rows.append({"kind": "ncu", **{k: v for k, v in mark.items() if k != "tag"},
                     **tagged_totals([a for a in actions if a["tag"] == mark["tag"]])})
    return rows
