"""The PyTorch layer without a GPU: the ops' schemas and fake implementations (what
torch.compile traces with), a traced graph that keeps the op as one node, and the refusals of
the SDPA-shaped entry point and the transformers hook. Skips where torch is not installed."""
import pytest

torch = pytest.importorskip("torch")
wft = pytest.importorskip("wavefront.torch")

from torch._subclasses.fake_tensor import FakeTensorMode  # noqa: E402


def test_the_ops_have_the_schemas_users_call():
    assert str(torch.ops.wavefront.attention.default._schema) == (
        "wavefront::attention(Tensor q, Tensor k, Tensor v, bool causal=False, "
        "float? scale=None, str? schedule=None, str? tiles=None, "
        "str causal_alignment=\"top_left\") -> Tensor")
    schema = str(torch.ops.wavefront.attention_varlen.default._schema)
    assert "Tensor cu_seqlens_q, Tensor cu_seqlens_k, SymInt max_seqlen_q" in schema


@pytest.mark.parametrize("heads,kv_heads,seqlen_q,seqlen_k", [(8, 2, 100, 100),
                                                             (4, 4, 1, 300)])
def test_fake_implementation_gives_the_output_a_real_call_gives(heads, kv_heads, seqlen_q,
                                                                seqlen_k):
    with FakeTensorMode():
        q = torch.empty(2, heads, seqlen_q, 64, dtype=torch.bfloat16, device="cuda")
        k = torch.empty(2, kv_heads, seqlen_k, 64, dtype=torch.bfloat16, device="cuda")
        out = torch.ops.wavefront.attention(q, k, k, True, None, None, None)
        packed = torch.empty(30, heads, 128, dtype=torch.float16, device="cuda")
        cu = torch.tensor([0, 10, 30], dtype=torch.int32)
        varlen = torch.ops.wavefront.attention_varlen(packed, packed, packed, cu, cu, 20, 20,
                                                      False, None, None, None)
    assert (tuple(out.shape), out.dtype, out.device.type) == (tuple(q.shape), q.dtype, "cuda")
    assert out.is_contiguous()
    assert (tuple(varlen.shape), varlen.dtype) == ((30, heads, 128), torch.float16)


