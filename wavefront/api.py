"""The public API: `wavefront.attention` (run the kernel) and `wavefront.plan` (what it runs,
held: a `Plan` to print and run).

Importing this module needs no GPU stack; `attention` loads cuTile and CuPy when called, and
`plan` when given GPU arrays (a Plan of shapes is for the model, on any machine).
"""
from __future__ import annotations

from wavefront.kernel.plan import CallOptions, Plan, gpu_for_shapes, plan_of_shapes
from wavefront.point import (LEVERS, NO_LEVER_VALUES, Point, lever_values, parse_schedule,
                             parse_tiles, plan_varlen)

__all__ = ["attention", "attention_backward", "attention_backward_varlen", "attention_varlen",
           "attention_with_kvcache", "plan", "plan_varlen", "Plan", "CallOptions", "Point",
           "parse_schedule", "parse_tiles"]


def attention(q, k, v, *, causal: bool = False, schedule: str | None = None,
              tiles=None, occupancy: int | None = None, scale: float | None = None,
              return_lse: bool = False, out=None, stream=None, l2_bytes: int | None = None,
              ctas: int | None = None, chunk_tiles: int | None = None,
              causal_alignment: str = "top_left", **levers):
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

    `causal_alignment` places the causal mask's diagonal when seqlen_q != seqlen_kv:
    "top_left" (default; torch's `is_causal`: query row i sees keys j <= i) or "bottom_right"
    (FlashAttention >= 2.1's: j <= i + seqlen_kv - seqlen_q, what a chunk of queries against a
    cache needs). With seqlen_q > seqlen_kv bottom-right leaves the first rows no key: their
    output is 0 and their LSE -inf.

    Kernel levers, by name (listed below, from `wavefront.point.LEVERS`). When none of
    schedule, tiles, occupancy and levers is given, the configuration `wavefront tune` measured fastest on this GPU for this head dim,
    mask and the nearest tuned shape is used (wavefront/kernel/tuned.json), else
    persistent+linear with the default tiles. With WAVEFRONT_CARRY_OVER=measure in the
    environment, a shape without an entry of its own times the entries' distinct
    configurations on its first call instead and keeps the fastest for the process
    (`wavefront.kernel.carry_over`; the first call pays their compiles), and in the JSON file
    WAVEFRONT_CARRY_OVER_FILE names, if set, for later processes.

    The first call of a shape makes its `Plan` (configuration, binary, work table, buffers);
    later calls with the same shapes, strides, dtype, device and options find it in a bounded
    cache and run it, costing about what the launch costs. `wavefront.plan(q, k, v, ...)`
    hands you that Plan, to print and run. PyTorch users: `wavefront.torch` has the same call
    as a custom op (torch.compile, CUDA graphs) and an SDPA-shaped entry point.

    {levers}
    """
    if (schedule is None and tiles is None and occupancy is None and scale is None
            and return_lse is False and out is None and stream is None and l2_bytes is None
            and ctas is None and chunk_tiles is None and causal_alignment == "top_left"
            and not levers):
        return _calls()[1](q, k, v, causal)  # the call a model makes
    # The options as `CallOptions.values()` orders them (`kernel.plan.CALL_OPTIONS`), passed
    # as one tuple: keyword passing costs microseconds, what a short launch costs.
    return _calls()[0](q, k, v, (causal, schedule, tiles, occupancy, scale, return_lse, l2_bytes,
                                 ctas, chunk_tiles, causal_alignment,
                                 *(lever_values(levers) if levers else NO_LEVER_VALUES)),
                       out, stream)


_LEVER_DOC = "\n    ".join(f"- `{lever.name}`: {lever.help} Values: {lever.expected}."
                          for lever in LEVERS)
attention.__doc__ = attention.__doc__.replace("{levers}", "Kernel levers:\n    " + _LEVER_DOC)


def plan(q, k, v=None, *, causal: bool = False, schedule: str | None = None, tiles=None,
         occupancy: int | None = None, scale: float | None = None, return_lse: bool = False,
         l2_bytes: int | None = None, ctas: int | None = None, chunk_tiles: int | None = None,
         gpu=None, sms: int | None = None, dtype: str | None = None, stream=None,
         causal_alignment: str = "top_left", **levers) -> Plan:
    """The `Plan` `wavefront.attention` runs for these arrays and options, to hold, print and
    run (`plan.run(q, k, v, out=None, stream=None)`): its schedule, tiles, CTAs, work items,
    the DRAM bytes the cache model predicts, and its binary, work table and buffers.

    q, k, v: GPU arrays as `attention` takes them, and the options `attention` takes (not
    `out`). The Plan is the one the public call caches for them, so holding it costs no second
    binary or table. `stream`: where a measured carry-over times its candidates.

    Or shapes, for the model only (no GPU needed; `run` refuses): q (batch, heads, seqlen,
    head_dim), k (batch, kv_heads, seqlen, head_dim), v (default k's), on `gpu` (a preset:
    "h100", "h200", "b200", "gb10", or a `wavefront.model.presets.GPUSpec`; default the GPU
    this process sees), with `sms` and `l2_bytes` overriding its SMs and L2 (or both alone for
    a GPU of no preset), `dtype` (default bfloat16). Where the options choose no schedule,
    tiles, occupancy or lever, a preset's GPU takes the tuned table's entry it would run.
    `plan(q.shape, k.shape, sms=132, l2_bytes=50 << 20, schedule=...)` is the old call, whose
    `Launch` is now the Plan's `.launch`."""
    options = CallOptions(causal=causal, schedule=schedule, tiles=tiles, occupancy=occupancy,
                          scale=scale, return_lse=return_lse, l2_bytes=l2_bytes, ctas=ctas,
                          chunk_tiles=chunk_tiles, causal_alignment=causal_alignment,
                          **_levers(levers))
    if isinstance(q, (tuple, list)) and not _is_shape(q):
        raise ValueError(f"q must be a shape of ints (batch, heads, seqlen, head_dim) or a GPU "
                         f"array, got {q!r}")
    if _is_shape(q):
        if not _is_shape(k):
            raise ValueError(f"k must be a shape like q's (batch, kv_heads, seqlen, head_dim), "
                             f"got {type(k).__name__}")
        if v is not None and (not _is_shape(v) or tuple(v) != tuple(k)):
            raise ValueError(f"v must be k's shape {tuple(k)}, got {v!r}")
        if stream is not None:
            raise ValueError("stream applies to a Plan of GPU arrays, not of shapes")
        return plan_of_shapes(q, k, options, gpu_for_shapes(gpu, sms, l2_bytes),
                              "bfloat16" if dtype is None else dtype)
    for name, given in (("gpu", gpu), ("sms", sms), ("dtype", dtype)):
        if given is not None:
            raise ValueError(f"{name} applies to a Plan of shapes (for the model); a Plan of "
                             f"arrays is for the GPU they are on and their dtype, got "
                             f"{name}={given!r}")
    if v is None:
        raise ValueError("v must be given with GPU arrays q and k")
    from wavefront.device import require_gpu_stack
    require_gpu_stack("wavefront.plan")
    from wavefront.kernel.call import plan_for
    return plan_for(q, k, v, options, stream)


def _levers(levers: dict) -> dict:
    """The kernel levers named, checked by name (an unknown name is a TypeError, as an
    unknown keyword is)."""
    lever_values(levers)
    return levers


def _is_shape(x) -> bool:
    """A shape (a tuple or list of ints, torch.Size among them), not an array."""
    return isinstance(x, (tuple, list)) and all(
        isinstance(n, int) and not isinstance(n, bool) for n in x)


def attention_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q=None,
                     max_seqlen_k=None, *, causal: bool = False, schedule: str | None = None,
                     tiles=None, occupancy: int | None = None, scale: float | None = None,
                     return_lse: bool = False, out=None, stream=None,
                     l2_bytes: int | None = None, ctas: int | None = None,
                     causal_alignment: str = "top_left", **levers):
    """FlashAttention forward over a batch of packed sequences of different lengths, with
    FlashAttention's varlen interface.

    q: (total_q, heads, head_dim), the rows of every sequence one after another; k, v:
    (total_k, kv_heads, head_dim); `cu_seqlens_q` = [0, len_q(0), len_q(0) + len_q(1), ...]
    (batch + 1 entries, ending at total_q), `cu_seqlens_k` likewise. Host lists, NumPy arrays
    or CPU tensors are checked (start at 0, never decrease, end at the packed rows, and
    `max_seqlen_*`, where given, at least every length; an error names the argument and the
    index), and the work table is built on the host once per lengths.
    CUDA tensors (with torch q, k, v) are read on the GPU: each call writes the table there
    from them, without waiting for the GPU, so a CUDA graph of the call replays it for the
    lengths they hold then; a call with the very tensors the table was last written from,
    unmodified since by torch (their version counters), keeps it (a model's layers; see
    `wavefront.kernel.varlen.REUSE_UNCHANGED_LENGTHS` for writes torch does not see). They
    are checked on the GPU as the table is written, which clamps every offset to the arrays
    (no launch reads or writes outside them), into a flag the host reads without waiting: a
    later call raises, naming cu_seqlens_q/k or max_seqlen_q/k; with WAVEFRONT_CHECK_LENGTHS=1
    in the environment each call waits for its check and raises before its launch. The first
    call of a packed problem (arrays, options, and buckets of packed rows and of sequence
    counts, powers of two: fewer sequences are padded as empty ones) waits for the GPU once,
    recording the table's writing in a CUDA graph. CuPy cu_seqlens on the GPU are copied to
    the host. `max_seqlen_*` are not needed. Causal masks are aligned within each sequence as
    `causal_alignment` says: "top_left" (default, torch's `is_causal`) or "bottom_right"
    (FlashAttention >= 2.1's: query i of sequence s sees keys j <= i + seqlen_k(s) -
    seqlen_q(s); rows that see no key give 0). Sequences may be empty; one with queries must
    have keys. Schedules: any CTA schedule with the linear or sawtooth scan, ordering the work
    items of the whole batch (`wavefront.schedules.VarlenLaunch`).

    Kernel levers as `attention` takes them.

    Returns the output (total_q, heads, head_dim) (and the LSE, float32 (heads, total_q)).
    """
    from wavefront.device import require_gpu_stack
    require_gpu_stack("wavefront.attention_varlen")
    from wavefront.kernel.varlen import attention_varlen as launch_varlen
    return launch_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                         causal=causal, schedule=schedule, tiles=tiles, occupancy=occupancy,
                         scale=scale, return_lse=return_lse, out=out, stream=stream,
                         l2_bytes=l2_bytes, ctas=ctas, causal_alignment=causal_alignment,
                         **levers)


