"""Bottom-right aligned causal masks (FlashAttention >= 2.1's convention) and the packed batch's
length checks, on the CPU.

The kernel reads everything a schedule decides from the work table, so the table is checked
against the mask itself: for every schedule, both alignments and seqlen_q on either side of
seqlen_kv, the (query row, key column) pairs each item's rows give weight to (its unmasked
tiles whole, its masked tiles through the kernel's mask `rows + diagonal >= cols`) are exactly
the mask's, each pair once. A NumPy replay of the kernel's online softmax over the same rows
(and the tiled schedules' combine) then matches a dense float64 reference built with an explicit
mask, rows that see no key giving 0 and LSE -inf. The GPU tests
(tests/test_gpu_causal_alignment.py) run the kernel itself."""
import math

import numpy as np
import pytest

import wavefront
from wavefront.kernel.plan import CallOptions
from wavefront.model.counting import useful_pairs_per_head
from wavefront.point import check_max_seqlen, plan, plan_varlen, plan_varlen_on_device, seqlens_of
from wavefront.schedules import (LENGTHS_ABOVE_MAX, LENGTHS_MALFORMED, WORK_BATCH, WORK_CHUNK,
                                 WORK_DIAGONAL, WORK_HEAD, WORK_KV_HEAD, WORK_KV_START,
                                 WORK_MASKED_HI, WORK_MASKED_LO, WORK_Q_START, WORK_Q_TILE,
                                 WORK_SCAN_COUNT, WORK_SCAN_START, WORK_SCAN_STEP,
                                 WORK_SEQLEN_KV, WORK_SEQLEN_Q, AttentionProblem, VarlenLaunch,
                                 causal_diagonal, length_error_text, schedule_names)

ROW_MAX_START = -1.0e30  # the kernel's (wavefront.kernel.attention, which needs cuTile)
ALIGNMENTS = ("top_left", "bottom_right")
# (q, k) shapes: seqlen_q below, above and equal to seqlen_kv, ragged tiles, GQA
SHAPES = [((2, 4, 200, 64), (2, 2, 520, 64)),
          ((1, 2, 520, 64), (1, 1, 200, 64)),
          ((1, 3, 300, 64), (1, 3, 300, 64)),
          ((1, 2, 1, 64), (1, 2, 333, 64))]


def launch_of(q, k, schedule, alignment, causal=True, tiles=(64, 64)):
    return plan(q, k, sms=3, l2_bytes=1 << 18, causal=causal, schedule=schedule, tiles=tiles,
                chunk_tiles=2 if "tiled" in schedule else None, causal_alignment=alignment)


def mask(seqlen_q, seqlen_kv, alignment, causal=True):
    """The mask as users write it: torch.tril(ones, diagonal) with the alignment's diagonal."""
    if not causal:
        return np.ones((seqlen_q, seqlen_kv), dtype=bool)
    return np.tril(np.ones((seqlen_q, seqlen_kv), dtype=bool),
                   causal_diagonal(seqlen_q, seqlen_kv, alignment))


def scan_of(row):
    """An item's K/V tiles as the kernel visits them: (tile, whether masked)."""
    start, step, count = row[WORK_SCAN_START], row[WORK_SCAN_STEP], row[WORK_SCAN_COUNT]
    return ([(start + step * t, False) for t in range(count)]
            + [(j, True) for j in range(row[WORK_MASKED_LO], row[WORK_MASKED_HI])])


def item_view(launch, row):
    """-> (the item's sequence's lengths, its Q rows and K/V offsets in the arrays, batch)."""
    p = launch.problem
    if launch.varlen:
        return (row[WORK_SEQLEN_Q], row[WORK_SEQLEN_KV], row[WORK_Q_START],
                row[WORK_KV_START], 0)
    return p.seqlen_q, p.seqlen_kv, 0, 0, row[WORK_BATCH]


