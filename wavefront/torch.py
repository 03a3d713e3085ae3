"""wavefront for PyTorch users: a custom op that `torch.compile` traces and CUDA graphs capture,
and an entry point shaped like `torch.nn.functional.scaled_dot_product_attention`.

    import wavefront.torch as wft
    out = wft.scaled_dot_product_attention(q, k, v, is_causal=True)   # q: (B, H, S, D)
    out = torch.ops.wavefront.attention(q, k, v, True, None, None, None)

The op is `wavefront::attention(q, k, v, causal, scale, schedule, tiles, causal_alignment)
-> Tensor` (`causal_alignment`: "top_left", torch's, or "bottom_right", FlashAttention's), with a fake
(meta) implementation, so a compiled model keeps it in its graph instead of breaking the graph
around an opaque Python call. It runs on the caller's current stream.

Training: `wavefront::attention_fwd_lse` is the same forward returning the LSE too, and its
autograd formula (saving q, k, v, the output and the LSE) calls `wavefront::attention_bwd`, the
cuTile backward (`wavefront.attention_backward`, in its deterministic mode: also the faster
one). The SDPA-shaped entry and the transformers
hook run it whenever an input requires grad, so a compiled model with trainable parameters
keeps both ops in its graphs. `wavefront::attention` itself has a formula too, which
recomputes the LSE (one more forward) since that op does not keep it, and so has
`wavefront::attention_varlen` (`wavefront::attention_varlen_bwd`, lengths read on the host).
Each carries `causal_alignment` to its backward: both alignments train, the bottom-right one
with S_q != S_kv too (a row that sees no key gets gradient 0).

Under a CUDA graph: call the op once before capturing (the first call of a shape compiles the
kernel and uploads its work table, neither of which a capture allows); replays then launch the
same kernel with the same work table, and the dynamic schedules' counter is reset by the
kernel itself, so every replay is a fresh launch. A launcher launched into a capture is kept
for good (a graph replays on its buffers while it lives): once every such graph is destroyed,
`release_graph_launchers()` lets them go.
"""
from __future__ import annotations

import functools
from typing import Optional

import torch

__all__ = ["attention", "attention_fwd_lse", "attention_bwd", "attention_varlen",
           "attention_varlen_bwd",
           "scaled_dot_product_attention",
           "hf_attention_forward", "hf_mask", "SequencesMask", "register_with_transformers",
           "release_graph_launchers"]


@torch.library.custom_op("wavefront::attention", mutates_args=(), device_types="cuda")
def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False,
              scale: Optional[float] = None, schedule: Optional[str] = None,
              tiles: Optional[str] = None, causal_alignment: str = "top_left") -> torch.Tensor:
    """softmax(q k^T * scale) v per (batch, head); q (B, H, S_q, D), k and v (B, H_kv, S_kv, D),
    H a multiple of H_kv. `schedule`, `tiles` and `causal_alignment` as in
    `wavefront.attention` (None: the tuned configuration for this GPU and shape). The Plan the
    public call caches for them, run (`wavefront.kernel.plan.Plan.run`)."""
    from wavefront.kernel.call import plan_for
    return plan_for(q, k, v, _options(causal, scale, schedule, tiles,
                                      causal_alignment)).run(q, k, v)


@functools.lru_cache(maxsize=256, typed=True)  # typed: True and 1 are other options
def _options(causal, scale, schedule, tiles, causal_alignment="top_left"):
    """The op's options as a `CallOptions`, made (and checked) once per combination."""
    from wavefront.kernel.plan import CallOptions
    return CallOptions(causal=causal, scale=scale, schedule=schedule, tiles=tiles,
                       causal_alignment=causal_alignment)


@functools.lru_cache(maxsize=256, typed=True)
def _values(causal, scale, causal_alignment="top_left"):
    """The values (`CallOptions.values()`) of a call with the mask, a scale and the mask's
    alignment, made once."""
    return _options(causal, scale, None, None, causal_alignment).values()


