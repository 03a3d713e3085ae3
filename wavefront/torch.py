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
           "hf_attention_forward", "hf_mask", "PackedCausalMask", "register_with_transformers"]


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

    Register it with `register_with_transformers()`, which also registers `hf_mask` as the
    mask builder for its name. The masks it runs:
    - None: the causal mask, the kernel's own;
    - a `PackedCausalMask` (what `hf_mask` builds for transformers' padding-free batches:
      sequences packed in one row, position_ids restarting at each): a packed batch
      (`attention_varlen`, cu_seqlens on the GPU);
    - a boolean (1, 1, T, T) tensor that is exactly that packed mask (checked once a
      forward): the same packed batch.
    Any other mask (padding, sliding windows, ...) is refused by name rather than ignored."""
    if dropout:
        raise ValueError(f"dropout must be 0 (wavefront has no dropout), got {dropout!r}")
    if attention_mask is not None:
        if isinstance(attention_mask, PackedCausalMask):
            cu_seqlens = attention_mask.bounds_for(query, key)
        else:
            cu_seqlens = _packed_sequences(attention_mask, query, key)
        if cu_seqlens is None:
            raise ValueError("attention_mask must be None, or the causal mask of sequences "
                             "packed in one row (position_ids restarting at each): wavefront "
                             "applies the causal mask itself and runs no other mask tensor "
                             "(padding masks are not supported)")
        packed = [x[0].transpose(0, 1) for x in (query, key, value)]  # (seqlen, heads, D)
        from wavefront.kernel.launcher import attention_varlen as launch_varlen
        out = launch_varlen(*packed, cu_seqlens, cu_seqlens, causal=True, scale=scaling)
        return out.unsqueeze(0), None
    causal = bool(getattr(module, "is_causal", True)) and query.shape[2] > 1
    out = _attention(query, key, value, causal, scaling)
    return out.transpose(1, 2), None


class PackedCausalMask:
    """The mask of sequences packed in one row, each causal within itself and blind to the
    others, as its bounds: what `hf_mask` hands a transformers model's layers in place of
    the (1, 1, T, T) boolean tensor (1 GiB at 32k tokens, 4 GiB at 64k)."""

    __slots__ = ("cu_seqlens", "rows")

    def __init__(self, cu_seqlens: torch.Tensor, rows: int):
        self.cu_seqlens = cu_seqlens  # int32, on the GPU: 0, then each sequence's end
        self.rows = rows

    def bounds_for(self, query, key):
        """The cu_seqlens, where query and key are a one-row batch of this mask's rows; else
        None (the mask of another batch)."""
        if (query.shape[0] != 1 or query.shape[2] != self.rows or key.shape[2] != self.rows
                or self.cu_seqlens.device != query.device):
            return None
        return self.cu_seqlens

    def __repr__(self):
        return f"PackedCausalMask({self.cu_seqlens.numel() - 1} sequences, {self.rows} rows)"


def hf_mask(batch_size, q_length, kv_length, q_offset=0, kv_offset=0,
            allow_is_causal_skip=True, **kwargs):
    """transformers' mask builder for wavefront (`AttentionMaskInterface`; its arguments are
    those of `transformers.masking_utils.sdpa_mask`): SDPA's boolean mask, except for the
    one mask wavefront runs from its bounds. Where transformers asks for a mask it may not
    skip over one row and no cache (its padding-free batches, among others), the mask is
    built and checked a block of rows at a time, never whole: if it is exactly each of
    consecutive sequences' causal mask and nothing across, the layers get a
    `PackedCausalMask` (or None: one sequence, the plain causal mask); else SDPA's tensor,
    which the attention function refuses by name."""
    from transformers.masking_utils import sdpa_mask
    if (not allow_is_causal_skip and batch_size == 1 and q_length == kv_length
            and type(q_offset) is int and type(kv_offset) is int and q_offset == kv_offset == 0
            and not torch.compiler.is_compiling()):
        def rows(first, last):
            block = sdpa_mask(1, last - first, kv_length, first, 0, allow_is_causal_skip=False,
                              **kwargs)
            return None if block is None else block[0, 0]
        cu_seqlens = _block_causal_bounds(rows, q_length)
        if cu_seqlens is not None:
            return None if cu_seqlens.numel() == 2 else PackedCausalMask(cu_seqlens, q_length)
    return sdpa_mask(batch_size, q_length, kv_length, q_offset, kv_offset,
                     allow_is_causal_skip=allow_is_causal_skip, **kwargs)


# Rows of a mask built or checked at a time (`_block_causal_bounds`): the whole square takes
# 1 GiB of booleans at 32k tokens, and the check would take that again.
_MASK_ROWS_AT_A_TIME = 2048


def _block_causal_bounds(rows_of, rows: int):
    """cu_seqlens (int32, on the mask's device) of consecutive sequences, if the boolean
    (rows, rows) mask (True: attend) whose rows [first, last) `rows_of(first, last)` returns
    is exactly each one's causal mask and False across them; else None. Each row's sequence
    starts at its first True column; the mask must then be True from there to the diagonal
    and nowhere else, and each row's start must be the row above's or the row itself. The
    mask is read back once, at the end."""
    if rows < 1:
        return None
    exact, starts = None, []
    columns = None
    for first in range(0, rows, _MASK_ROWS_AT_A_TIME):
        last = min(rows, first + _MASK_ROWS_AT_A_TIME)
        block = rows_of(first, last)
        if (not isinstance(block, torch.Tensor) or block.dtype != torch.bool
                or tuple(block.shape) != (last - first, rows)):
            return None
        if columns is None:
            columns = torch.arange(rows, device=block.device)
        start = block.to(torch.uint8).argmax(dim=1)  # argmax: the first True column
        expected = ((columns[None, :] >= start[:, None])
                    & (columns[None, :] <= columns[first:last, None]))
        same = (block == expected).all()
        exact = same if exact is None else exact & same
        starts.append(start)
    start = torch.cat(starts)
    exact &= ((start[1:] == start[:-1]) | (start[1:] == columns[1:])).all()
    if not bool(exact):
        return None
    begins = torch.nonzero(start == columns).reshape(-1)
    return torch.cat([begins, begins.new_full((1,), rows)]).to(torch.int32)


# The last packed mask tensor checked (`_packed_sequences`): every layer of a forward passes
# the same mask, so the check and the cu_seqlens are made once a forward.
_packed_checked: list = []


def _packed_sequences(mask, query, key):
    """cu_seqlens (int32, on the GPU) of the sequences packed in a one-row batch whose mask
    (a boolean (1, 1, T, T) tensor, True: attend) is exactly each one's causal mask and
    nothing across (`_block_causal_bounds`); else None. Reads the mask back once a forward:
    the result is kept for the same unmodified tensor."""
    if not isinstance(mask, torch.Tensor) or torch.compiler.is_compiling():
        return None
    rows = query.shape[2]
    if (query.shape[0] != 1 or key.shape[2] != rows or mask.dtype != torch.bool
            or tuple(mask.shape) != (1, 1, rows, rows) or mask.device != query.device):
        return None
    from wavefront.kernel.launcher import stamp_matches, tensors_stamp
    for stamp, cu_seqlens in _packed_checked:
        if stamp_matches(stamp, mask):
            return cu_seqlens
    cu_seqlens = _block_causal_bounds(lambda first, last: mask[0, 0, first:last], rows)
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