def weighted_pairs(launch, row):
    """The (row of the Q tile, key column) pairs of the item's sequence the kernel gives weight
    to, as a (tile_m, seqlen_kv) matrix of visit counts (rows past the sequence's end
    included: the kernel computes them and does not store them); every tile it visits must
    hold one of a real row's pairs."""
    p = launch.problem
    sq, skv, _, _, _ = item_view(launch, row)
    rows = row[WORK_Q_TILE] * p.tile_m + np.arange(p.tile_m)
    visits = np.zeros((p.tile_m, skv), dtype=np.int64)
    for j, masked in scan_of(row):
        cols = j * p.tile_n + np.arange(p.tile_n)
        keep = np.ones((p.tile_m, p.tile_n), dtype=bool)
        if masked:
            keep &= cols[None, :] < skv
            if p.causal:
                keep &= rows[:, None] + row[WORK_DIAGONAL] >= cols[None, :]
        else:
            assert cols[-1] < skv, "an unmasked tile reaches past the keys"
        inside = cols < skv
        visits[:, cols[inside]] += keep[:, inside]
        # no tile visited in vain: some real row gives weight to one of its keys
        assert keep[rows < sq][:, inside].any(), f"tile {j} visited for no pair"
    return visits


def check_pairs_are_the_mask(launch, alignment):
    """Every item's weighted pairs, summed over its K/V chunks, are its sequence's mask: each
    pair of the mask once, none outside it."""
    p = launch.problem
    seen: dict = {}
    for row in launch.work_table:
        sq, skv, q_start, _, batch = item_view(launch, row)
        key = (batch, q_start, row[WORK_HEAD], row[WORK_Q_TILE])
        visits = weighted_pairs(launch, row)
        seen[key] = seen.get(key, 0) + visits
        assert row[WORK_KV_HEAD] == row[WORK_HEAD] // p.qheads_per_kv
    for (batch, q_start, head, q_tile), visits in seen.items():
        row0 = q_tile * p.tile_m
        real = min(p.tile_m, sq_of(launch, q_start) - row0)
        skv = visits.shape[1]
        want = mask(sq_of(launch, q_start), skv, alignment, p.causal)[row0:row0 + real]
        assert visits.max(initial=0) <= 1, "a pair visited twice"
        assert np.array_equal(visits[:real].astype(bool), want), (launch.name, q_tile, head)
    return seen


def sq_of(launch, q_start):
    if not launch.varlen:
        return launch.problem.seqlen_q
    starts = np.cumsum((0,) + launch.seqlens_q)
    return launch.seqlens_q[int(np.searchsorted(starts, q_start, side="right")) - 1]


@pytest.mark.parametrize("alignment", ALIGNMENTS)
@pytest.mark.parametrize("schedule", schedule_names())
def test_every_schedule_visits_exactly_the_masks_pairs(schedule, alignment):
    for q, k in SHAPES:
        for tiles in ((64, 64), (128, 64)):
            launch = launch_of(q, k, schedule, alignment, tiles=tiles)
            seen = check_pairs_are_the_mask(launch, alignment)
            assert len(seen) == launch.problem.num_items  # every (batch, head, Q tile)
    # without the mask the alignment changes nothing
    q, k = SHAPES[0]
    assert np.array_equal(launch_of(q, k, schedule, alignment, causal=False).work_table,
                          launch_of(q, k, schedule, "top_left", causal=False).work_table)