def _check_fake(q, k, v, out=None, dout=None, lse=None, packed=False, cu_seqlens=(),
                causal_alignment="top_left"):
    """What the ops' real implementations refuse by shape, dtype and option, refused where
    they are traced too (torch.compile's fake tensors, meta tensors), naming the argument: a
    graph traced with mismatched arrays would otherwise carry wrong shapes to its first run.
    `packed`: the varlen ops' (total, heads, head_dim) layout, with their cu_seqlens."""
    from wavefront.schedules import check_causal_alignment
    check_causal_alignment(causal_alignment)
    rank, layout = (3, "(total, heads, head_dim)") if packed else (
        4, "(batch, heads, seqlen, head_dim)")
    if q.dim() != rank:
        raise ValueError(f"q must be {rank}-D {layout}, got shape {tuple(q.shape)}")
    if q.dtype not in (torch.bfloat16, torch.float16):
        raise ValueError(f"q dtype must be bfloat16 or float16, got {q.dtype}")
    heads, head_dim = q.shape[-3 if not packed else -2], q.shape[-1]
    if k.dim() != rank or k.shape[-1] != head_dim or (not packed and k.shape[0] != q.shape[0]):
        raise ValueError(f"k must be {rank}-D {layout} with q's head_dim ({head_dim})"
                         f"{'' if packed else f' and batch ({q.shape[0]})'}, got shape "
                         f"{tuple(k.shape)}")
    kv_heads = k.shape[-3 if not packed else -2]
    if kv_heads == 0 or heads % kv_heads:
        raise ValueError(f"q heads ({heads}) must be a multiple of k's kv_heads ({kv_heads})")
    if v.shape != k.shape:
        raise ValueError(f"v shape must equal k shape {tuple(k.shape)}, got {tuple(v.shape)}")
    for name, x in (("k", k), ("v", v), ("out", out), ("dout", dout)):
        if x is not None and x.dtype != q.dtype:
            raise ValueError(f"{name} dtype must match q ({q.dtype}), got {x.dtype}")
    for name, x in (("out", out), ("dout", dout)):
        if x is not None and x.shape != q.shape:
            raise ValueError(f"{name} must have q's shape {tuple(q.shape)}, got "
                             f"{tuple(x.shape)}")
    if lse is not None and (tuple(lse.shape) != tuple(q.shape[:3]) or lse.dtype != torch.float32):
        raise ValueError(f"lse must be float32 {tuple(q.shape[:3])} (the forward's LSE), got "
                         f"{lse.dtype} {tuple(lse.shape)}")
    for name, x in zip(("cu_seqlens_q", "cu_seqlens_k"), cu_seqlens):
        if x.dim() != 1 or x.dtype not in (torch.int32, torch.int64):
            raise ValueError(f"{name} must be a 1-D integer tensor (batch + 1 entries), got "
                             f"{x.dtype} {tuple(x.shape)}")


@attention.register_fake
def _attention_fake(q, k, v, causal=False, scale=None, schedule=None, tiles=None,
                    causal_alignment="top_left"):
    _check_fake(q, k, v, causal_alignment=causal_alignment)
    # The output is always a new contiguous (B, H, S_q, D) tensor of q's dtype and device.
    return q.new_empty(q.shape)


@torch.library.custom_op("wavefront::attention_fwd_lse", mutates_args=(), device_types="cuda")
def attention_fwd_lse(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False,
                      scale: Optional[float] = None, schedule: Optional[str] = None,
                      tiles: Optional[str] = None, causal_alignment: str = "top_left"
                      ) -> tuple[torch.Tensor, torch.Tensor]:
    """`attention` that returns the natural-log LSE too, float32 (B, H, S_q): the forward that
    training runs (its autograd formula saves both for `attention_bwd`). A row that sees no
    key (bottom-right, S_q > S_kv) has output 0 and LSE -inf."""
    from wavefront.kernel.call import plan_for
    return plan_for(q, k, v, _options_lse(causal, scale, schedule, tiles,
                                          causal_alignment)).run(q, k, v)


@functools.lru_cache(maxsize=256, typed=True)
def _options_lse(causal, scale, schedule, tiles, causal_alignment="top_left"):
    from wavefront.kernel.plan import CallOptions
    return CallOptions(causal=causal, scale=scale, schedule=schedule, tiles=tiles,
                       return_lse=True, causal_alignment=causal_alignment)


