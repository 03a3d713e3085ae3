"""Generation through transformers with wavefront's attention: the prefill through the
attention call (`wavefront.torch.hf_attention_forward`), every step that reads a KV cache
through the cache call (`wavefront.attention_with_kvcache`).

    import wavefront.serving as wfs
    name = wfs.register_with_transformers()          # "wavefront"
    model = LlamaForCausalLM.from_pretrained(..., attn_implementation=name)
    model.generate(ids, max_new_tokens=128)           # DynamicCache
    model.generate(ids, max_new_tokens=128, cache_implementation="static")  # compiled, graphed

A mask transformers skips means what SDPA's `is_causal` means, torch's top-left alignment,
not a cache's bottom-right one: at a StaticCache's prefill (an empty cache: transformers'
`_ignore_causal_mask_sdpa` skips the mask where the cache was empty, and its SDPA function
cuts the key to the query's length: transformers 5.17, integrations/sdpa_attention.py)
query i sees keys 0..i of the L slots, the rest empty.
Taking all L as valid there (as this module once did) read the empty slots: a small Llama's
greedy choice agreed with SDPA's at 0.625 of teacher-forced steps on an H200, 0.75 in float32
on the CPU (tests/test_serving_generate.py, where every call is compared with SDPA's).

What transformers hands the attention function at a step with a cache: query (B, H, S_q, D)
with the step's S_q new tokens, and key/value (B, H_kv, L, D) that already hold them, appended
by the cache. `route` decides from the shapes and the mask:
- S_q == L: a prefill without a cache; the attention call's own hook, unchanged;
- S_q < L, no mask: what transformers' SDPA function runs, torch's SDPA with `is_causal`
  where S_q > 1 (top-left: query i sees keys 0..i, the prefill of an empty StaticCache),
  without it where S_q == 1 (every key: a DynamicCache step, no padding). Both are the cache
  call, causal bottom-right (FlashAttention's convention: query i of S_q sees keys up to
  cache_seqlens - S_q + i), with cache_seqlens = S_q ("query": the first S_q keys, bottom-right
  equal to top-left) or = L ("key": the whole key) for every row; a module that is not causal
  (`is_causal`, SDPA's rule) with S_q > 1 is refused by name;
- S_q < L with a boolean (B, 1, S_q, L) mask (a StaticCache: L is its max length and the mask
  marks the valid keys; or a padded batch): cache_seqlens = one past each row's last key the
  last query attends to, computed on the GPU from the mask (no host sync, so a CUDA graph
  captures it and replays it with the step's mask). The mask must be that of the lengths
  (bottom-right causal, no holes); in eager code it is checked once a forward (one host sync
  per step, on the first layer); under torch.compile or a capture it cannot be, and a
  left-padded batch there would be run as if unpadded: use eager code for padded batches.

The key and value are handed to the cache call as (B, L, H_kv, D) views of transformers'
tensors (transposes, no copy). Where the cache call refuses such strided views, they are
copied (`.contiguous()`: a whole cache per layer per step; `cache_copies()` counts them and a
warning says so once): a cost this module reports rather than hides.
"""
from __future__ import annotations

import functools
import warnings
from dataclasses import dataclass
from typing import Optional

import torch

# (at the top, not in the function: torch.compile traces the attention function, and a module
# attribute is all it needs to read there)
import wavefront.torch as _wft

__all__ = ["hf_cache_attention_forward", "route", "Route", "cache_seqlens_from_mask",
           "register_with_transformers", "cache_copies"]


@dataclass(frozen=True)
class Route:
    """Where one attention call goes: `kind` "prefill" (the attention call's hook) or "cache"
    (the cache call); for "cache", where its lengths come from: "key" (every row the key's
    whole length), "query" (every row the query's length: top-left causal) or "mask" (each
    row's from the boolean mask)."""

    kind: str
    lengths: Optional[str] = None