def test_the_diagonal_column_is_written_only_where_it_is_not_the_padding():
    q, k = SHAPES[0]
    top = launch_of(q, k, "persistent+linear", "top_left")
    bottom = launch_of(q, k, "persistent+linear", "bottom_right")
    assert (top.work_table[:, WORK_DIAGONAL] == 0).all()
    assert (bottom.work_table[:, WORK_DIAGONAL] == 520 - 200).all()
    assert bottom.problem.diagonal == 320 and top.problem.diagonal == 0
    # bottom-right sees more keys: the items visit more tiles
    steps = lambda t: (t[:, WORK_SCAN_COUNT] + t[:, WORK_MASKED_HI] - t[:, WORK_MASKED_LO]).sum()
    assert steps(bottom.work_table) > steps(top.work_table)
    # seqlen_q > seqlen_kv: the first Q tiles see nothing and visit no tile
    wide = launch_of(*SHAPES[1], "persistent+linear", "bottom_right")
    table = wide.work_table
    empty = table[table[:, WORK_Q_TILE] < (520 - 200) // 64]
    assert len(empty) and (empty[:, WORK_SCAN_COUNT] == 0).all()
    assert (empty[:, WORK_MASKED_HI] == empty[:, WORK_MASKED_LO]).all()


@pytest.mark.parametrize("alignment", ALIGNMENTS)
def test_useful_pairs_count_the_mask(alignment):
    for sq, skv in ((200, 520), (520, 200), (300, 300), (1, 333), (333, 1)):
        p = AttentionProblem(1, 1, 1, sq, skv, 64, True, causal_alignment=alignment)
        assert useful_pairs_per_head(p) == mask(sq, skv, alignment).sum()


# --------------------------------------------------------------------------------------------
# The kernel's online softmax replayed in NumPy over the table's rows
# --------------------------------------------------------------------------------------------

def replay(launch, q, k, v, scale):
    """The kernel's algebra over its work table in float64: for each row the online softmax
    (running max from ROW_MAX_START, the unmasked then the masked tiles), then the tiled
    schedules' combine, and the normalisation with its rule for rows that saw no key."""
    p = launch.problem
    log2e = 1 / math.log(2)
    states: dict = {}
    for row in launch.work_table:
        sq, skv, q_start, kv_start, batch = item_view(launch, row)
        qs = q[batch, row[WORK_HEAD], q_start:q_start + sq]
        ks = k[batch, row[WORK_KV_HEAD], kv_start:kv_start + skv]
        vs = v[batch, row[WORK_KV_HEAD], kv_start:kv_start + skv]
        rows = row[WORK_Q_TILE] * p.tile_m + np.arange(p.tile_m)
        qt = np.zeros((p.tile_m, qs.shape[1]))
        real = rows < sq
        qt[real] = qs[rows[real]]
        m = np.full(p.tile_m, ROW_MAX_START)
        l_sum = np.zeros(p.tile_m)
        acc = np.zeros((p.tile_m, qs.shape[1]))
        for j, masked in scan_of(row):
            cols = j * p.tile_n + np.arange(p.tile_n)
            inside = cols < skv
            kt = np.zeros((p.tile_n, qs.shape[1]))
            vt = np.zeros_like(kt)
            kt[inside], vt[inside] = ks[cols[inside]], vs[cols[inside]]
            s = qt @ kt.T
            if masked:
                keep = inside[None, :] & np.ones((p.tile_m, 1), dtype=bool)
                if p.causal:
                    keep &= rows[:, None] + row[WORK_DIAGONAL] >= cols[None, :]
                s = np.where(keep, s, -np.inf)
            m_new = np.maximum(m, s.max(axis=1) * scale * log2e)
            pr = np.exp2(s * scale * log2e - m_new[:, None])
            alpha = np.exp2(m - m_new)
            l_sum = l_sum * alpha + pr.sum(axis=1)
            acc = acc * alpha[:, None] + pr @ vt
            m = m_new
        key = (batch, q_start, row[WORK_HEAD], row[WORK_Q_TILE])
        states.setdefault(key, []).append((m, l_sum, acc, sq))
    out = np.full(q.shape, np.nan)
    lse = np.full(q.shape[:3], np.nan)
    for (batch, q_start, head, q_tile), chunks in states.items():
        m = np.full(p.tile_m, ROW_MAX_START)
        l_sum = np.zeros(p.tile_m)
        acc = np.zeros_like(chunks[0][2])
        for m_c, l_c, a_c, sq in chunks:  # the combine: one chunk at a time
            m_new = np.maximum(m, m_c)
            alpha, beta = np.exp2(m - m_new), np.exp2(m_c - m_new)
            l_sum = l_sum * alpha + l_c * beta
            acc = acc * alpha[:, None] + a_c * beta[:, None]
            m = m_new
        seen = m > ROW_MAX_START
        o = acc / np.where(seen, l_sum, np.inf)[:, None]
        rows = q_tile * p.tile_m + np.arange(p.tile_m)
        real = rows < sq
        with np.errstate(divide="ignore"):
            row_lse = np.where(seen, (m + np.log2(l_sum)) * math.log(2), -np.inf)
        out[batch, head, q_start + rows[real]] = o[real]
        lse[batch, head, q_start + rows[real]] = row_lse[real]
    return out, lse


def dense_reference(q, k, v, scale, alignment, causal=True):
    """softmax(q k^T scale) v in float64 with the explicit mask; rows with no key: 0, -inf."""
    rep = q.shape[1] // k.shape[1]
    k, v = np.repeat(k, rep, axis=1), np.repeat(v, rep, axis=1)
    s = q @ k.transpose(0, 1, 3, 2) * scale
    s = np.where(mask(q.shape[2], k.shape[2], alignment, causal), s, -np.inf)
    row_max = s.max(axis=-1, keepdims=True)
    seen = np.isfinite(row_max)
    e = np.exp(s - np.where(seen, row_max, 0))
    total = e.sum(axis=-1, keepdims=True)
    out = (e / np.where(seen, total, 1)) @ v
    with np.errstate(divide="ignore"):
        lse = np.where(seen, row_max + np.log(np.where(seen, total, 1)), -np.inf)[..., 0]
    return out, lse


def random_qkv(q_shape, k_shape, seed):
    rng = np.random.default_rng(seed)
    return (rng.standard_normal(q_shape), rng.standard_normal(k_shape),
            rng.standard_normal(k_shape))


@pytest.mark.parametrize("alignment", ALIGNMENTS)
@pytest.mark.parametrize("schedule", ["persistent+sawtooth", "grid+linear", "dynamic+sawtooth",
                                      "grouped_dynamic+linear", "longest_first+linear",
                                      "persistent+tiled", "grid+tiled_fit"])
def test_the_replayed_kernel_is_the_masked_softmax(schedule, alignment):
    for seed, (q_shape, k_shape) in enumerate(SHAPES):
        q, k, v = random_qkv(q_shape, k_shape, seed)
        scale = 1 / math.sqrt(q_shape[-1])
        launch = launch_of(q_shape, k_shape, schedule, alignment)
        out, lse = replay(launch, q, k, v, scale)
        want, want_lse = dense_reference(q, k, v, scale, alignment)
        assert np.allclose(out, want, atol=1e-10), (schedule, q_shape, k_shape)
        assert np.array_equal(np.isinf(lse), np.isinf(want_lse))
        assert np.allclose(lse[np.isfinite(lse)], want_lse[np.isfinite(want_lse)])
    # seqlen_q > seqlen_kv, bottom-right: the first seqlen_q - seqlen_kv rows see nothing
    if alignment == "bottom_right":
        q_shape, k_shape = SHAPES[1]
        blind = q_shape[2] - k_shape[2]
        q, k, v = random_qkv(q_shape, k_shape, 9)
        out, lse = replay(launch_of(q_shape, k_shape, schedule, alignment), q, k, v, 0.125)
        assert (out[:, :, :blind] == 0).all() and (lse[:, :, :blind] == -np.inf).all()
        assert np.isfinite(lse[:, :, blind:]).all()


def packed(lengths_q, lengths_k, schedule, alignment, tiles=(64, 64)):
    cu_q, cu_k = np.cumsum([0, *lengths_q]), np.cumsum([0, *lengths_k])
    return plan_varlen((int(cu_q[-1]), 4, 64), (int(cu_k[-1]), 2, 64), cu_q.tolist(),
                       cu_k.tolist(), sms=3, l2_bytes=1 << 18, causal=True, schedule=schedule,
                       tiles=tiles, causal_alignment=alignment)


VARLEN_LENGTHS = ([70, 0, 300, 1, 129], [200, 0, 100, 64, 129])


@pytest.mark.parametrize("alignment", ALIGNMENTS)
@pytest.mark.parametrize("schedule", [s for s in schedule_names() if "tiled" not in s])
def test_a_packed_batch_masks_each_sequence_with_its_own_offset(schedule, alignment):
    launch = packed(*VARLEN_LENGTHS, schedule, alignment)
    table = launch.work_table
    want = [causal_diagonal(sq, sk, alignment) for sq, sk in zip(*VARLEN_LENGTHS)]
    assert table[:, WORK_DIAGONAL].tolist() == [want[s] for s in table[:, WORK_BATCH]]
    check_pairs_are_the_mask(launch, alignment)
    # the replay against each sequence's own dense reference
    total_q, total_k = sum(VARLEN_LENGTHS[0]), sum(VARLEN_LENGTHS[1])
    q, k, v = random_qkv((1, 4, total_q, 64), (1, 2, total_k, 64), 3)
    out, lse = replay(launch, q, k, v, 0.125)
    starts_q, starts_k = np.cumsum([0, *VARLEN_LENGTHS[0]]), np.cumsum([0, *VARLEN_LENGTHS[1]])
    for s in range(len(want)):
        if not VARLEN_LENGTHS[0][s]:
            continue  # an empty sequence: nothing to compare
        rows = slice(starts_q[s], starts_q[s + 1])
        keys = slice(starts_k[s], starts_k[s + 1])
        ref, ref_lse = dense_reference(q[:, :, rows], k[:, :, keys], v[:, :, keys], 0.125,
                                       alignment)
        assert np.allclose(out[:, :, rows], ref, atol=1e-10), s
        assert np.array_equal(np.isinf(lse[:, :, rows]), np.isinf(ref_lse))


@pytest.mark.parametrize("alignment", ALIGNMENTS)
@pytest.mark.parametrize("schedule", ["persistent+sawtooth", "grouped_dynamic+linear",
                                      "dynamic+linear", "longest_first+sawtooth"])
def test_a_table_written_from_lengths_on_the_device_side_is_the_hosts(schedule, alignment):
    """`DeviceVarlenLaunch.table_columns` (what the GPU writes from cu_seqlens there) on
    NumPy: its first rows are `VarlenLaunch`'s table, the diagonal column included."""
    lengths_q, lengths_k = VARLEN_LENGTHS
    host = packed(lengths_q, lengths_k, schedule, alignment)
    p = host.problem
    device = plan_varlen_on_device((p.seqlen_q, 4, 64), (p.seqlen_kv, 2, 64), 8, sms=3,
                                   l2_bytes=1 << 18, causal=True, schedule=schedule,
                                   tiles=(64, 64), causal_alignment=alignment)
    pad = [sum(lengths_q)] * 3, [sum(lengths_k)] * 3
    cu_q = np.array([0, *np.cumsum(lengths_q), *pad[0]])
    cu_k = np.array([0, *np.cumsum(lengths_k), *pad[1]])
    columns, count = device.table_columns(cu_q, cu_k)
    rows = np.zeros((device.num_items, 16), dtype=np.int64)
    for c, values in enumerate(columns):
        rows[:, c] = values
    assert int(count) == host.num_items
    assert np.array_equal(rows[:host.num_items], host.work_table)
    assert device.length_errors(cu_q, cu_k, max_seqlen_q=300, max_seqlen_kv=200) == 0


# --------------------------------------------------------------------------------------------
# The option, checked where it enters
# --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("bad", ["bottom-right", "BOTTOM_RIGHT", None, True, 1, ""])
def test_a_bad_alignment_is_refused_naming_the_argument(bad):
    with pytest.raises(ValueError, match="causal_alignment must be one of"):
        CallOptions(causal=True, causal_alignment=bad)
    with pytest.raises(ValueError, match="causal_alignment"):
        AttentionProblem(1, 1, 1, 10, 20, 64, True, causal_alignment=bad)
    with pytest.raises(ValueError, match="causal_alignment"):
        plan((1, 1, 10, 64), (1, 1, 20, 64), sms=2, l2_bytes=1 << 20, causal=True,
             causal_alignment=bad)
    with pytest.raises(ValueError, match="causal_alignment"):
        wavefront.plan((1, 1, 10, 64), (1, 1, 20, 64), gpu="h100", causal=True,
                       causal_alignment=bad)
    with pytest.raises(ValueError, match="causal_alignment"):
        packed([10], [20], "persistent+linear", bad)


def test_a_plan_of_shapes_runs_the_alignment_it_was_given():
    shape_q, shape_k = (1, 8, 512, 128), (1, 2, 4096, 128)
    top = wavefront.plan(shape_q, shape_k, gpu="h100", causal=True)
    bottom = wavefront.plan(shape_q, shape_k, gpu="h100", causal=True,
                            causal_alignment="bottom_right")
    assert top.options.causal_alignment == "top_left"
    assert bottom.launch.problem.diagonal == 4096 - 512
    assert (bottom.launch.work_table[:, WORK_DIAGONAL] == 4096 - 512).all()
    assert "bottom-right" in str(bottom) and "bottom-right" not in str(top)
    assert (bottom.prediction().compulsory_read_bytes
            == top.prediction().compulsory_read_bytes)
    assert CallOptions(causal=True, causal_alignment="bottom_right").launcher_options()[
        "causal_alignment"] == "bottom_right"


def test_the_torch_ops_options_take_the_alignment():
    torch = pytest.importorskip("torch")
    import wavefront.torch as wft
    assert wft._options(True, None, None, None, "bottom_right").causal_alignment == (
        "bottom_right")
    with pytest.raises(ValueError, match="causal_alignment"):
        wft._options(True, None, None, None, "bottom")
    schema = str(torch.ops.wavefront.attention_varlen.default._schema)
    assert 'str causal_alignment="top_left"' in schema


# --------------------------------------------------------------------------------------------
# Lengths (issue 51, item 7)
# --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("cu,message", [
    ([3, 10, 20], r"cu_seqlens_q must start at 0, got cu_seqlens_q\[0\] = 3"),
    ([0, 10, 5, 20], r"must not decrease, got cu_seqlens_q\[2\] = 5 after cu_seqlens_q\[1\]"),
    ([0, 25, 20], r"within the packed rows \(20\), got cu_seqlens_q\[1\] = 25"),
    ([0, 10, 15], r"must end at the packed rows \(20\), got cu_seqlens_q\[2\] = 15"),
    ([0], r"at least two entries"),
    ([0, 10.5, 20], r"sequence of integers"),
    ([0, True, 20], r"not booleans"),
])
def test_host_lengths_are_checked_naming_the_argument_and_index(cu, message):
    with pytest.raises(ValueError, match=message):
        seqlens_of("cu_seqlens_q", cu, 20)