@attention_fwd_lse.register_fake
def _attention_fwd_lse_fake(q, k, v, causal=False, scale=None, schedule=None, tiles=None,
                            causal_alignment="top_left"):
    _check_fake(q, k, v, causal_alignment=causal_alignment)
    return q.new_empty(q.shape), q.new_empty(q.shape[:3], dtype=torch.float32)


@torch.library.custom_op("wavefront::attention_bwd", mutates_args=(), device_types="cuda")
def attention_bwd(dout: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                  out: torch.Tensor, lse: torch.Tensor, causal: bool = False,
                  scale: Optional[float] = None, deterministic: bool = True,
                  causal_alignment: str = "top_left"
                  ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(dq, dk, dv) of the attention whose output `out` and LSE `lse` the forward gave, for
    the output's gradient `dout` (`wavefront.attention_backward`, the causal mask aligned as
    the forward's): new contiguous tensors of q's, k's and v's shapes and dtype."""
    from wavefront.kernel.backward_call import attention_backward
    if dout.stride(-1) != 1:  # a gradient may arrive as any view
        dout = dout.contiguous()
    return attention_backward(q, k, v, out, lse, dout, causal=causal, scale=scale,
                              deterministic=deterministic, causal_alignment=causal_alignment)


@attention_bwd.register_fake
def _attention_bwd_fake(dout, q, k, v, out, lse, causal=False, scale=None,
                        deterministic=True, causal_alignment="top_left"):
    _check_fake(q, k, v, out, dout, lse, causal_alignment=causal_alignment)
    return q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape)


# dQ from the Q-major kernel, not float32 atomics, whether or not torch asks for deterministic
# algorithms: bit-identical gradients. The atomic mode (coalesced since fc184ee) is the faster
# at most shapes of the backward bench (experiments/backward_bench.py), but training through
# these ops under torch.compile and CUDA graphs has been verified with this mode only.
_DETERMINISTIC_DQ = True


def _backward(ctx, dout, q, k, v, out, lse):
    dq, dk, dv = attention_bwd(dout, q, k, v, out, lse, ctx.causal, ctx.scale,
                               _DETERMINISTIC_DQ, ctx.causal_alignment)
    return dq, dk, dv, None, None, None, None, None


def _fwd_lse_setup_context(ctx, inputs, output):
    q, k, v, causal, scale, _, _, causal_alignment = inputs
    out, lse = output
    ctx.save_for_backward(q, k, v, out, lse)
    ctx.causal, ctx.scale, ctx.causal_alignment = causal, scale, causal_alignment
    ctx.mark_non_differentiable(lse)


def _fwd_lse_backward(ctx, dout, _dlse):
    return _backward(ctx, dout, *ctx.saved_tensors)


def _attention_setup_context(ctx, inputs, output):
    q, k, v, causal, scale, schedule, tiles, causal_alignment = inputs
    ctx.save_for_backward(q, k, v, output)
    ctx.causal, ctx.scale, ctx.causal_alignment = causal, scale, causal_alignment
    ctx.options = (causal, scale, schedule, tiles, causal_alignment)


def _attention_backward(ctx, dout):
    q, k, v, out = ctx.saved_tensors
    _, lse = attention_fwd_lse(q, k, v, *ctx.options)  # this op did not keep its LSE
    return _backward(ctx, dout, q, k, v, out, lse)


torch.library.register_autograd("wavefront::attention_fwd_lse", _fwd_lse_backward,
                                setup_context=_fwd_lse_setup_context)
torch.library.register_autograd("wavefront::attention", _attention_backward,
                                setup_context=_attention_setup_context)


@torch.library.custom_op("wavefront::attention_varlen", mutates_args=(), device_types="cuda")
def attention_varlen(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                     cu_seqlens_q: torch.Tensor, cu_seqlens_k: torch.Tensor,
                     max_seqlen_q: int, max_seqlen_k: int, causal: bool = False,
                     scale: Optional[float] = None, schedule: Optional[str] = None,
                     tiles: Optional[str] = None,
                     causal_alignment: str = "top_left") -> torch.Tensor:
    """Packed sequences, FlashAttention's varlen interface: q (total_q, H, D), k and v
    (total_k, H_kv, D), cu_seqlens int32 (batch + 1). cu_seqlens on the GPU are read there
    (the work table is written from them on the call's stream: asynchronous, and a CUDA graph
    replays the call for the lengths they hold then; every schedule; checked there, a later
    call raising, see `wavefront.attention_varlen`); on the CPU they are checked and the
    table is built on the host, once per lengths. `causal_alignment` per sequence, as in
    `wavefront.attention_varlen`."""
    from wavefront.kernel.varlen import attention_varlen as launch_varlen
    return launch_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                         causal=causal, scale=scale, schedule=schedule, tiles=tiles,
                         causal_alignment=causal_alignment)


@attention_varlen.register_fake
def _attention_varlen_fake(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                           causal=False, scale=None, schedule=None, tiles=None,
                           causal_alignment="top_left"):
    _check_fake(q, k, v, packed=True, cu_seqlens=(cu_seqlens_q, cu_seqlens_k),
                causal_alignment=causal_alignment)
    return q.new_empty(q.shape)


@torch.library.custom_op("wavefront::attention_varlen_bwd", mutates_args=(),
                         device_types="cuda")
def attention_varlen_bwd(dout: torch.Tensor, q: torch.Tensor, k: torch.Tensor,
                         v: torch.Tensor, out: torch.Tensor, cu_seqlens_q: torch.Tensor,
                         cu_seqlens_k: torch.Tensor, causal: bool = False,
                         scale: Optional[float] = None, deterministic: bool = True,
                         causal_alignment: str = "top_left"
                         ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(dq, dk, dv) of `attention_varlen`, packed as q, k, v (the causal mask aligned per
    sequence as the forward's). Its LSE is recomputed (one more forward: the op does not keep
    it) and the lengths are read on the host (a GPU cu_seqlens is copied, which waits for the
    GPU)."""
    from wavefront.kernel.backward_call import attention_backward_varlen
    from wavefront.kernel.varlen import attention_varlen as launch_varlen
    _, lse = launch_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, causal=causal, scale=scale,
                           return_lse=True, causal_alignment=causal_alignment)
    if dout.stride(-1) != 1:
        dout = dout.contiguous()
    return attention_backward_varlen(q, k, v, out, lse, dout, cu_seqlens_q, cu_seqlens_k,
                                     causal=causal, scale=scale, deterministic=deterministic,
                                     causal_alignment=causal_alignment)


