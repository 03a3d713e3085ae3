"""A packed batch of sequences of different lengths, timed against what torch offers for it.

Contenders, each checked against the float32 reference before it is timed:
- wavefront's varlen call, per schedule (the public call, torch tensors, host cu_seqlens),
  and with its cu_seqlens on the GPU (its table written there on every call);
- torch's own varlen attention (`torch.nn.attention.varlen.varlen_attn`, FlashAttention-2),
  where this torch has it;
- SDPA on a nested (jagged) tensor with the cuDNN and the flash backend, where they take it;
- cuDNN over the batch padded to its longest sequence (what a caller without varlen does).
A contender this torch lacks or that refuses the batch is left out and said so.
"""
from __future__ import annotations

import math
from itertools import accumulate


def long_tailed_lengths(n: int, total: int, seed: int = 0, longest: int = 32768) -> list[int]:
    """`n` lengths summing to `total`, drawn log-normal (a few long sequences, many short:
    a packed prefill batch), each at least 1 and at most `longest`."""
    import numpy as np
    rng = np.random.default_rng(seed)
    raw = rng.lognormal(mean=0.0, sigma=1.2, size=n)
    lengths = np.maximum(1, np.minimum(longest, np.floor(raw / raw.sum() * total))).astype(int)
    lengths[np.argmin(lengths)] += total - int(lengths.sum())  # exact total, kept >= 1
    if lengths.min() < 1 or lengths.max() > longest:
        raise ValueError(f"cannot draw {n} lengths of 1..{longest} summing to {total}")
    return lengths.tolist()