def attention_with_kvcache(q, k_cache, v_cache, cache_seqlens, *, k=None, v=None,
                           block_table=None, causal: bool = True, scale: float | None = None,
                           num_splits: int | None = None, cta_order: str | None = None,
                           return_lse: bool = False, out=None, stream=None):
    """Attention against a KV cache, FlashAttention's `flash_attn_with_kvcache`: decode (one
    query per sequence) to chunked prefill (thousands), contiguous or paged K/V.

    q: (batch, seqlen_q, heads, head_dim). Contiguous cache: k_cache, v_cache (batch, S_max,
    kv_heads, head_dim). Paged cache: k_cache, v_cache a page pool (num_pages, page_size,
    kv_heads, head_dim) with page_size a power of two from 16 to 256, and `block_table`
    (batch, max_pages) int32 naming sequence b's pages in order. `cache_seqlens`: an int or
    (batch,) int32, the keys in the cache before this call. `k`, `v` (batch, seqlen_new,
    kv_heads, head_dim), if given, are written into the cache at cache_seqlens (in place)
    and attended; cache_seqlens itself is not changed. heads a multiple of kv_heads (GQA, at
    most 64 query heads per K/V head); bfloat16 or float16; head_dim 64 or 128; CuPy arrays or
    torch tensors. Pages of 16 or 32 keys are read in K/V tiles of their size (a tile never
    spans two pages), larger pages in 64-key tiles.

    `causal`: bottom-right aligned (FlashAttention >= 2.1): query i of sequence b sits at
    key position cache_seqlens[b] + seqlen_new - seqlen_q + i. A query that sees no key gets
    output 0 (and LSE -inf). `scale`: default 1/sqrt(head_dim). `num_splits`: K/V splits per
    (sequence, K/V head, Q tile), merged by a second kernel (default from the shape: enough
    work items to fill the GPU, 1 where the batch fills it). `cta_order`: the order work items
    are handed out, one of `wavefront.decode_schedules.CTA_ORDERS` ("batch_major" default,
    "kv_head_major", "prefix_grouped": sequences whose block tables start with the same page
    together; a block table on the GPU is then read back, which waits for the GPU, once per
    table tensor and again after torch writes it in place).

    Lengths and block tables given as host data (int, list, NumPy, CPU tensor) are checked
    before the launch (they are copied to the GPU each call; pass GPU int32 arrays in a
    decode loop or a CUDA graph). On the GPU they are clamped into the cache by the kernels,
    which raise a flag that a later call reads without waiting for the GPU and raises as
    `wavefront.kernel.kvcache.KVCacheLengthError`; WAVEFRONT_CHECK_LENGTHS=1 checks each call
    before it returns (waits), `wavefront.kernel.kvcache.check_kvcache_flags()` on demand.
    The first call of a layout (shapes, strides, dtypes) and options checks the arrays and
    builds its work table and buffers, waiting for the GPU once; later calls skip that. Make
    that first call before capturing a CUDA graph of the call (graphs replay the lengths and
    block table the GPU arrays hold at replay).

    Returns the output (batch, seqlen_q, heads, head_dim) in q's library (and the LSE,
    float32 (batch, heads, seqlen_q), natural log, if asked)."""
    from wavefront.argument_checks import kvcache_options, stream_or_none
    options = kvcache_options(cache_seqlens, causal=causal, scale=scale, num_splits=num_splits,
                              cta_order=cta_order, return_lse=return_lse)  # before the GPU
    stream = stream_or_none(stream)
    from wavefront.device import require_gpu_stack
    require_gpu_stack("wavefront.attention_with_kvcache")
    from wavefront.kernel.kvcache import attention_with_kvcache as call
    return call(q, k_cache, v_cache, cache_seqlens, k=k, v=v, block_table=block_table,
                out=out, stream=stream, **options)