def test_host_lengths_of_numpy_and_cpu_tensors_are_checked_alike():
    assert seqlens_of("cu_seqlens_k", np.array([0, 4, 4, 20]), 20) == (4, 0, 16)
    with pytest.raises(ValueError, match=r"cu_seqlens_k\[2\] = 3"):
        seqlens_of("cu_seqlens_k", np.array([0, 4, 3, 20]), 20)
    torch = pytest.importorskip("torch")
    with pytest.raises(ValueError, match=r"cu_seqlens_k\[2\] = 3"):
        seqlens_of("cu_seqlens_k", torch.tensor([0, 4, 3, 20], dtype=torch.int32), 20)


def test_max_seqlen_must_cover_every_sequence():
    check_max_seqlen("max_seqlen_q", None, (5, 9))
    check_max_seqlen("max_seqlen_q", 9, (5, 9))
    check_max_seqlen("max_seqlen_q", np.int64(12), (5, 9))
    with pytest.raises(ValueError, match=r"max_seqlen_q must be at least the longest sequence "
                                         r"\(9, sequence 1\), got 8"):
        check_max_seqlen("max_seqlen_q", 8, (5, 9))
    for bad in (8.5, "9", True):
        with pytest.raises(ValueError, match="max_seqlen_k must be an integer"):
            check_max_seqlen("max_seqlen_k", bad, (5, 9))
    with pytest.raises(ValueError, match="max_seqlen_k must be at least"):
        plan_varlen((20, 2, 64), (30, 2, 64), [0, 5, 20], [0, 20, 30], sms=2, l2_bytes=1 << 20,
                    max_seqlen_q=15, max_seqlen_k=19)
    plan_varlen((20, 2, 64), (30, 2, 64), [0, 5, 20], [0, 20, 30], sms=2, l2_bytes=1 << 20,
                max_seqlen_q=15, max_seqlen_k=20)