def useful_flops(lengths, heads: int, head_dim: int, causal: bool) -> float:
    """4 H D per (query, visible key) pair: sum of s^2, or s (s + 1) / 2 causal."""
    pairs = sum(s * (s + 1) // 2 if causal else s * s for s in lengths)
    return 4.0 * heads * head_dim * pairs


def varlen_contenders(lengths, *, heads: int, kv_heads: int, head_dim: int, causal: bool,
                      schedules=(None,), seed: int = 1, log=print):
    """-> Contenders (see `measure.rounds`) for one packed batch, every one checked first."""
    import torch

    from wavefront.kernel.varlen import attention_varlen
    from wavefront.measure.bench import IncorrectResult
    from wavefront.measure.rounds import Contender
    from wavefront.results.measurement import CORRECTNESS_TOLERANCE
    g = torch.Generator(device="cuda").manual_seed(seed)
    total = sum(lengths)
    bounds = list(accumulate(lengths, initial=0))

    def packed(h):
        return torch.randn(total, h, head_dim, device="cuda", dtype=torch.bfloat16, generator=g)
    q, k, v = packed(heads), packed(kv_heads), packed(kv_heads)
    cu_host = torch.tensor(bounds, dtype=torch.int32)
    cu_dev = cu_host.cuda()
    longest = max(lengths)
    flops = useful_flops(lengths, heads, head_dim, causal)
    rep = heads // kv_heads
    # The reference: each sequence in float32, a spread of rows of the long ones.
    checks = []
    for a, b in zip(bounds, bounds[1:]):
        rows = torch.linspace(0, b - a - 1, min(b - a, 256), device="cuda").long()
        qs = q[a:b].float().transpose(0, 1)[:, rows]
        ks = k[a:b].float().transpose(0, 1).repeat_interleave(rep, 0)
        vs = v[a:b].float().transpose(0, 1).repeat_interleave(rep, 0)
        scores = qs @ ks.transpose(1, 2) / math.sqrt(head_dim)
        if causal:
            scores = scores.masked_fill(torch.arange(b - a, device="cuda")[None, None, :]
                                        > rows[None, :, None], float("-inf"))
        checks.append((a, rows, torch.softmax(scores, -1) @ vs))

    def error(out):
        worst = 0.0
        for a, rows, ref in checks:
            got = out[a + rows].float().transpose(0, 1)
            if not torch.isfinite(got).all():
                return math.inf
            worst = max(worst, float((got - ref).norm() / ref.norm()))
        return worst

    runs = {}
    for schedule in schedules:
        name = "wavefront varlen" + (f" {schedule}" if schedule else " (tuned)")
        runs[name] = (lambda s=schedule: attention_varlen(
            q, k, v, bounds, bounds, longest, longest, causal=causal, schedule=s))
    # cu_seqlens on the GPU, as FlashAttention's callers hold them: the table is written on
    # the GPU from them on every call (the host path above builds it once per lengths).
    runs["wavefront varlen, cu_seqlens on GPU"] = lambda: attention_varlen(
        q, k, v, cu_dev, cu_dev, longest, longest, causal=causal)
    if len(set(lengths)) == 1:
        # Equal lengths: the same batch through the dense call (strided views, no copy) says
        # what slicing sequences out of packed arrays costs the kernel.
        from wavefront.kernel.call import attention_with
        from wavefront.kernel.plan import CallOptions
        options = CallOptions(causal=causal).values()
        n, s = len(lengths), lengths[0]
        dq, dk, dv = (x.view(n, s, x.shape[1], head_dim).transpose(1, 2) for x in (q, k, v))
        packed_out = torch.empty_like(q)
        dense_out = packed_out.view(n, s, heads, head_dim).transpose(1, 2)

        def dense():
            attention_with(dq, dk, dv, options, out=dense_out)
            return packed_out
        runs["wavefront dense, same batch"] = dense
    try:
        from torch.nn.attention.varlen import varlen_attn
        import inspect
        if rep == 1:
            # torch 2.10 took is_causal; 2.11 takes a window, (-1, 0) being causal
            masking = ({"window_size": (-1, 0) if causal else (-1, -1)}
                       if "window_size" in inspect.signature(varlen_attn).parameters
                       else {"is_causal": causal})
            # bound now: `mask` below names the padded contender's mask tensor
            runs["torch varlen_attn (FA2)"] = lambda masking=masking: varlen_attn(
                q, k, v, cu_dev, cu_dev, longest, longest, **masking)
        else:
            log("torch varlen_attn: left out (it takes no GQA)")
    except ImportError:
        log("torch varlen_attn: not in this torch")
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.nn.functional import scaled_dot_product_attention as sdpa

    def nested(x):
        return torch.nested.nested_tensor_from_jagged(x, cu_dev.long()).transpose(1, 2)
    nq, nk, nv = nested(q), nested(k), nested(v)
    for label, backend in (("cudnn", SDPBackend.CUDNN_ATTENTION),
                           ("fa2", SDPBackend.FLASH_ATTENTION)):
        def run(backend=backend):
            with sdpa_kernel(backend):
                return sdpa(nq, nk, nv, is_causal=causal, enable_gqa=rep > 1).transpose(
                    1, 2).values()
        runs[f"SDPA nested {label}"] = run
    padded = [torch.zeros(len(lengths), h, longest, head_dim, device="cuda",
                          dtype=torch.bfloat16) for h in (heads, kv_heads, kv_heads)]
    for i, (a, b) in enumerate(zip(bounds, bounds[1:])):
        for dst, src in zip(padded, (q, k, v)):
            dst[i, :, :b - a] = src[a:b].transpose(0, 1)
    # Padded keys must not be attended: a boolean mask keeps them out (cuDNN takes it).
    key_ok = torch.arange(longest, device="cuda")[None, :] < torch.tensor(
        lengths, device="cuda")[:, None]
    mask = key_ok[:, None, None, :]
    if causal:
        mask = mask & torch.ones(longest, longest, device="cuda", dtype=torch.bool).tril()

    def padded_cudnn():
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            out = sdpa(*padded, attn_mask=mask, enable_gqa=rep > 1)
        return torch.cat([out[i, :, :b - a].transpose(0, 1)
                          for i, (a, b) in enumerate(zip(bounds, bounds[1:]))])
    runs["cuDNN padded to the longest"] = padded_cudnn
    contenders = []
    for name, run in runs.items():
        try:
            err = error(run())
        except Exception as exc:  # a path that refuses the batch is a result, not a crash
            log(f"{name}: left out ({type(exc).__name__}: {str(exc)[:120]})")
            continue
        if not err < CORRECTNESS_TOLERANCE:
            if name.startswith("wavefront"):
                raise IncorrectResult(f"{name}: relative error {err:.3g}")
            log(f"{name}: left out (relative error {err:.3g})")
            continue
        contenders.append(Contender(name, lambda i, run=run: run(), flops))
    return contenders
