"""The public API: `wavefront.attention` (run the kernel) and `wavefront.plan` (what it runs).

Importing this module needs no GPU stack; `attention` loads cuTile and CuPy when called.
"""
from __future__ import annotations

from wavefront.point import (LEVERS, NO_LEVER_VALUES, Point, lever_values, parse_schedule,
                             parse_tiles, plan, plan_varlen)

__all__ = ["attention", "attention_varlen", "plan", "plan_varlen", "Point", "parse_schedule",
           "parse_tiles"]


def attention(q, k, v, *, causal: bool = False, schedule: str | None = None,
              tiles=None, occupancy: int | None = None, scale: float | None = None,
              return_lse: bool = False, out=None, stream=None, l2_bytes: int | None = None,
              ctas: int | None = None, chunk_tiles: int | None = None, **levers):
    """FlashAttention forward: softmax(q k^T * scale) v, per (batch, head).

    q: (batch, heads, seqlen_q, head_dim); k, v: (batch, kv_heads, seqlen_kv, head_dim) with
    heads a multiple of kv_heads (GQA). bfloat16 or float16, head_dim 64 or 128, CuPy arrays,
    torch tensors or any DLPack GPU array. `schedule` is "<cta>+<kv>" with names from
    `wavefront.schedules` (e.g. "persistent+sawtooth"). `tiles` is "MxN" or (M, N).
    `tiled` splits K/V into L2-sized chunks (`chunk_tiles` K/V tiles each, default from the L2)
    and merges the chunks' partial states in a second kernel.
    Returns the output (and the natural-log LSE, float32 (batch, heads, seqlen_q), if asked)
    as arrays of q's library on q's device. `ctas` caps the persistent grid (default: every
    SM x occupancy); `l2_bytes` overrides the L2 size the grouped schedule budgets for.

    Kernel levers, by name (listed below, from `wavefront.point.LEVERS`). When none of
    schedule, tiles, occupancy and levers is given, the configuration `wavefront tune` measured fastest on this GPU for this head dim,
    mask and the nearest tuned shape is used (wavefront/kernel/tuned.json), else
    persistent+linear with the default tiles. With WAVEFRONT_CARRY_OVER=measure in the
    environment, a shape without an entry of its own times the entries' distinct
    configurations on its first call instead and keeps the fastest for the process
    (`wavefront.kernel.carry_over`; the first call pays their compiles), and in the JSON file
    WAVEFRONT_CARRY_OVER_FILE names, if set, for later processes.

    The first call of a shape builds its launcher (binary, work table); later calls with the
    same shapes, strides, dtype, device and options reuse it from a bounded cache and cost
    about what the launch costs. PyTorch users: `wavefront.torch` has the same call as a
    custom op (torch.compile, CUDA graphs) and an SDPA-shaped entry point.

    {levers}
    """
    if (schedule is None and tiles is None and occupancy is None and scale is None
            and return_lse is False and out is None and stream is None and l2_bytes is None
            and ctas is None and chunk_tiles is None and not levers):
        return _launcher_attention()[1](q, k, v, causal)  # the call a model makes
    # positional: keyword passing costs microseconds, what a short launch costs
    return _launcher_attention()[0](q, k, v, causal, schedule, tiles, occupancy, scale,
                                    return_lse, out, stream, l2_bytes, ctas, chunk_tiles,
                                    *(lever_values(levers) if levers else NO_LEVER_VALUES))


_LEVER_DOC = "\n    ".join(f"- `{lever.name}`: {lever.help} Values: {lever.expected}."
                          for lever in LEVERS)
attention.__doc__ = attention.__doc__.replace("{levers}", "Kernel levers:\n    " + _LEVER_DOC)


def attention_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q=None,
                     max_seqlen_k=None, *, causal: bool = False, schedule: str | None = None,
                     tiles=None, occupancy: int | None = None, scale: float | None = None,
                     return_lse: bool = False, out=None, stream=None,
                     l2_bytes: int | None = None, ctas: int | None = None, **levers):
    """FlashAttention forward over a batch of packed sequences of different lengths, with
    FlashAttention's varlen interface.

    q: (total_q, heads, head_dim), the rows of every sequence one after another; k, v:
    (total_k, kv_heads, head_dim); `cu_seqlens_q` = [0, len_q(0), len_q(0) + len_q(1), ...]
    (batch + 1 entries, ending at total_q), `cu_seqlens_k` likewise. Host lists, NumPy arrays
    or CPU tensors are checked, and the work table is built on the host once per lengths.
    CUDA tensors (with torch q, k, v) are read on the GPU: each call writes the table there
    from them, without waiting for the GPU, so a CUDA graph of the call replays it for the
    lengths they hold then; a call with the very tensors the table was last written from,
    unmodified since by torch (their version counters), keeps it (a model's layers; see
    `wavefront.kernel.launcher.REUSE_UNCHANGED_LENGTHS` for writes torch does not see). They are not checked (that would wait): lengths are clamped to
    the packed rows. The first call of a packed problem (arrays, options, and buckets of
    packed rows and of sequence counts, powers of two: fewer sequences are padded as empty
    ones) waits for the GPU once, recording the table's writing in a CUDA graph. CuPy
    cu_seqlens on the GPU are copied to the host. `max_seqlen_*` are checked where the
    lengths are on the host, not needed. Causal masks are
    top-left aligned within each sequence (torch's `is_causal`; the same as FlashAttention's
    where a sequence has as many queries as keys). Sequences may be empty; one with queries
    must have keys. Schedules: any CTA schedule with the linear or sawtooth scan, ordering
    the work items of the whole batch (`wavefront.schedules.VarlenLaunch`).

    Kernel levers as `attention` takes them.

    Returns the output (total_q, heads, head_dim) (and the LSE, float32 (heads, total_q)).
    """
    from wavefront.device import require_gpu_stack
    require_gpu_stack("wavefront.attention_varlen")
    from wavefront.kernel.launcher import attention_varlen as launch_varlen
    return launch_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                         causal=causal, schedule=schedule, tiles=tiles, occupancy=occupancy,
                         scale=scale, return_lse=return_lse, out=out, stream=stream,
                         l2_bytes=l2_bytes, ctas=ctas, **levers)


_launch = None


def _launcher_attention():
    """The kernel-side calls (every option in order; the mask alone), found once: checking for
    the GPU stack on every call would cost more than the launch."""
    global _launch
    if _launch is None:
        from wavefront.device import require_gpu_stack
        require_gpu_stack("wavefront.attention")
        from wavefront.kernel.launcher import attention_plain, attention_positional
        _launch = attention_positional, attention_plain
    return _launch