def device_launch(batch=4, rows=(256, 512)):
    return plan_varlen_on_device((rows[0], 4, 64), (rows[1], 2, 64), batch, sms=3,
                                 l2_bytes=1 << 18, causal=True, tiles=(64, 64),
                                 causal_alignment="bottom_right")


GOOD_Q, GOOD_K = np.array([0, 10, 60, 60, 200]), np.array([0, 100, 300, 300, 512])


@pytest.mark.parametrize("library", ["numpy", "torch"])
@pytest.mark.parametrize("cu_q,cu_k,max_q,max_k,bits", [
    (GOOD_Q, GOOD_K, None, None, 0),
    (GOOD_Q, GOOD_K, 140, 212, 0),
    (np.array([0, 10, 5, 60, 200]), GOOD_K, None, None, LENGTHS_MALFORMED),
    (np.array([4, 10, 60, 60, 200]), GOOD_K, None, None, LENGTHS_MALFORMED),
    (GOOD_Q, np.array([0, 100, 300, 300, 9999]), None, None, LENGTHS_MALFORMED << 1),
    (GOOD_Q, np.array([0, 100, 300, 300, -5]), None, None, LENGTHS_MALFORMED << 1),
    (GOOD_Q, GOOD_K, 139, None, LENGTHS_ABOVE_MAX),
    (GOOD_Q, GOOD_K, None, 211, LENGTHS_ABOVE_MAX << 1),
    (np.array([0, 10, 5, 60, 200]), np.array([0, 100, 300, 300, 9999]), 3, 3,
     LENGTHS_MALFORMED | LENGTHS_ABOVE_MAX | (LENGTHS_MALFORMED << 1) | (LENGTHS_ABOVE_MAX << 1)),
])
def test_device_lengths_are_flagged_where_they_are_read(library, cu_q, cu_k, max_q, max_k,
                                                         bits):
    """`length_errors` is what the GPU works out beside the table: the same code on NumPy
    arrays and on (CPU) torch tensors, 0 for good lengths, the bits naming the argument for
    bad ones."""
    launch = device_launch()
    if library == "torch":
        torch = pytest.importorskip("torch")
        import wavefront.kernel.torch_arrays  # noqa: F401  (registers torch's operations)
        cu_q, cu_k = torch.from_numpy(cu_q), torch.from_numpy(cu_k)
        max_q = None if max_q is None else torch.tensor(max_q)
        max_k = None if max_k is None else torch.tensor(max_k)
    errors = launch.length_errors(cu_q, cu_k, max_seqlen_q=max_q, max_seqlen_kv=max_k)
    assert int(errors) == bits
    text = length_error_text(bits)
    if bits & LENGTHS_MALFORMED:
        assert "cu_seqlens_q must start at 0" in text
    if bits & (LENGTHS_MALFORMED << 1):
        assert "cu_seqlens_k" in text
    if bits & LENGTHS_ABOVE_MAX:
        assert "max_seqlen_q" in text
    if bits & (LENGTHS_ABOVE_MAX << 1):
        assert "max_seqlen_k" in text
    assert (text == "") == (bits == 0)