@attention_varlen_bwd.register_fake
def _attention_varlen_bwd_fake(dout, q, k, v, out, cu_seqlens_q, cu_seqlens_k, causal=False,
                               scale=None, deterministic=True, causal_alignment="top_left"):
    _check_fake(q, k, v, out, dout, packed=True, cu_seqlens=(cu_seqlens_q, cu_seqlens_k),
                causal_alignment=causal_alignment)
    return q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape)


def _varlen_setup_context(ctx, inputs, output):
    q, k, v, cu_seqlens_q, cu_seqlens_k, _, _, causal, scale, _, _, causal_alignment = inputs
    ctx.save_for_backward(q, k, v, output, cu_seqlens_q, cu_seqlens_k)
    ctx.causal, ctx.scale, ctx.causal_alignment = causal, scale, causal_alignment


def _varlen_backward(ctx, dout):
    q, k, v, out, cu_seqlens_q, cu_seqlens_k = ctx.saved_tensors
    dq, dk, dv = attention_varlen_bwd(dout, q, k, v, out, cu_seqlens_q, cu_seqlens_k,
                                      ctx.causal, ctx.scale,
                                      _DETERMINISTIC_DQ, ctx.causal_alignment)
    return dq, dk, dv, None, None, None, None, None, None, None, None, None


torch.library.register_autograd("wavefront::attention_varlen", _varlen_backward,
                                setup_context=_varlen_setup_context)


def release_graph_launchers() -> int:
    """Let go of the launchers that calls launched into CUDA-graph captures (kept for good
    until then), once every graph that captured a wavefront call is destroyed; -> how many
    were held. See `wavefront.kernel.call.release_graph_launchers`."""
    from wavefront.kernel.call import release_graph_launchers as release
    return release()