def route(query_shape, key_shape, attention_mask, causal: bool = True) -> Route:
    """The routing decision from shapes, the mask and whether the module is causal (as
    transformers' SDPA function decides it) alone (no tensor is read): see the module's
    docstring. Raises ValueError, naming the argument, for what neither call runs."""
    if len(query_shape) != 4 or len(key_shape) != 4:
        raise ValueError(f"query and key must be 4-D (batch, heads, seqlen, head_dim), got "
                         f"{tuple(query_shape)} and {tuple(key_shape)}")
    s_q, s_kv = query_shape[2], key_shape[2]
    if s_q > s_kv:
        raise ValueError(f"query has {s_q} tokens and key {s_kv}: a query longer than its keys "
                         "is no self-attention with a cache")
    if s_q == s_kv:
        return Route("prefill")
    if attention_mask is None:
        if s_q == 1:  # one query sees every key, causal or not (SDPA: no is_causal)
            return Route("cache", "key")
        if not causal:
            raise ValueError(f"is_causal must be True with no attention_mask at a step with a "
                             f"cache ({s_q} queries, {s_kv} keys): wavefront's cache call runs "
                             "no bidirectional attention over a cache")
        # torch's is_causal, top-left: the first s_q keys, the rest unseen (an empty
        # StaticCache's slots at its prefill)
        return Route("cache", "query")
    if (isinstance(attention_mask, torch.Tensor) and attention_mask.dtype == torch.bool
            and attention_mask.dim() == 4
            and tuple(attention_mask.shape[2:]) == (s_q, s_kv)
            and attention_mask.shape[1] == 1
            and attention_mask.shape[0] in (1, query_shape[0])):
        return Route("cache", "mask")
    raise ValueError(f"attention_mask must be None or a boolean (batch, 1, {s_q}, {s_kv}) mask "
                     f"of the valid cache positions at a step with a cache, got "
                     f"{_describe(attention_mask)}")


def _describe(mask) -> str:
    if isinstance(mask, torch.Tensor):
        return f"a {mask.dtype} tensor of shape {tuple(mask.shape)}"
    return type(mask).__name__


def cache_seqlens_from_mask(mask: torch.Tensor, batch: int) -> torch.Tensor:
    """int32 (batch,): one past the last key each row's last query attends to, from a
    boolean (B or 1, 1, S_q, L) mask, on the mask's device, without a host sync."""
    last_row = mask[:, 0, -1, :]
    positions = torch.arange(1, mask.shape[-1] + 1, device=mask.device, dtype=torch.int32)
    lengths = (last_row.to(torch.int32) * positions).amax(dim=-1).to(torch.int32)
    return lengths.expand(batch).contiguous() if lengths.shape[0] != batch else lengths


def mask_matches_lengths(mask: torch.Tensor, lengths: torch.Tensor) -> bool:
    """Whether `mask` (boolean (B or 1, 1, S_q, L)) is exactly the bottom-right causal mask of
    the cache lengths `lengths`: query i of row b sees keys [0, lengths[b] - S_q + i]. One
    host sync."""
    s_q, s_kv = mask.shape[2], mask.shape[3]
    limit = lengths.view(-1, 1, 1) - s_q + torch.arange(s_q, device=mask.device).view(1, -1, 1)
    expected = torch.arange(s_kv, device=mask.device).view(1, 1, -1) <= limit
    return bool((mask[:, 0] == expected).all())


# The last mask checked (a forward hands every layer the same one): its stamp.
_checked_mask: list = []
# The lengths of a step without a mask (one for every row), made once per step for all
# layers: (key, tensor).
_full_lengths: list = []


def _lengths_of_every_row(batch: int, length: int, device) -> torch.Tensor:
    if torch.compiler.is_compiling():  # traced: the graph makes it (no Python state)
        return torch.full((batch,), length, dtype=torch.int32, device=device)
    key = (batch, length, device)
    if _full_lengths and _full_lengths[0][0] == key:
        return _full_lengths[0][1]
    lengths = torch.full((batch,), length, dtype=torch.int32, device=device)
    _full_lengths[:] = [(key, lengths)]
    return lengths


def _check_mask_once(mask: torch.Tensor, lengths: torch.Tensor) -> None:
    if torch.compiler.is_compiling() or (mask.is_cuda
                                         and torch.cuda.is_current_stream_capturing()):
        return
    from wavefront.kernel.arrays import stamp_matches, tensors_stamp
    if _checked_mask and stamp_matches(_checked_mask[0], mask):
        return
    if not mask_matches_lengths(mask, lengths):
        raise ValueError("attention_mask: not the mask of a cache's valid lengths (each row "
                         "sees its first keys up to the query's own position, bottom-right "
                         "causal, with no holes): a padded batch with a cache is not run by "
                         "wavefront; use transformers' sdpa for it")
    _checked_mask[:] = [tensors_stamp(mask)]


_copies = {"calls": 0, "bytes": 0}


def cache_copies() -> dict:
    """How often the cache call refused transformers' strided key/value views and they were
    copied, and the bytes copied (a copy of the whole cache each time)."""
    return dict(_copies)