def attention_backward(q, k, v, out, lse, dout, *, causal: bool = False,
                       scale: float | None = None, schedule: str | None = None,
                       deterministic: bool = True, tiles=None,
                       causal_alignment: str = "top_left"):
    """FlashAttention backward: -> (dq, dk, dv), the gradients of `attention`'s output `out`
    (given `dout`, its gradient) with respect to q, k and v, in their shapes and dtype.

    `lse` is the forward's natural-log LSE (`attention(..., return_lse=True)`), float32
    (batch, heads, seqlen_q). Layout, dtypes, head dims, GQA and `causal` as `attention`
    takes them (dk, dv summed over each K/V head's query heads). `schedule`: '<cta>+<scan>',
    cta one of grid, persistent, grouped, longest_first, scan linear or sawtooth (the order in
    which each K/V tile visits its Q tiles; `wavefront.backward_schedules`); `tiles`: 'MxN'
    (Q tile rows x K/V tile rows; the atomic mode then adds row-major). `deterministic`
    (default): dQ from a second, Q-major kernel, so repeated calls give bit-identical
    gradients; `deterministic=False`: float32 atomics into a tile-major dQ accumulator, not
    bit-identical, the faster mode at most shapes of the backward bench
    (experiments/backward_bench.py). `causal_alignment`: the forward's ("top_left" or
    "bottom_right", as `attention` takes it; a row that saw no key gets dq = 0 and adds
    nothing to dk, dv)."""
    from wavefront.argument_checks import backward_options
    options = backward_options(causal=causal, scale=scale, schedule=schedule,
                               deterministic=deterministic, tiles=tiles,
                               causal_alignment=causal_alignment)  # before the GPU
    from wavefront.device import require_gpu_stack
    require_gpu_stack("wavefront.attention_backward")
    from wavefront.kernel.backward_call import attention_backward as launch_backward
    return launch_backward(q, k, v, out, lse, dout, **options)