def _attention(q, k, v, causal, scale, causal_alignment="top_left"):
    """The op where torch.compile traces (it must see the op); in eager code the call itself,
    which saves the custom op's dispatch (tens of microseconds a call). Where an input
    requires grad, the forward that keeps its LSE for the backward."""
    if torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad):
        return attention_fwd_lse(q, k, v, causal, scale, None, None, causal_alignment)[0]
    if torch.compiler.is_compiling():
        return attention(q, k, v, causal, scale, None, None, causal_alignment)
    from wavefront.kernel.call import attention_plain, attention_with
    if scale is None and causal_alignment == "top_left":
        return attention_plain(q, k, v, causal)
    return attention_with(q, k, v, _values(causal, scale, causal_alignment))


def scaled_dot_product_attention(query, key, value, attn_mask=None, dropout_p=0.0,
                                 is_causal=False, scale=None, enable_gqa=False):
    """`torch.nn.functional.scaled_dot_product_attention`'s signature, run by wavefront.

    Supported: 4-D (batch, heads, seqlen, head_dim) bfloat16 or float16 CUDA tensors, head_dim
    64 or 128, `is_causal` (top-left aligned, as torch's), `scale`, `enable_gqa` (query heads a
    multiple of key/value heads). What it does not support it refuses by name: a mask tensor,
    dropout, GQA shapes without `enable_gqa`."""
    if attn_mask is not None:
        raise ValueError("attn_mask must be None: wavefront runs no mask tensor (is_causal=True "
                         "gives the causal mask); use torch's scaled_dot_product_attention for "
                         "other masks")
    if dropout_p != 0.0:
        raise ValueError(f"dropout_p must be 0.0 (wavefront has no dropout), got {dropout_p!r}")
    for name, t in (("query", query), ("key", key), ("value", value)):
        if not isinstance(t, torch.Tensor):
            raise ValueError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dim() != 4:
            raise ValueError(f"{name} must be 4-D (batch, heads, seqlen, head_dim), got shape "
                             f"{tuple(t.shape)}")
    if query.shape[1] != key.shape[1] and not enable_gqa:
        raise ValueError(f"query has {query.shape[1]} heads and key {key.shape[1]}: pass "
                         "enable_gqa=True for grouped-query attention, as torch asks")
    if not isinstance(is_causal, bool):
        raise ValueError(f"is_causal must be True or False, got {is_causal!r}")
    if scale is not None:
        from wavefront.argument_checks import scale_or_none
        scale = scale_or_none(scale)  # (a list would reach a cache key: unhashable)
    return _attention(query, key, value, is_causal, scale)


def hf_is_causal(module, kwargs) -> bool:
    """Whether a mask-less call is causal, as transformers' SDPA function decides: an
    `is_causal` the model passes, else the module's own (True where it has none)."""
    is_causal = kwargs.get("is_causal")
    return bool(getattr(module, "is_causal", True) if is_causal is None else is_causal)


