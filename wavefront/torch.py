"""wavefront for PyTorch users: a custom op that `torch.compile` traces and CUDA graphs capture,
and an entry point shaped like `torch.nn.functional.scaled_dot_product_attention`.

    import wavefront.torch as wft
    out = wft.scaled_dot_product_attention(q, k, v, is_causal=True)   # q: (B, H, S, D)
    out = torch.ops.wavefront.attention(q, k, v, True, None, None, None)

The op is `wavefront::attention(q, k, v, causal, scale, schedule, tiles) -> Tensor`, with a fake
(meta) implementation, so a compiled model keeps it in its graph instead of breaking the graph
around an opaque Python call. It runs on the caller's current stream. Forward only: no
backward is registered.

Under a CUDA graph: call the op once before capturing (the first call of a shape compiles the
kernel and uploads its work table, neither of which a capture allows); replays then launch the
same kernel with the same work table, and the dynamic schedules' counter is reset by the
kernel itself, so every replay is a fresh launch.
"""
from __future__ import annotations

from typing import Optional

import torch

__all__ = ["attention", "attention_varlen", "scaled_dot_product_attention",
           "hf_attention_forward",
           "register_with_transformers"]


@torch.library.custom_op("wavefront::attention", mutates_args=(), device_types="cuda")
def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False,
              scale: Optional[float] = None, schedule: Optional[str] = None,
              tiles: Optional[str] = None) -> torch.Tensor:
    """softmax(q k^T * scale) v per (batch, head); q (B, H, S_q, D), k and v (B, H_kv, S_kv, D),
    H a multiple of H_kv. `schedule` and `tiles` as in `wavefront.attention` (None: the tuned
    configuration for this GPU and shape)."""
    from wavefront.kernel.launcher import attention as launch_attention
    return launch_attention(q, k, v, causal=causal, scale=scale, schedule=schedule,
                            tiles=tiles)


@attention.register_fake
def _attention_fake(q, k, v, causal=False, scale=None, schedule=None, tiles=None):
    # The output is always a new contiguous (B, H, S_q, D) tensor of q's dtype and device.
    return q.new_empty(q.shape)


@torch.library.custom_op("wavefront::attention_varlen", mutates_args=(), device_types="cuda")
def attention_varlen(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                     cu_seqlens_q: torch.Tensor, cu_seqlens_k: torch.Tensor,
                     max_seqlen_q: int, max_seqlen_k: int, causal: bool = False,
                     scale: Optional[float] = None, schedule: Optional[str] = None,
                     tiles: Optional[str] = None) -> torch.Tensor:
    """Packed sequences, FlashAttention's varlen interface: q (total_q, H, D), k and v
    (total_k, H_kv, D), cu_seqlens int32 (batch + 1). cu_seqlens on the GPU are read there
    (the work table is written from them on the call's stream: asynchronous, and a CUDA graph
    replays the call for the lengths they hold then; every schedule); on
    the CPU they are checked and the table is built on the host, once per lengths."""
    from wavefront.kernel.launcher import attention_varlen as launch_varlen
    return launch_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                         causal=causal, scale=scale, schedule=schedule, tiles=tiles)


@attention_varlen.register_fake
def _attention_varlen_fake(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                           causal=False, scale=None, schedule=None, tiles=None):
    return q.new_empty(q.shape)


def _attention(q, k, v, causal, scale):
    """The op where torch.compile traces (it must see the op); in eager code the call itself,
    which saves the custom op's dispatch (tens of microseconds a call)."""
    if torch.compiler.is_compiling():
        return attention(q, k, v, causal, scale, None, None)
    from wavefront.kernel.launcher import attention as launch_attention
    return launch_attention(q, k, v, causal=causal, scale=scale)


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
    return _attention(query, key, value, is_causal, scale)


def hf_attention_forward(module, query, key, value, attention_mask, scaling=None, dropout=0.0,
                         **kwargs):
    """An attention function for Hugging Face transformers' registry: the decoder's causal
    self-attention, with query, key and value as (batch, heads, seqlen, head_dim). Returns
    (output as (batch, seqlen, heads, head_dim), None), as transformers' SDPA function does.

    Register it with `register_with_transformers()`, which also registers SDPA's mask builder
    for "wavefront": that builder returns no mask where the mask is purely causal (the causal
    mask is then the kernel's own), and a tensor where there is padding, which is refused here
    by name rather than silently ignored."""
    if dropout:
        raise ValueError(f"dropout must be 0 (wavefront has no dropout), got {dropout!r}")
    if attention_mask is not None:
        raise ValueError("attention_mask must be None: wavefront applies the causal mask itself "
                         "and runs no mask tensor (padding masks are not supported)")
    causal = bool(getattr(module, "is_causal", True)) and query.shape[2] > 1
    out = _attention(query, key, value, causal, scaling)
    return out.transpose(1, 2), None


def register_with_transformers(name: str = "wavefront", forward=hf_attention_forward) -> str:
    """Make `attn_implementation=name` route a transformers model's attention to wavefront
    (`forward`: the attention function, `hf_attention_forward` or a wrapper of it)."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask
    AttentionInterface.register(name, forward)
    AttentionMaskInterface.register(name, sdpa_mask)
    return name