# Whether the cache call takes transformers' (B, L, H_kv, D) views as they are: None until the
# first call tells.
_views_taken: list = [None]


# (every device: the cache call itself refuses what it cannot run, by name)
@torch.library.custom_op("wavefront::hf_kvcache_attention", mutates_args=())
def kvcache_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                      cache_seqlens: torch.Tensor, scale: Optional[float] = None) -> torch.Tensor:
    """The cache call on transformers' layout: q (B, H, S_q, D), k and v (B, H_kv, L, D)
    holding the new tokens already, cache_seqlens int32 (B,) the valid keys of each row,
    causal bottom-right -> (B, S_q, H, D), transformers' attention output layout."""
    return _cache_call(q, k, v, cache_seqlens, scale)


def _cache_call(q, k, v, cache_seqlens, scale):
    """`kvcache_attention`'s body, which eager code calls without the op's dispatch."""
    import wavefront
    call = functools.partial(wavefront.attention_with_kvcache, cache_seqlens=cache_seqlens,
                             causal=True, scale=scale)
    q, k, v = (x.transpose(1, 2) for x in (q, k, v))  # views: (B, S, heads, D)
    if _views_taken[0] is not False:
        try:
            out = call(q, k, v)
            _views_taken[0] = True
            return out
        except ValueError as exc:
            if _views_taken[0]:  # views worked before: this refusal is about something else
                raise
            try:  # the layout, or something else? The copies tell.
                out = _copied(call, q, k, v)
            except ValueError:
                raise exc from None
            warnings.warn(f"wavefront.attention_with_kvcache refused transformers' strided "
                          f"cache views ({exc}); copying the key and value cache at every "
                          "call instead (the whole cache, every layer, every step)",
                          stacklevel=2)
            _views_taken[0] = False
            return out
    return _copied(call, q, k, v)


def _copied(call, q, k, v):
    """The cache call on contiguous copies of the views, counted in `cache_copies()`."""
    out = call(q.contiguous(), k.contiguous(), v.contiguous())
    _copies["calls"] += 1
    _copies["bytes"] += 2 * k.numel() * k.element_size()
    return out


@kvcache_attention.register_fake
def _kvcache_attention_fake(q, k, v, cache_seqlens, scale=None):
    b, h, s_q, d = q.shape
    return q.new_empty((b, s_q, h, d))


def hf_cache_attention_forward(module, query, key, value, attention_mask, scaling=None,
                               dropout=0.0, **kwargs):
    """transformers' attention function for generation: `route` decides between the
    prefill hook (`wavefront.torch.hf_attention_forward`) and the cache call. Returns
    (output (B, S_q, H, D), None) as transformers' SDPA function does."""
    decision = route(query.shape, key.shape, attention_mask, _wft.hf_is_causal(module, kwargs))
    if decision.kind == "prefill":
        return _wft.hf_attention_forward(module, query, key, value, attention_mask, scaling,
                                         dropout, **kwargs)
    if dropout:
        raise ValueError(f"dropout must be 0 (wavefront has no dropout), got {dropout!r}")
    batch = query.shape[0]
    if decision.lengths in ("key", "query"):
        shape = key.shape if decision.lengths == "key" else query.shape
        lengths = _lengths_of_every_row(batch, shape[2], key.device)
    else:
        lengths = cache_seqlens_from_mask(attention_mask, batch)
        _check_mask_once(attention_mask, lengths)
    if (torch.compiler.is_compiling() or torch.is_grad_enabled() and any(
            t.requires_grad for t in (query, key, value))
            or type(query) is not torch.Tensor or torch._C._len_torch_dispatch_stack()
            or torch._C._is_torch_function_mode_enabled()):
        # traced, differentiated, a tensor subclass or a mode that must see the op: the op
        return kvcache_attention(query, key, value, lengths, scaling), None
    # Eager and without gradients (generate): the op's body. The op is what torch.compile
    # traces; called eagerly its dispatch (autograd's, and the backend's wrapper that turns
    # dynamo off) added 53 ms to the cache call's 278 ms over 508 calls of a profiled 4-layer
    # DynamicCache generate on an H200 (scripts/profile_cache_call.py --mode generate)
    return _cache_call(query, key, value, lengths, scaling), None


def register_with_transformers(name: str = "wavefront") -> str:
    """Make `attn_implementation=name` run prefill and cached steps through wavefront
    (`wavefront.torch.register_with_transformers` with `hf_cache_attention_forward`)."""
    return _wft.register_with_transformers(name, forward=hf_cache_attention_forward)