def hf_attention_forward(module, query, key, value, attention_mask, scaling=None, dropout=0.0,
                         **kwargs):
    """An attention function for Hugging Face transformers' registry: self-attention, causal
    where the module is (decoders; encoders set `is_causal = False`), with query, key and
    value as (batch, heads, seqlen, head_dim). Returns (output as (batch, seqlen, heads,
    head_dim), None), as transformers' SDPA function does.

    Register it with `register_with_transformers()`, which also registers `hf_mask` as the
    mask builder for its name. The masks it runs:
    - None: the kernel's own mask, causal or none as the module is, top-left as the torch
      `is_causal` transformers' SDPA function passes: transformers skips the mask of a query
      shorter than its key only at the prefill of an empty StaticCache, whose slots past the
      query are empty (`_ignore_causal_mask_sdpa`), and top-left leaves them unseen
      (bottom-right read them: tests/test_serving_generate.py);
    - a `SequencesMask` (what `hf_mask` builds for padded batches, and for transformers'
      padding-free batches, sequences packed in a row with position_ids restarting at
      each): a packed batch of the sequences' tokens (`attention_varlen`, cu_seqlens on the
      GPU), zero at padding tokens;
    - a boolean (1, 1, T, T) tensor that is exactly the causal mask of sequences packed in
      the row (checked once a forward): the same packed batch.
    Any other mask (sliding windows, a padded batch with a cache, ...) is refused by name
    rather than ignored."""
    if dropout:
        raise ValueError(f"dropout must be 0 (wavefront has no dropout), got {dropout!r}")
    if attention_mask is None:
        causal = hf_is_causal(module, kwargs) and query.shape[2] > 1  # one query: every key
        out = _attention(query, key, value, causal, scaling)
        return out.transpose(1, 2), None
    if isinstance(attention_mask, SequencesMask):
        if not attention_mask.fits(query, key):
            raise ValueError(f"attention_mask: {attention_mask!r} was built for another batch "
                             f"than query {tuple(query.shape)} and key {tuple(key.shape)}")
        return attention_mask.run(query, key, value, scaling), None
    cu_seqlens = _packed_sequences(attention_mask, query, key)
    if cu_seqlens is None:
        raise ValueError("attention_mask must be None, or the causal mask of sequences packed "
                         "in one row (position_ids restarting at each): wavefront applies the "
                         "causal mask itself and runs no other mask tensor (padded batches "
                         "run without a cache, through the mask builder that "
                         "register_with_transformers registers)")
    return SequencesMask(cu_seqlens, 1, query.shape[2]).run(query, key, value, scaling), None


class SequencesMask:
    """A mask over sequences laid in a batch's rows, as their bounds: each sequence causal
    within itself (or, `causal=False`, all of it seen by all of it: an encoder's) and blind
    to the others; several may share a row (packed), and tokens of none (padding) attend to
    nothing of theirs. What `hf_mask` hands a transformers model's layers in place of the
    (batch, 1, T, T) boolean tensor (1 GiB a row at 32k tokens, 4 GiB at 64k)."""

    __slots__ = ("cu_seqlens", "batch", "rows", "tokens", "causal")

    def __init__(self, cu_seqlens: torch.Tensor, batch: int, rows: int, tokens=None,
                 causal: bool = True):
        self.cu_seqlens = cu_seqlens  # int32 on the GPU: 0, then each sequence's end
        self.batch, self.rows = batch, rows
        # the sequences' tokens in order, as indices into the batch's batch x rows tokens,
        # where padding leaves some out; None: every token, row after row
        self.tokens = tokens
        self.causal = causal

    def fits(self, query, key) -> bool:
        """Whether query and key (batch, heads, seqlen, head_dim) are a batch of this
        mask's shape, on its device."""
        return (query.shape[0] == key.shape[0] == self.batch
                and query.shape[2] == key.shape[2] == self.rows
                and self.cu_seqlens.device == query.device)

    def run(self, query, key, value, scale):
        """Attention over the sequences: the output as (batch, seqlen, heads, head_dim),
        zero at tokens of no sequence."""
        from wavefront.kernel.varlen import attention_varlen as launch_varlen
        batch, heads, rows, head_dim = query.shape
        # (batch x rows, heads, D): a view where the heads were split off the last dimension
        # of a (batch, rows, heads x D) projection, as transformers' attention modules do
        tokens = [x.transpose(1, 2).reshape(batch * rows, x.shape[1], head_dim)
                  for x in (query, key, value)]
        if self.tokens is not None:  # the real tokens' rows, contiguous
            tokens = [x.index_select(0, self.tokens) for x in tokens]
        if torch.is_grad_enabled() and any(x.requires_grad for x in tokens):
            # training: the op, whose autograd formula runs the backward (the direct call's
            # output would carry no gradient back)
            out = attention_varlen(*tokens, self.cu_seqlens, self.cu_seqlens, rows, rows,
                                   self.causal, scale, None, None)
        else:
            out = launch_varlen(*tokens, self.cu_seqlens, self.cu_seqlens, causal=self.causal,
                                scale=scale)
        if self.tokens is not None:
            out = out.new_zeros(batch * rows, heads, head_dim).index_copy_(0, self.tokens, out)
        return out.view(batch, rows, heads, head_dim)

    def __repr__(self):
        return (f"SequencesMask({self.cu_seqlens.numel() - 1} "
                f"{'causal' if self.causal else 'bidirectional'} sequences in "
                f"{self.batch} x {self.rows} tokens)")