@pytest.mark.parametrize("cu_q,cu_k", [
    (np.array([0, 10, 5, 60, 200]), np.array([0, 100, 300, 300, 9999])),
    (np.array([0, 300, 100, 9999, -7]), np.array([-50, 600, 2, 2, 2])),
    (np.array([0, 256, 256, 256, 256]), np.array([0, 0, 0, 0, 512])),
])
def test_malformed_device_lengths_never_leave_the_arrays(cu_q, cu_k):
    """The table written from malformed lengths (clamped) keeps every item's rows and keys
    inside the packed arrays, its scan inside its own sequence's K/V tiles."""
    launch = device_launch()
    assert launch.length_errors(cu_q, cu_k) != 0 or (cu_q[1:] >= cu_q[:-1]).all()
    columns, count = launch.table_columns(cu_q, cu_k)
    rows = np.zeros((launch.num_items, 16), dtype=np.int64)
    for c, values in enumerate(columns):
        rows[:, c] = values
    real = rows[:int(count)]
    assert (real[:, WORK_Q_START] >= 0).all() and (real[:, WORK_KV_START] >= 0).all()
    assert (real[:, WORK_Q_START] + real[:, WORK_SEQLEN_Q] <= 256).all()
    assert (real[:, WORK_KV_START] + real[:, WORK_SEQLEN_KV] <= 512).all()
    tile_rows = real[:, WORK_Q_TILE] * 64
    assert (tile_rows < np.maximum(real[:, WORK_SEQLEN_Q], 1)).all()
    for row in real:
        for j, _ in scan_of(row):
            assert 0 <= j * 64 < row[WORK_SEQLEN_KV]