def test_a_traced_model_keeps_the_op_as_one_node():
    """What torch.compile sees: tracing with fake tensors records the op itself, between the
    projections, rather than breaking the graph around an opaque call."""
    from torch.fx.experimental.proxy_tensor import make_fx

    def block(x, w):
        b, s, d = x.shape
        q = (x @ w).view(b, s, 4, d // 4).transpose(1, 2).contiguous()
        y = torch.ops.wavefront.attention(q, q, q, True, None, None, None)
        return y.transpose(1, 2).reshape(b, s, d) @ w
    # meta tensors: shapes without data, on a machine with no GPU
    x = torch.empty(2, 33, 256, dtype=torch.bfloat16, device="meta")
    w = torch.empty(256, 256, dtype=torch.bfloat16, device="meta")
    graph = make_fx(block)(x, w)
    targets = [str(n.target) for n in graph.graph.nodes if n.op == "call_function"]
    assert targets.count("wavefront.attention.default") == 1, targets


def test_sdpa_entry_point_refuses_by_name():
    q = torch.empty(1, 4, 16, 64, dtype=torch.bfloat16)
    k = torch.empty(1, 2, 16, 64, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="^attn_mask must be None"):
        wft.scaled_dot_product_attention(q, q, q, attn_mask=torch.ones(16, 16, dtype=bool))
    with pytest.raises(ValueError, match="^dropout_p must be 0.0"):
        wft.scaled_dot_product_attention(q, q, q, dropout_p=0.5)
    with pytest.raises(ValueError, match="enable_gqa=True"):
        wft.scaled_dot_product_attention(q, k, k)
    with pytest.raises(ValueError, match="^key must be 4-D"):
        wft.scaled_dot_product_attention(q, k[0], k)
    with pytest.raises(ValueError, match="^value must be a torch.Tensor"):
        wft.scaled_dot_product_attention(q, q, [1.0])
    with pytest.raises(ValueError, match="^is_causal must be True or False"):
        wft.scaled_dot_product_attention(q, q, q, is_causal="yes")


def test_transformers_hook_refuses_masks_and_dropout():
    q = torch.empty(1, 4, 16, 64, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="^attention_mask must be None"):
        wft.hf_attention_forward(object(), q, q, q, torch.ones(1, 1, 16, 16, dtype=bool))
    with pytest.raises(ValueError, match="^attention_mask must be None"):  # not packed
        wft.hf_attention_forward(object(), q, q, q, torch.ones(1, 1, 16, 16, dtype=bool),
                                 position_ids=torch.arange(16)[None])
    with pytest.raises(ValueError, match="^dropout must be 0"):
        wft.hf_attention_forward(object(), q, q, q, None, dropout=0.1)


def test_transformers_hook_runs_causal_as_transformers_sdpa_decides(monkeypatch):
    """With no mask, the hook runs causal where transformers' SDPA function would: an
    `is_causal` the model passes, else the module's attribute (True where it has none), and
    never for one query row (a decoding step); top-left as torch's is_causal that function
    passes, also where the query is shorter (transformers skips the mask there only at the
    prefill of an empty StaticCache, whose empty slots top-left leaves unseen)."""
    import inspect
    calls = []
    alignments = []
    # what the hook passes, or what the real function defaults to where it passes nothing
    real_default = inspect.signature(wft._attention).parameters[
        "causal_alignment"].default
    monkeypatch.setattr(wft, "_attention", lambda q, k, v, causal, scale, causal_alignment=None: (
        calls.append(causal), alignments.append(causal_alignment or real_default), q)[2])

    class Module:
        pass
    encoder = Module()
    encoder.is_causal = False
    q = torch.empty(1, 4, 16, 64)
    for module, kwargs, want in ((Module(), {}, True), (encoder, {}, False),
                                 (encoder, {"is_causal": True}, True),
                                 (Module(), {"is_causal": False}, False)):
        calls.clear()
        wft.hf_attention_forward(module, q, q, q, None, **kwargs)
        assert calls == [want], (kwargs, calls)
        assert alignments[-1] == "top_left"
    calls.clear()
    wft.hf_attention_forward(Module(), q[:, :, :1], q, q, None)
    assert calls == [False]
    calls.clear()
    wft.hf_attention_forward(Module(), q[:, :, :5], q, q, None)
    assert calls == [True] and alignments[-1] == "top_left"
    wft.hf_attention_forward(encoder, q[:, :, :5], q, q, None)
    assert calls == [True, False] and alignments[-1] == "top_left"


def _packed_mask(lengths, causal=True):
    """transformers' mask for sequences packed in one row (True: attend): each sequence causal
    within itself, nothing across."""
    sequence = torch.repeat_interleave(torch.arange(len(lengths)), torch.tensor(lengths))
    rows = torch.arange(len(sequence))
    mask = sequence[:, None] == sequence[None, :]
    if causal:
        mask &= rows[:, None] >= rows[None, :]
    return mask[None, None]


def test_transformers_hook_reads_packed_sequences_from_their_mask(monkeypatch):
    """A padding-free batch's mask handed to the hook as a tensor: the hook runs the packed
    batch only where the mask is exactly each sequence's causal mask (checked a block of rows
    at a time), with the bounds the mask itself gives; anything else is refused as before.
    The bounds are made once for the same unmodified mask (a forward's layers), anew after a
    change."""
    monkeypatch.setattr(wft, "_MASK_CELLS_AT_A_TIME", 3 * 13)  # 3 rows
    lengths = [3, 5, 1, 4]
    rows = sum(lengths)
    q, k = torch.empty(1, 4, rows, 64), torch.empty(1, 2, rows, 64)
    mask = _packed_mask(lengths)
    cu_seqlens = wft._packed_sequences(mask, q, k)
    assert cu_seqlens.tolist() == [0, 3, 8, 9, 13] and cu_seqlens.dtype == torch.int32
    assert wft._packed_sequences(mask, q, k) is cu_seqlens
    mask.logical_and_(mask)  # an in-place write: made anew
    assert wft._packed_sequences(mask, q, k) is not cu_seqlens
    wrong = mask.clone()
    wrong[0, 0, 12, 4] = True  # one row sees another sequence
    hole = mask.clone()
    hole[0, 0, 7, 5] = False  # one row misses a token of its own sequence
    empty_row = mask.clone()
    empty_row[0, 0, 0, 0] = False
    for args in ((wrong, q, k), (hole, q, k), (empty_row, q, k),
                 (_packed_mask(lengths, causal=False), q, k), (mask.float(), q, k),
                 (mask.expand(2, 1, rows, rows), q.expand(2, -1, -1, -1),
                  k.expand(2, -1, -1, -1)), (mask[..., :-1, :-1], q, k)):
        assert wft._packed_sequences(*args) is None
    with pytest.raises(ValueError, match="^attention_mask must be None, or the causal mask"):
        wft.hf_attention_forward(object(), q, k, k, wrong)
    with torch.inference_mode():
        frozen_mask = _packed_mask(lengths)
    first = wft._packed_sequences(frozen_mask, q, k)
    assert first.tolist() == [0, 3, 8, 9, 13]
    assert wft._packed_sequences(frozen_mask, q, k) is not first  # no counter


@pytest.mark.parametrize("causal", [True, False])
def test_sequence_bounds_find_every_sequence_or_none(monkeypatch, causal):
    """`_sequence_bounds` on random packings, causal or bidirectional, whatever the block of
    rows: the bounds the mask was made from; None for any single cell flipped, unless it is
    in the row of a padding token (no sequence's: not read); and None for the other kind of
    mask wherever a sequence is longer than one token."""
    generator = torch.Generator().manual_seed(3)
    for cells in (1, 40, 4096):  # a row at a time (rows are 1-48 cells), a few, all
        monkeypatch.setattr(wft, "_MASK_CELLS_AT_A_TIME", cells)
        for _ in range(6):
            sequences = int(torch.randint(1, 7, (1,), generator=generator))
            lengths = torch.randint(1, 9, (sequences,), generator=generator).tolist()
            mask = _packed_mask(lengths, causal)[:, 0]
            rows = mask.shape[-1]

            def bounds(mask, *args, causal=causal):
                return wft._sequence_bounds(lambda first, last: mask[:, first:last], rows,
                                            *args, causal=causal)
            cu_seqlens, tokens = bounds(mask)
            assert cu_seqlens.tolist() == [0, *torch.tensor(lengths).cumsum(0).tolist()]
            assert tokens is None
            assert (bounds(mask, causal=not causal) is None) == (max(lengths) > 1)
            i, j = torch.randint(0, rows, (2,), generator=generator).tolist()
            flipped = mask.clone()
            flipped[0, i, j] = ~flipped[0, i, j]
            assert bounds(flipped) is None
            # the last sequence's tokens made padding: the others' bounds, that row free
            real = torch.ones(1, rows, dtype=torch.bool)
            real[0, rows - lengths[-1]:] = False
            padded = bounds(flipped, 1, real)
            if i < rows - lengths[-1]:
                assert padded is None
            else:
                assert padded[0].tolist() == cu_seqlens[:-1].tolist()
                assert padded[1].tolist() == list(range(rows - lengths[-1]))


def _fake_sdpa_mask(requested):
    """transformers' `sdpa_mask` as documented (a (batch, 1, q_length, kv_length) boolean
    mask of `mask_function` and the padding mask at the rows from q_offset; None where a
    causal mask may be skipped), noting the rows of every mask it builds."""
    def sdpa_mask(batch_size, q_length, kv_length, q_offset=0, kv_offset=0,
                  mask_function=None, attention_mask=None, allow_is_causal_skip=True,
                  allow_is_bidirectional_skip=False, **kwargs):
        if ((allow_is_causal_skip or allow_is_bidirectional_skip)
                and (attention_mask is None or attention_mask.all())):
            return None
        requested.append(q_length)
        b_idx = torch.arange(batch_size)[:, None, None, None]
        q_idx = torch.arange(q_length)[None, None, :, None] + q_offset
        kv_idx = torch.arange(kv_length)[None, None, None, :] + kv_offset
        mask = mask_function(b_idx, 0, q_idx, kv_idx)
        if attention_mask is not None:
            mask = mask & attention_mask.bool()[b_idx, kv_idx]
        return mask.expand(batch_size, 1, q_length, kv_length)
    return sdpa_mask


def _causal(b, h, q_idx, kv_idx):
    return kv_idx <= q_idx


def test_the_transformers_mask_builder_hands_packed_batches_their_bounds(monkeypatch):
    """`hf_mask` with transformers' `sdpa_mask` stood in for (transformers is not a test
    dependency): for a padding-free batch (its mask function: causal and the same
    sequence), the layers get a `SequencesMask` of the sequences' bounds, the mask built
    a block of rows at a time and never whole; one sequence gets None (the kernel's causal
    mask); any other mask (a sliding window) gets SDPA's tensor, which the hook refuses; a
    mask that may be skipped is left to transformers' rule."""
    requested = _fake_transformers(monkeypatch)
    monkeypatch.setattr(wft, "_MASK_CELLS_AT_A_TIME", 4 * 13)  # 4 rows
    lengths = [3, 5, 1, 4]
    rows = sum(lengths)
    sequence = torch.repeat_interleave(torch.arange(len(lengths)), torch.tensor(lengths))

    def packed(b, h, q_idx, kv_idx):
        return (kv_idx <= q_idx) & (sequence[q_idx] == sequence[kv_idx])

    def sliding(b, h, q_idx, kv_idx):
        return (kv_idx <= q_idx) & (kv_idx > q_idx - 3)

    def build(mask_function, batch=1, skip=False):
        return wft.hf_mask(batch, rows, rows, mask_function=mask_function,
                           allow_is_causal_skip=skip)
    got = build(packed)
    assert isinstance(got, wft.SequencesMask) and got.tokens is None
    assert got.cu_seqlens.tolist() == [0, 3, 8, 9, 13] and (got.batch, got.rows) == (1, rows)
    assert max(requested) == 4 and sum(requested) == rows  # never the whole square
    q, k = torch.empty(1, 4, rows, 64), torch.empty(1, 2, rows, 64)
    assert got.fits(q, k) and not got.fits(q[:, :, :-1], k[:, :, :-1])
    with pytest.raises(ValueError, match="^attention_mask: SequencesMask.*another batch"):
        wft.hf_attention_forward(object(), q[:, :, :-1], k[:, :, :-1], k[:, :, :-1], got)
    two_rows = build(packed, batch=2)  # each row packs the same sequences
    assert two_rows.cu_seqlens.tolist() == [0, 3, 8, 9, 13, 16, 21, 22, 26]
    assert build(_causal) is None
    tensor = build(sliding)
    assert tensor.dtype == torch.bool and tensor.shape == (1, 1, rows, rows)
    with pytest.raises(ValueError, match="^attention_mask must be None"):
        wft.hf_attention_forward(object(), q, k, k, tensor)
    requested.clear()
    assert build(packed, skip=True) is None and not requested  # transformers' own rule
    # transformers' bidirectional masks (encoders) are asked for with this skip allowed: no
    # causal mask to find, so no rows are built to look for one
    assert wft.hf_mask(1, rows, rows, mask_function=lambda *i: torch.tensor(True),
                       allow_is_causal_skip=False, allow_is_bidirectional_skip=True) is None
    assert not requested


def _fake_transformers(monkeypatch) -> list:
    """transformers.masking_utils with `_fake_sdpa_mask` in it; -> the rows it is asked for."""
    import sys
    import types
    requested = []
    masking = types.ModuleType("transformers.masking_utils")
    masking.sdpa_mask = _fake_sdpa_mask(requested)
    monkeypatch.setitem(sys.modules, "transformers", types.ModuleType("transformers"))
    monkeypatch.setitem(sys.modules, "transformers.masking_utils", masking)
    return requested


def test_the_transformers_mask_builder_runs_padded_batches_as_packed_ones(monkeypatch):
    """A padded batch (the 2D padding mask: 1 for real tokens) gets a `SequencesMask` of
    each row's real tokens, left or right padded: its sequences' bounds over the real
    tokens only and where those are; the attention over them is the causal attention of
    each sequence alone, zero at padding tokens (the packed call stood in for by a float64
    reference). Real tokens that are not consecutive get SDPA's tensor."""
    _fake_transformers(monkeypatch)
    monkeypatch.setattr(wft, "_MASK_CELLS_AT_A_TIME", 3 * 3 * 7)  # 3 rows of 3 x 7
    rows = 7
    padding = torch.tensor([[0, 0, 1, 1, 1, 1, 1],    # left padded: 5 tokens
                            [1, 1, 1, 0, 0, 0, 0],    # right padded: 3 tokens
                            [1, 1, 1, 1, 1, 1, 1]])   # none
    got = wft.hf_mask(3, rows, rows, mask_function=_causal, attention_mask=padding)
    assert isinstance(got, wft.SequencesMask)
    assert got.cu_seqlens.tolist() == [0, 5, 8, 15]
    assert got.tokens.tolist() == [2, 3, 4, 5, 6, 7, 8, 9, *range(14, 21)]

    def varlen(q, k, v, cu_q, cu_k, causal, scale):  # float64: what the kernel computes
        out = torch.zeros_like(q)
        for first, last in zip(cu_q[:-1].tolist(), cu_q[1:].tolist()):
            qs, ks, vs = (x[first:last].transpose(0, 1) for x in (q, k, v))
            ks, vs = (x.repeat_interleave(q.shape[1] // k.shape[1], 0) for x in (ks, vs))
            scores = qs @ ks.transpose(1, 2) * scale
            scores.masked_fill_(torch.ones_like(scores, dtype=torch.bool).triu(1), -torch.inf)
            out[first:last] = (scores.softmax(-1) @ vs).transpose(0, 1)
        return out
    from wavefront.kernel import varlen as kernel_varlen
    monkeypatch.setattr(kernel_varlen, "attention_varlen", varlen)
    g = torch.Generator().manual_seed(5)
    q = torch.randn(3, 4, rows, 8, generator=g, dtype=torch.float64)
    k, v = (torch.randn(3, 2, rows, 8, generator=g, dtype=torch.float64) for _ in range(2))
    out, _ = wft.hf_attention_forward(object(), q, k, v, got, scaling=0.5)
    assert out.shape == (3, rows, 4, 8)
    for b, (first, last) in enumerate([(2, 7), (0, 3), (0, 7)]):
        alone = varlen(*(x[b, :, first:last].transpose(0, 1) for x in (q, k, v)),
                       torch.tensor([0, last - first]), None, True, 0.5)
        assert torch.allclose(out[b, first:last], alone)
        assert not out[b, :first].any() and not out[b, last:].any()
    gap = torch.tensor([[1, 1, 0, 1, 1, 1, 1]])  # not consecutive: not one sequence
    tensor = wft.hf_mask(1, rows, rows, mask_function=_causal, attention_mask=gap)
    assert isinstance(tensor, torch.Tensor) and tensor.shape == (1, 1, rows, rows)


def test_the_transformers_mask_builder_runs_padded_encoder_batches(monkeypatch):
    """An encoder's padded batch (transformers asks for a bidirectional mask, with
    `allow_is_bidirectional_skip`): a `SequencesMask` that is not causal, over the real tokens;
    without padding, no mask (the kernel's own, none for an encoder); a bidirectional mask
    with a hole in a row gets SDPA's tensor."""
    requested = _fake_transformers(monkeypatch)
    rows = 6
    padding = torch.tensor([[1, 1, 1, 1, 0, 0], [1, 1, 1, 1, 1, 1]])

    def everything(b, h, q_idx, kv_idx):
        return q_idx >= 0

    def build(padding, mask_function=everything):
        return wft.hf_mask(len(padding), rows, rows, mask_function=mask_function,
                           attention_mask=padding, allow_is_causal_skip=False,
                           allow_is_bidirectional_skip=True)
    got = build(padding)
    assert isinstance(got, wft.SequencesMask) and not got.causal
    assert got.cu_seqlens.tolist() == [0, 4, 10]
    assert got.tokens.tolist() == [0, 1, 2, 3, *range(6, 12)]
    requested.clear()
    assert build(torch.ones_like(padding)) is None and not requested

    def holed(b, h, q_idx, kv_idx):
        return kv_idx != 2
    assert isinstance(build(padding, holed), torch.Tensor)


def test_the_launcher_cache_key_separates_what_a_launch_depends_on():
    """The public call's cache key (computed on CPU tensors: the key reads metadata only):
    equal for a new tensor of the same shape, strides, dtype and device, different wherever a
    launch would differ, including an option given as 1 rather than True."""
    from wavefront.kernel.arrays import _call_key
    options = (False, None, None, None, None, False, None, None, None)
    q = torch.randn(1, 8, 64, 64, dtype=torch.bfloat16)
    k = torch.randn(1, 2, 64, 64, dtype=torch.bfloat16)
    key = _call_key(q, k, k, options)
    assert _call_key(q.clone(), k.clone(), k.clone(), options) == key
    hash(key)
    others = [
        _call_key(q, k, k, (True,) + options[1:]),
        _call_key(q, k, k, (1,) + options[1:]),
        _call_key(q.half(), k.half(), k.half(), options),
        _call_key(q[:, :, :32], k, k, options),
        _call_key(q.transpose(1, 2).contiguous().transpose(1, 2), k, k, options),
        _call_key(q, k[:, :1], k[:, :1], options),
        _call_key(q, k, k.half(), options),
    ]
    assert key not in others and len(set(others)) == len(others)
    # a tensor subclass or a foreign array is not keyed (converted and checked every call)
    assert _call_key(torch.nn.Parameter(q), k, k, options) is None


class _StandIn:
    """A stand-in launcher for the cache's tests: the cache only marks what it keeps."""


def test_packed_batches_do_not_push_the_dense_launchers_out():
    """Launchers of packed batches, new lengths every call, live in a cache of their own,
    bounded on its own: a loop of ragged batches leaves the dense shapes' launchers cached
    (stand-in builds: the cache does not look inside what it keeps)."""
    from wavefront.kernel import call as L
    L.clear_launcher_cache()
    dense = L._cached_or_built(("dense",), _StandIn)
    for n in range(L.VARLEN_LAUNCHER_CACHE_SIZE + 5):
        L._cached_or_built(("varlen", n), _StandIn, varlen=True)
    assert L._cached_or_built(("dense",), _StandIn) is dense
    assert len(L._varlen_launchers) == L.VARLEN_LAUNCHER_CACHE_SIZE
    assert ("varlen", 0) not in L._varlen_launchers and ("varlen", 20) in L._varlen_launchers
    assert list(L._plans) == [("dense",)]
    L.clear_launcher_cache()
    assert not L._plans and not L._varlen_launchers


def test_a_packed_batch_launcher_in_use_outlives_one_off_ones():
    """Among packed batches the least recently used launcher goes first: a loop's launcher
    (lengths on the GPU, one launcher for every call) called between one-off launchers (host
    lengths, new every call) stays cached, however many one-offs pass."""
    from wavefront.kernel import call as L
    L.clear_launcher_cache()
    loop = L._cached_or_built(("loop",), _StandIn, varlen=True)
    for n in range(3 * L.VARLEN_LAUNCHER_CACHE_SIZE):
        L._cached_or_built(("one-off", n), _StandIn, varlen=True)
        assert L._cached_or_built(("loop",), _StandIn, varlen=True) is loop
    assert len(L._varlen_launchers) == L.VARLEN_LAUNCHER_CACHE_SIZE
    L.clear_launcher_cache()


def test_a_dense_launcher_in_use_outlives_one_off_shapes():
    """A model's launcher, called between one-off shapes (a sweep, a server's new prompt
    lengths), stays cached however many pass; with no calls between, launchers go oldest
    first; and where every launcher was called since, the next one kept still evicts only the
    oldest (one pass clears the marks)."""
    from wavefront.kernel import call as L
    L.clear_launcher_cache()
    size = L.LAUNCHER_CACHE_SIZE
    model = L._cached_or_built(("model",), _StandIn)
    for n in range(3 * size):
        L._cached_or_built(("one-off", n), _StandIn)
        assert L._cached_or_built(("model",), _StandIn) is model
        assert len(L._plans) <= size
    assert ("model",) in L._plans and ("one-off", 3 * size - 1) in L._plans
    L.clear_launcher_cache()
    for n in range(size + 5):
        L._cached_or_built(("unused", n), _StandIn)
    assert list(L._plans) == [("unused", n) for n in range(5, size + 5)]
    kept = dict(L._plans)
    for key in kept:  # every one used once since: the next insert evicts the oldest anyway
        L._cached_or_built(key, _StandIn)
    L._cached_or_built(("new",), _StandIn)
    assert ("unused", 5) not in L._plans and len(L._plans) == size
    assert all(L._plans[key] is launcher for key, launcher in kept.items()
               if key in L._plans)
    L.clear_launcher_cache()


def test_the_public_call_allocates_a_contiguous_output_whatever_q_strides():
    """What the fake implementation promises torch.compile: a contiguous output of q's shape
    and dtype, also for a q whose heads and sequence are transposed in memory."""
    from wavefront.kernel.arrays import _ArrayView, _output_maker
    for q in (torch.randn(2, 4, 48, 64, dtype=torch.bfloat16),
              torch.randn(2, 48, 4, 64, dtype=torch.bfloat16).transpose(1, 2)):
        # the view `_view` takes of a CUDA q (CPU tensors here: only metadata is read)
        view = _ArrayView("torch", tuple(q.shape), "bfloat16", 0, tuple(q.stride()))
        out = _output_maker(view)(q)
        assert out.is_contiguous() and out.shape == q.shape and out.dtype == q.dtype


def test_gpu_lengths_are_padded_to_the_launchers_bucket_of_sequences():
    """A launcher with cu_seqlens on the GPU serves a bucket of sequence counts: a call with
    fewer sequences is padded with empty ones (the last bound repeated), by `_padded` inside a
    caller's capture and by `_stage` into the table writer's inputs alike."""
    from wavefront.kernel.varlen import _padded, _sequences_bucket, _stage
    assert [_sequences_bucket(n) for n in (1, 8, 9, 16, 17, 100)] == [8, 8, 16, 16, 32, 128]
    cu = torch.tensor([0, 3, 3, 10], dtype=torch.int32)
    assert _padded(cu, 4) is cu
    assert _padded(cu, 7).tolist() == [0, 3, 3, 10, 10, 10, 10]
    staged = (torch.full((7,), -1, dtype=torch.int64), torch.full((7,), -1, dtype=torch.int64),
              torch.zeros(4, dtype=torch.int64))
    _stage(staged, cu, cu + 1, 10, 12, (7, 9))
    assert staged[0].tolist() == _padded(cu, 7).tolist()
    assert staged[1].tolist() == _padded(cu + 1, 7).tolist()
    assert staged[2].tolist() == [10, 12, 7, 9]


@pytest.mark.parametrize("cta_name", ["persistent", "grouped_dynamic"])
def test_the_table_written_from_lengths_is_the_hosts(cta_name):
    """The GPU-lengths writer's last step (`_table_from_lengths`: the columns stacked and
    copied into the table at once) on CPU tensors: the first rows are `VarlenLaunch`'s table
    for the same lengths, padded to a bucket of 8 sequences, and the row after the table's
    holds their count."""
    from types import SimpleNamespace

    import numpy as np

    import wavefront.kernel.torch_arrays  # noqa: F401  (registers torch's operations)
    from wavefront.kernel.varlen import _table_from_lengths
    from wavefront.schedules import (AttentionProblem, DeviceVarlenLaunch, VarlenLaunch,
                                     cta_schedule, kv_schedule)
    lengths = [300, 0, 129, 1000, 64]
    p = AttentionProblem(1, 4, 2, sum(lengths), sum(lengths), 64, True, 64, 64)
    placement = dict(cta=cta_schedule(cta_name), kv=kv_schedule("sawtooth"), sms=5,
                     ctas_per_sm=2, l2_bytes=1 << 19)
    host = VarlenLaunch(p, tuple(lengths), tuple(lengths), **placement)
    device = DeviceVarlenLaunch(p, 8, **placement)
    table = torch.zeros((device.num_items + 1, 16), dtype=torch.int32)  # padding columns 0
    cu = torch.from_numpy(np.concatenate([[0], np.cumsum(lengths), [sum(lengths)] * 3]))
    _table_from_lengths(SimpleNamespace(launch=device, _table=table), cu, cu, p.seqlen_q,
                        p.seqlen_kv)
    count = int(table[device.num_items, 2])
    assert count == host.num_items
    assert np.array_equal(table[:count].numpy(), host.work_table)


def test_a_lengths_stamp_knows_the_same_unmodified_tensors():
    """What lets the layers of a model that share cu_seqlens write the table once: the same
    tensors, unmodified, with the same packed rows match; equal values in another tensor, an
    in-place write (even of the same value), other rows or a dropped tensor do not; an
    inference tensor keeps no version counter, so it gets no stamp (always written)."""
    import gc

    from wavefront.kernel.varlen import _lengths_stamp, _same_lengths
    cu_q, cu_k = torch.tensor([0, 5, 9]), torch.tensor([0, 7, 9])
    stamp = _lengths_stamp(cu_q, cu_k, 9, 12)
    assert _same_lengths(stamp, cu_q, cu_k, 9, 12)
    assert not _same_lengths(stamp, cu_q.clone(), cu_k, 9, 12)
    assert not _same_lengths(stamp, cu_k, cu_q, 9, 12)
    assert not _same_lengths(stamp, cu_q, cu_k, 9, 13)
    assert not _same_lengths(stamp, cu_q, cu_k, 9, 12, (5, 7))  # other max_seqlens
    cu_k[1] = 7
    assert not _same_lengths(stamp, cu_q, cu_k, 9, 12)
    stamp = _lengths_stamp(cu_q, cu_k, 9, 12)
    del cu_q
    gc.collect()
    assert not _same_lengths(stamp, torch.tensor([0, 5, 9]), cu_k, 9, 12)
    with torch.inference_mode():
        frozen = torch.tensor([0, 5, 9])
    assert _lengths_stamp(frozen, cu_k, 9, 12) is None