def hf_mask(batch_size, q_length, kv_length, q_offset=0, kv_offset=0,
            attention_mask=None, allow_is_causal_skip=True, **kwargs):
    """transformers' mask builder for wavefront (`AttentionMaskInterface`; its arguments are
    those of `transformers.masking_utils.sdpa_mask`): SDPA's boolean mask, except for the
    masks wavefront runs from their bounds. Where a forward without a cache needs a mask
    (padding, or transformers' padding-free batches), the mask is built and checked a block
    of rows at a time, never whole: if every real token's row (`attention_mask`, the 2D
    padding mask: 1 for real tokens) is exactly the mask of a run of consecutive real
    tokens, causal (decoders) or whole (encoders: transformers asks for their mask with
    `allow_is_bidirectional_skip`), and those runs are the sequences, the layers get a
    `SequencesMask` (or None: one sequence a row, no padding, the kernel's own mask); else
    SDPA's tensor, which the attention function refuses by name."""
    from transformers.masking_utils import sdpa_mask
    kwargs["attention_mask"] = attention_mask
    # SDPA's mask, whole: what any mask this function does not run from its bounds gets
    sdpas = functools.partial(sdpa_mask, batch_size, q_length, kv_length, q_offset, kv_offset,
                              allow_is_causal_skip=allow_is_causal_skip, **kwargs)
    causal = "allow_is_bidirectional_skip" not in kwargs  # (only the bidirectional asks pass it)
    if (q_length != kv_length or type(q_offset) is not int or type(kv_offset) is not int
            or q_offset != 0 or kv_offset != 0 or torch.compiler.is_compiling()):
        return sdpas()
    real = None
    if attention_mask is not None:
        real = attention_mask[:, :kv_length].to(torch.bool)
        if tuple(real.shape) != (batch_size, kv_length):
            return sdpas()
        if bool(real.all()):
            real = None
    skip = allow_is_causal_skip if causal else kwargs["allow_is_bidirectional_skip"]
    if skip and real is None:  # transformers' rule: no mask needed
        return sdpas()

    def rows(first, last):
        block = sdpa_mask(batch_size, last - first, kv_length, first, 0,
                          **{**kwargs, "allow_is_causal_skip": False,
                             "allow_is_bidirectional_skip": False})
        return None if block is None else block[:, 0]
    bounds = _sequence_bounds(rows, q_length, batch_size, real, causal)
    if bounds is None or bounds[0].numel() < 2:  # (< 2: nothing but padding)
        return sdpas()
    cu_seqlens, tokens = bounds
    if tokens is None and cu_seqlens.numel() == batch_size + 1:
        return None  # one sequence a row: the kernel's own mask
    return SequencesMask(cu_seqlens, batch_size, q_length, tokens, causal)


# Cells of a mask built or checked at a time (`_sequence_bounds`: as many rows of every batch
# row as fit): a 32k-token row's whole square takes 1 GiB of booleans, and the check would take
# that again; each block costs a few dozen small operations of host time, so a BERT-sized
# batch (64 x 512 x 512) is one block.
_MASK_CELLS_AT_A_TIME = 1 << 26