def attention_backward_varlen(q, k, v, out, lse, dout, cu_seqlens_q, cu_seqlens_k, *,
                              causal: bool = False, scale: float | None = None,
                              schedule: str | None = None, deterministic: bool = True,
                              tiles=None, causal_alignment: str = "top_left"):
    """`attention_backward` for `attention_varlen`: packed q, out, dout (total_q, heads, D),
    k, v (total_k, kv_heads, D), the forward's LSE (heads, total_q) float32, and cu_seqlens as
    `attention_varlen` takes them (read on the host: a GPU tensor is copied, which waits for
    the GPU). -> (dq, dk, dv) packed as q, k, v. Schedules: grid, persistent or longest_first
    with the linear or sawtooth Q scan; `causal_alignment` per sequence, as
    `attention_varlen` takes it."""
    from wavefront.argument_checks import backward_options
    options = backward_options(causal=causal, scale=scale, schedule=schedule,
                               deterministic=deterministic, tiles=tiles,
                               causal_alignment=causal_alignment)  # before the GPU
    from wavefront.device import require_gpu_stack
    require_gpu_stack("wavefront.attention_backward_varlen")
    from wavefront.kernel.backward_call import attention_backward_varlen as launch_backward
    return launch_backward(q, k, v, out, lse, dout, cu_seqlens_q, cu_seqlens_k, **options)


_launch = None


def _calls():
    """The kernel-side calls (with options; the mask alone), found once: checking for the GPU
    stack on every call would cost more than the launch."""
    global _launch
    if _launch is None:
        from wavefront.device import require_gpu_stack
        require_gpu_stack("wavefront.attention")
        from wavefront.kernel.call import attention_plain, attention_with
        _launch = attention_with, attention_plain
    return _launch