def test_host_and_device_tables_agree_on_chunk_columns_for_dense_bottom_right():
    """The dense table's chunk column and the diagonal sit side by side: the tiled schedule's
    chunks of a bottom-right launch each carry the diagonal."""
    launch = launch_of((1, 2, 100, 64), (1, 2, 700, 64), "persistent+tiled", "bottom_right")
    table = launch.work_table
    assert launch.n_chunks > 1 and table[:, WORK_CHUNK].max() == launch.n_chunks - 1
    assert (table[:, WORK_DIAGONAL] == 600).all()


def test_a_packed_batch_with_more_queries_than_keys_gives_its_blind_rows_nothing():
    launch = packed([100, 30], [40, 30], "persistent+linear", "bottom_right")
    assert isinstance(launch, VarlenLaunch)
    table = launch.work_table
    first = table[(table[:, WORK_BATCH] == 0) & (table[:, WORK_Q_TILE] == 0)]
    assert (first[:, WORK_DIAGONAL] == -60).all() and (first[:, WORK_SCAN_COUNT] == 0).all()


def test_both_alignments_run_the_same_binaries():
    """The diagonal is data (the work table's WORK_DIAGONAL), not a compile-time constant: a
    bottom-right launch of every schedule runs the binary its top-left launch runs."""
    attention = pytest.importorskip("wavefront.kernel.attention",
                                    reason="needs cuda-tile (gpu extra)")
    for schedule in schedule_names():
        for q, k in SHAPES[:2]:
            variants = {attention.KernelVariant.for_launch(launch_of(q, k, schedule, a),
                                                           "bfloat16") for a in ALIGNMENTS}
            assert len(variants) == 1, schedule