def _sequence_bounds(rows_of, rows: int, batch: int = 1, real=None, causal: bool = True):
    """Where a boolean (batch, rows, rows) mask (True: attend; `rows_of(first, last)` gives
    its rows [first, last) of every batch row) is the mask of sequences of consecutive real
    tokens (`real`: (batch, rows) booleans, None: all real), each causal within itself (or,
    not `causal`, all of it seen by all of it), blind to each other: (cu_seqlens, int32, of
    the sequences in order; their tokens' indices into the batch x rows tokens, None where
    every token is real); else None. Rows of tokens not real are not checked: they
    belong to no sequence.

    A real token's row must be True on one run of columns and nowhere else: from its
    sequence's first token to itself (causal) or to its sequence's last token. A token
    starts its sequence (the run starts at it) or continues the one of the real token
    before it (the same run start, and end, if not causal); a sequence ends where the run
    ends. The mask is read back once, at the end."""
    if rows < 1 or batch < 1:
        return None
    exact, starts, ends = None, [], []
    columns = None
    step = max(1, _MASK_CELLS_AT_A_TIME // (batch * rows))
    for first in range(0, rows, step):
        last = min(rows, first + step)
        block = rows_of(first, last)
        if (not isinstance(block, torch.Tensor) or block.dtype != torch.bool
                or tuple(block.shape) != (batch, last - first, rows)):
            return None
        if columns is None:
            columns = torch.arange(rows, device=block.device)
        start = block.to(torch.uint8).argmax(dim=-1)  # argmax: the first True column
        # (one run of Trues, checked below, ends where its count says)
        end = (columns[first:last].expand_as(start) if causal
               else start + block.sum(dim=-1) - 1)
        expected = (columns >= start[..., None]) & (columns <= end[..., None])
        same = block == expected
        if real is not None:
            same |= ~real[:, first:last, None]
        same = same.all()
        exact = same if exact is None else exact & same
        starts.append(start)
        ends.append(end)
    start, end = torch.cat(starts, dim=1), torch.cat(ends, dim=1)
    real_rows = torch.ones_like(start, dtype=torch.bool) if real is None else real
    begins = start == columns
    continues = (start[:, 1:] == start[:, :-1]) & real_rows[:, :-1] & real_rows[:, 1:]
    if not causal:
        continues &= end[:, 1:] == end[:, :-1]
    ok = torch.cat([begins[:, :1], begins[:, 1:] | continues], dim=1)
    if not causal:  # a run holds its own token, and its sequence ends where the run ends
        ends_here = end == columns
        ends_here[:, :-1] |= continues
        ok &= (start <= columns) & (columns <= end) & ends_here
    exact &= (ok | ~real_rows).all()
    if not bool(exact):
        return None
    if real is None:
        tokens, begins = None, begins.reshape(-1)
        count = batch * rows
    else:
        tokens = torch.nonzero(real.reshape(-1)).reshape(-1)
        begins = begins.reshape(-1)[tokens]
        count = begins.numel()
    first_tokens = torch.nonzero(begins).reshape(-1)
    cu_seqlens = torch.cat([first_tokens, first_tokens.new_full((1,), count)]).to(torch.int32)
    return cu_seqlens, tokens


# The last packed mask tensor checked (`_packed_sequences`): every layer of a forward passes
# the same mask, so the check and the cu_seqlens are made once a forward.
_packed_checked: list = []


def _packed_sequences(mask, query, key):
    """cu_seqlens (int32, on the GPU) of the sequences packed in a one-row batch whose mask
    (a boolean (1, 1, T, T) tensor, True: attend) is exactly each one's causal mask and
    nothing across (`_sequence_bounds`); else None. Reads the mask back once a forward:
    the result is kept for the same unmodified tensor."""
    if not isinstance(mask, torch.Tensor) or torch.compiler.is_compiling():
        return None
    rows = query.shape[2]
    if (query.shape[0] != 1 or key.shape[2] != rows or mask.dtype != torch.bool
            or tuple(mask.shape) != (1, 1, rows, rows) or mask.device != query.device):
        return None
    from wavefront.kernel.arrays import stamp_matches, tensors_stamp
    for stamp, cu_seqlens in _packed_checked:
        if stamp_matches(stamp, mask):
            return cu_seqlens
    bounds = _sequence_bounds(lambda first, last: mask[:, 0, first:last], rows)
    cu_seqlens = None if bounds is None else bounds[0]
    if cu_seqlens is not None:
        # (inference tensors keep no version counter, and get no stamp: checked every call)
        _packed_checked[:] = [(tensors_stamp(mask), cu_seqlens)]
    return cu_seqlens


def register_with_transformers(name: str = "wavefront", forward=hf_attention_forward) -> str:
    """Make `attn_implementation=name` route a transformers model's attention to wavefront
    (`forward`: the attention function, `hf_attention_forward` or a wrapper of it)."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface
    AttentionInterface.register(name, forward)
    AttentionMaskInterface.register(name, hf_mask)
    return name
