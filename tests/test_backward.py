"""The backward on the CPU: its float64 reference against torch autograd (and finite
differences), its work tables (every (batch, K/V head, K/V tile) x (query head, Q tile) pair
that matters visited exactly once, masks where needed), a NumPy walk of the tables that does
what the kernels do tile by tile, and the ahead-of-time compile of every backward binary.
Causal masks of both alignments (top-left, and bottom-right: query row i sees keys j <= i +
S_kv - S_q), with S_q below, above and equal to S_kv, checked against the mask itself."""
import dataclasses
import math
import os
from concurrent.futures import ProcessPoolExecutor

import numpy as np
import pytest

from wavefront.backward_schedules import (
    BACKWARD_CTA_SCHEDULES,
    BACKWARD_SCANS,
    BWD_BATCH,
    BWD_DIAGONAL,
    BWD_HEAD_FIRST,
    BWD_HEAD_STEP,
    BWD_KV_HEAD,
    BWD_KV_TILE,
    BWD_MASKED_HI,
    BWD_MASKED_LO,
    BWD_SCAN_COUNT,
    BWD_SCAN_START,
    BWD_SCAN_STEP,
    BackwardLaunch,
    q_tile_span,
)
from wavefront.measure.backward_reference import reference_attention_backward
from wavefront.schedules import (
    WORK_BATCH,
    WORK_DIAGONAL,
    WORK_HEAD,
    WORK_KV_HEAD,
    WORK_MASKED_HI,
    WORK_MASKED_LO,
    WORK_Q_TILE,
    WORK_SCAN_COUNT,
    WORK_SCAN_START,
    WORK_SCAN_STEP,
    AttentionProblem,
    causal_diagonal,
    kv_tile_span,
)

SCHEDULES = [f"{c}+{s}" for c in BACKWARD_CTA_SCHEDULES for s in BACKWARD_SCANS]


def _inputs(seed, batch, heads, kv_heads, seqlen_q, seqlen_kv, head_dim):
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((batch, heads, seqlen_q, head_dim))
    k = rng.standard_normal((batch, kv_heads, seqlen_kv, head_dim))
    v = rng.standard_normal((batch, kv_heads, seqlen_kv, head_dim))
    do = rng.standard_normal((batch, heads, seqlen_q, head_dim))
    return q, k, v, do


def mask(seqlen_q, seqlen_kv, alignment):
    """The causal mask as users write it: torch.tril(ones, diagonal), FlashAttention's
    diagonal S_kv - S_q for bottom-right (numpy's tril is torch's)."""
    return np.tril(np.ones((seqlen_q, seqlen_kv), dtype=bool),
                   seqlen_kv - seqlen_q if alignment == "bottom_right" else 0)


@pytest.mark.parametrize("causal,alignment,seqlens", [
    (False, "top_left", (13, 17)), (True, "top_left", (13, 13)),
    (True, "top_left", (9, 17)), (True, "bottom_right", (9, 17)),
    (True, "bottom_right", (17, 9)), (True, "bottom_right", (13, 13))])
@pytest.mark.parametrize("heads,kv_heads", [(2, 2), (4, 2)])
def test_reference_matches_torch_autograd(causal, alignment, seqlens, heads, kv_heads):
    """Torch differentiates the explicitly masked softmax; a row that sees no key (bottom-
    right, S_q > S_kv: its softmax would be NaN) is zeroed there after the softmax, so torch
    too gives it output 0 and gradient 0."""
    torch = pytest.importorskip("torch")
    sq, skv = seqlens
    q, k, v, do = _inputs(3, 2, heads, kv_heads, sq, skv, 8)
    out, lse, dq, dk, dv = reference_attention_backward(q, k, v, do, causal=causal, scale=0.4,
                                                        causal_alignment=alignment)
    tq, tk, tv = (torch.tensor(x, requires_grad=True) for x in (q, k, v))
    group = heads // kv_heads
    s = tq @ tk.repeat_interleave(group, 1).transpose(-1, -2) * 0.4
    allowed = torch.tensor(mask(sq, skv, alignment) if causal else np.ones((sq, skv), bool))
    seen = allowed.any(-1, keepdim=True)
    s = s.masked_fill(~allowed, float("-inf")).masked_fill(~seen, 0.0)
    tout = (torch.softmax(s, -1) * seen) @ tv.repeat_interleave(group, 1)
    tout.backward(torch.tensor(do))
    np.testing.assert_allclose(out, tout.detach().numpy(), rtol=1e-10, atol=1e-12)
    blind = ~seen.numpy()[:, 0]
    assert blind.sum() == (max(0, sq - skv) if causal and alignment == "bottom_right" else 0)
    np.testing.assert_allclose(lse[..., ~blind],
                               torch.logsumexp(s, -1).detach().numpy()[..., ~blind], rtol=1e-10)
    assert (lse[..., blind] == -np.inf).all() and (out[:, :, blind] == 0).all()
    assert (dq[:, :, blind] == 0).all()
    for mine, theirs in ((dq, tq), (dk, tk), (dv, tv)):
        np.testing.assert_allclose(mine, theirs.grad.numpy(), rtol=1e-9, atol=1e-11)


@pytest.mark.parametrize("alignment,seqlens", [("top_left", (6, 6)), ("bottom_right", (4, 7)),
                                               ("bottom_right", (7, 4))])
def test_reference_matches_finite_differences(alignment, seqlens):
    """Without torch too: the loss sum(out * dO) differentiated numerically, a few random
    directions per input (central differences in float64)."""
    q, k, v, do = _inputs(4, 1, 4, 2, *seqlens, 4)
    _, _, dq, dk, dv = reference_attention_backward(q, k, v, do, causal=True,
                                                    causal_alignment=alignment)

    def loss(q_, k_, v_):
        return float((reference_attention_backward(q_, k_, v_, do, causal=True,
                                                   causal_alignment=alignment)[0] * do).sum())
    rng = np.random.default_rng(0)
    h = 1e-6
    for which, grad in enumerate((dq, dk, dv)):
        for _ in range(3):
            direction = rng.standard_normal(grad.shape)
            args_plus = [q, k, v]
            args_minus = [q, k, v]
            args_plus[which] = args_plus[which] + h * direction
            args_minus[which] = args_minus[which] - h * direction
            numeric = (loss(*args_plus) - loss(*args_minus)) / (2 * h)
            assert numeric == pytest.approx(float((grad * direction).sum()), rel=1e-6, abs=1e-8)


def _block(p: AttentionProblem, q_tile, kv_tile):
    """The brute-force mask of (Q tile, K/V tile): real query rows x the tile's key columns
    (True: seen), columns past seqlen_kv False."""
    allowed = (mask(p.seqlen_q, p.seqlen_kv, p.causal_alignment) if p.causal
               else np.ones((p.seqlen_q, p.seqlen_kv), bool))
    block = np.zeros((min((q_tile + 1) * p.tile_m, p.seqlen_q) - q_tile * p.tile_m, p.tile_n),
                     bool)
    piece = allowed[q_tile * p.tile_m:(q_tile + 1) * p.tile_m,
                    kv_tile * p.tile_n:(kv_tile + 1) * p.tile_n]
    block[:, :piece.shape[1]] = piece
    return block


def _visible(p: AttentionProblem, q_tile, kv_tile) -> bool:
    """Whether some real query row of `q_tile` sees some real key of `kv_tile`."""
    return bool(_block(p, q_tile, kv_tile).any())


def _needs_no_mask(p: AttentionProblem, q_tile, kv_tile) -> bool:
    """Every real query row of `q_tile` sees every column of `kv_tile` (none past the end)."""
    return bool(_block(p, q_tile, kv_tile).all())


PROBLEMS = [
    AttentionProblem(2, 4, 2, 333, 333, 64, True, 64, 128),
    AttentionProblem(2, 4, 2, 333, 333, 64, False, 64, 128),
    AttentionProblem(1, 3, 1, 200, 517, 128, True, 64, 64),
    AttentionProblem(1, 3, 3, 517, 200, 128, True, 128, 64),
    AttentionProblem(3, 2, 1, 256, 256, 64, False, 128, 128),
    AttentionProblem(1, 8, 2, 1024, 1024, 128, True, 64, 64),
    AttentionProblem(1, 3, 1, 200, 517, 128, True, 64, 64, causal_alignment="bottom_right"),
    AttentionProblem(2, 3, 3, 517, 200, 128, True, 128, 64, causal_alignment="bottom_right"),
    AttentionProblem(1, 4, 2, 333, 333, 64, True, 64, 128, causal_alignment="bottom_right"),
    AttentionProblem(1, 2, 1, 1000, 77, 64, True, 64, 128, causal_alignment="bottom_right"),
]


@pytest.mark.parametrize("schedule", SCHEDULES)
@pytest.mark.parametrize("problem", PROBLEMS, ids=range(len(PROBLEMS)))
def test_work_table_visits_every_pair_once(problem, schedule):
    """Every (batch, K/V head, K/V tile) is one item; its visits cover each (query head of its
    group, Q tile) pair with a visible key exactly once and no other pair (the brute-force
    mask's), and the unmasked ones need no mask; the item carries its causal diagonal."""
    p = problem
    launch = BackwardLaunch.of(p, schedule, sms=5, ctas_per_sm=1, l2_bytes=200_000)
    table = launch.work_table
    assert table.shape[0] == launch.num_items == p.batch * p.kv_heads * p.kv_tiles
    units = {(int(r[BWD_BATCH]), int(r[BWD_KV_HEAD]), int(r[BWD_KV_TILE])) for r in table}
    assert len(units) == len(table)
    group = p.qheads_per_kv
    for item, row in enumerate(table):
        batch, kv_head, kv_tile = units_row = (int(row[BWD_BATCH]), int(row[BWD_KV_HEAD]),
                                               int(row[BWD_KV_TILE]))
        assert 0 <= batch < p.batch and 0 <= kv_head < p.kv_heads and 0 <= kv_tile < p.kv_tiles
        visits = launch.q_order(item)
        assert len(set(visits)) == len(visits), units_row
        masked = set(range(row[BWD_MASKED_LO], row[BWD_MASKED_HI]))
        expected = {(h, i) for h in range(kv_head * group, (kv_head + 1) * group)
                    for i in range(p.q_tiles) if _visible(p, i, kv_tile)}
        assert expected == set(visits), units_row
        assert row[BWD_DIAGONAL] == p.diagonal
        for head, q_tile in visits:
            assert kv_head * group <= head < (kv_head + 1) * group
            assert 0 <= q_tile < p.q_tiles
            if q_tile not in masked:
                assert _needs_no_mask(p, q_tile, kv_tile), (units_row, q_tile)


@pytest.mark.parametrize("cta", ["persistent", "grouped", "longest_first"])
def test_sawtooth_alternates_on_each_ctas_own_items(cta):
    p = AttentionProblem(2, 4, 2, 1000, 1000, 64, False, 64, 64)
    for scan in BACKWARD_SCANS:
        launch = BackwardLaunch.of(p, f"{cta}+{scan}", sms=6, ctas_per_sm=1, l2_bytes=1 << 20)
        for c in range(launch.num_ctas):
            steps = [int(launch.work_table[item][BWD_SCAN_STEP])
                     for item in launch.items_of_cta(c)]
            heads = [int(launch.work_table[item][BWD_HEAD_STEP])
                     for item in launch.items_of_cta(c)]
            if scan == "linear":
                assert set(steps) == {1} and set(heads) == {1}
            else:
                assert steps == [1 - 2 * (n % 2) for n in range(len(steps))] == heads


def test_orders_differ_as_named():
    p = AttentionProblem(2, 4, 2, 512, 512, 64, True, 64, 64)

    def first_items(schedule, n=4, **kw):
        launch = BackwardLaunch.of(p, schedule, sms=4, ctas_per_sm=1, **kw)
        return [tuple(int(x) for x in launch.work_table[i][[BWD_BATCH, BWD_KV_HEAD,
                                                            BWD_KV_TILE]]) for i in range(n)]
    assert first_items("persistent+linear", l2_bytes=1 << 20) == [(0, 0, j) for j in range(4)]
    # longest first under the top-left causal mask: the first K/V tile of every unit first
    assert first_items("longest_first+linear", l2_bytes=1 << 20) == [
        (0, 0, 0), (0, 1, 0), (1, 0, 0), (1, 1, 0)]
    # grouped: units of a group fastest (two units' Q, dO and float32 dQ, 1 MB, fit half of
    # 2.2 MB)
    assert first_items("grouped+linear", l2_bytes=2_200_000) == [
        (0, 0, 0), (0, 1, 0), (0, 0, 1), (0, 1, 1)]


def test_bad_schedules_are_refused_by_name():
    p = AttentionProblem(1, 2, 2, 100, 100, 64)
    with pytest.raises(ValueError, match="CTA schedule"):
        BackwardLaunch.of(p, "dynamic+linear", 4, 1, 1 << 20)
    with pytest.raises(ValueError, match="Q scan"):
        BackwardLaunch.of(p, "persistent+tiled", 4, 1, 1 << 20)
    with pytest.raises(ValueError, match="schedule must be"):
        BackwardLaunch.of(p, "persistent", 4, 1, 1 << 20)


@pytest.mark.parametrize("diagonal", [0, 100, -100])
def test_q_tile_span_on_arrays_matches_ints(diagonal):
    kv = np.arange(9)
    first, unmasked, q_tiles = q_tile_span(kv, 64, 128, 1000, 1100, True, diagonal)
    for j in kv:
        assert q_tile_span(int(j), 64, 128, 1000, 1100, True, diagonal) == (
            first[j], unmasked[j], q_tiles)


# Ragged lengths on either side of each other and equal, tiles of the kernels' and small ones
SPAN_LENGTHS = [(1, 1), (1, 300), (300, 1), (5, 64), (64, 65), (65, 64), (100, 130), (130, 100),
                (200, 517), (517, 200), (333, 333), (256, 256), (1000, 77)]
SPAN_TILES = [(16, 16), (32, 16), (64, 64), (64, 128), (128, 64), (128, 128)]


@pytest.mark.parametrize("alignment", ["top_left", "bottom_right"])
@pytest.mark.parametrize("tile_m,tile_n", SPAN_TILES)
def test_q_tile_span_is_the_brute_force_mask(tile_m, tile_n, alignment):
    """For every K/V tile: the Q tiles before `first` hold no real row that sees one of its
    keys, every Q tile from `first` on holds one, and from `unmasked` on every real row sees
    every column (none past seqlen_kv), against the mask itself (numpy's tril)."""
    for sq, skv in SPAN_LENGTHS:
        p = AttentionProblem(1, 1, 1, sq, skv, 64, True, tile_m, tile_n,
                             causal_alignment=alignment)
        for j in range(p.kv_tiles):
            first, unmasked, q_tiles = q_tile_span(j, tile_m, tile_n, sq, skv, True, p.diagonal)
            assert q_tiles == p.q_tiles and first <= unmasked <= q_tiles
            for i in range(q_tiles):
                assert _visible(p, i, j) == (i >= first), (sq, skv, i, j, first)
                if i >= unmasked:
                    assert _needs_no_mask(p, i, j), (sq, skv, i, j, unmasked)


@pytest.mark.parametrize("alignment", ["top_left", "bottom_right"])
def test_the_two_passes_visit_the_same_pairs_masked_alike(alignment):
    """The K/V-major span is the forward's (`kv_tile_span`, which the Q-major dQ pass runs)
    turned around: Q tile i visits K/V tile j in the one iff in the other, and unmasked in the
    one iff in the other."""
    for (sq, skv), (tile_m, tile_n) in zip(SPAN_LENGTHS * 2, SPAN_TILES * 5):
        d = causal_diagonal(sq, skv, alignment)
        q_tiles, kv_tiles = -(-sq // tile_m), -(-skv // tile_n)
        first, unmasked, _ = q_tile_span(np.arange(kv_tiles), tile_m, tile_n, sq, skv, True, d)
        for i in range(q_tiles):
            visited, first_masked = kv_tile_span(i, tile_m, tile_n, sq, skv, True, d)
            for j in range(kv_tiles):
                assert (j < visited) == (i >= first[j]), (sq, skv, i, j)
                assert (j < first_masked) == (i >= unmasked[j]), (sq, skv, i, j)


# --------------------------------------------------------------------------------------------
# The kernels' walk of the tables, in NumPy: what `flash_attention_bwd_kv` and
# `flash_attention_bwd_dq` compute, tile by tile, with zero padding and the masks only on the
# tiles the tables mark (so a table that skipped a mask, or a visit, would fail here).
# --------------------------------------------------------------------------------------------

def _tile(x, b, h, index, rows):
    out = np.zeros((rows,) + x.shape[3:])
    piece = x[b, h, index * rows:(index + 1) * rows]
    out[:len(piece)] = piece
    return out


def _put(x, b, h, index, rows, value, add=False):
    """Store (or add) a tile; its rows past the array's end are dropped, as the kernels'."""
    piece = x[b, h, index * rows:(index + 1) * rows]
    piece[:] = piece + value[:len(piece)] if add else value[:len(piece)]


def _seen_lse(lse):
    """The kernels' `_seen_lse`: a row that saw no key (LSE -inf) taken as LSE +inf."""
    return np.where(lse != -np.inf, lse, np.inf)


def _sequence_views(row, columns, q_side, kv_side):
    """A packed table's row: its sequence's rows of the Q-side and K/V-side arrays (views, so
    stores land in the packed arrays), as the kernels slice them; `columns`: (Q start, K/V
    start, Q length, K/V length) of the table."""
    q_start, kv_start, seqlen_q, seqlen_kv = (int(row[c]) for c in columns)
    return ([x[:, :, q_start:q_start + seqlen_q] for x in q_side],
            [x[:, :, kv_start:kv_start + seqlen_kv] for x in kv_side])


def _emulate(launch: BackwardLaunch, q, k, v, do, out, lse, scale, deterministic,
             coalesced=False):
    """A packed batch's launch (`VarlenBackwardLaunch`): the arrays are (1, heads, total rows,
    D) and each row's sequence is sliced out of them, as the kernels do. `coalesced`: the
    atomic mode's tile-major accumulator (`dq_tile_offsets`), added into per Q tile and read
    back as `convert_dq_tiles` does."""
    from wavefront.kernel.backward import dq_tile_offsets
    from wavefront.backward_schedules import (BWD_KV_START, BWD_Q_START, BWD_SEQLEN_KV,
                                              BWD_SEQLEN_Q)
    from wavefront.schedules import WORK_KV_START, WORK_Q_START, WORK_SEQLEN_KV, WORK_SEQLEN_Q
    p = launch.problem
    packed = hasattr(launch, "seqlens_q")
    M, N = p.tile_m, p.tile_n
    delta = (do * out).sum(-1)
    dq_acc = np.zeros(q.shape)
    q_tiles = -(-q.shape[2] // M)
    tiles_acc = np.zeros(q.shape[:2] + (q_tiles, M * p.head_dim))
    offsets = dq_tile_offsets(M, p.head_dim)
    # NaN as the kernels' empty dK/dV: a K/V tile no item stores shows, even where its true
    # gradient is 0 (keys no query sees, a sequence without queries)
    dk, dv = np.full(k.shape, np.nan), np.full(k.shape, np.nan)
    for row in launch.work_table:
        (qs, dos, lses, deltas, dqs), (ks, vs, dks, dvs) = (
            [q, do, lse, delta, dq_acc], [k, v, dk, dv])
        b, kvh, j = (int(row[c]) for c in (BWD_BATCH, BWD_KV_HEAD, BWD_KV_TILE))
        if packed:
            (qs, dos, lses, deltas, dqs), (ks, vs, dks, dvs) = _sequence_views(
                row, (BWD_Q_START, BWD_KV_START, BWD_SEQLEN_Q, BWD_SEQLEN_KV),
                (qs, dos, lses, deltas, dqs), (ks, vs, dks, dvs))
            b = 0
        seqlen_kv = ks.shape[2]
        kt, vt = _tile(ks, b, kvh, j, N), _tile(vs, b, kvh, j, N)
        dk_acc, dv_acc = np.zeros((N, p.head_dim)), np.zeros((N, p.head_dim))
        tiles = ([(i, True) for i in range(row[BWD_MASKED_LO], row[BWD_MASKED_HI])]
                 + [(int(row[BWD_SCAN_START] + row[BWD_SCAN_STEP] * t), False)
                    for t in range(row[BWD_SCAN_COUNT])])
        for g in range(p.qheads_per_kv):
            h = int(row[BWD_HEAD_FIRST] + row[BWD_HEAD_STEP] * g)
            for i, masked in tiles:
                qt, dot = _tile(qs, b, h, i, M), _tile(dos, b, h, i, M)
                lse_t, delta_t = _tile(lses[..., None], b, h, i, M)[:, 0], _tile(
                    deltas[..., None], b, h, i, M)[:, 0]
                s_t = kt @ qt.T
                if masked:
                    cols = j * N + np.arange(N)[:, None]
                    keep = cols < seqlen_kv
                    if p.causal:
                        rows = i * M + np.arange(M)[None, :] + row[BWD_DIAGONAL]
                        keep = keep & (rows >= cols)
                        lse_t = _seen_lse(lse_t)
                    s_t = np.where(keep, s_t, -np.inf)
                p_t = np.exp(s_t * scale - lse_t[None, :])
                dv_acc += p_t @ dot
                ds_t = p_t * (vt @ dot.T - delta_t[None, :]) * scale
                dk_acc += ds_t @ qt
                if coalesced:
                    np.add.at(tiles_acc[b, h, i], offsets, ds_t.T @ kt)
                else:
                    _put(dqs, b, h, i, M, ds_t.T @ kt, add=True)
        _put(dks, b, kvh, j, N, dk_acc)
        _put(dvs, b, kvh, j, N, dv_acc)
    if coalesced:  # convert_dq_tiles: each tile read as (D, M), transposed; rows past the end cut
        rows = tiles_acc.reshape(q.shape[:2] + (q_tiles, p.head_dim, M)).swapaxes(-1, -2)
        dq_acc[:] = rows.reshape(q.shape[:2] + (q_tiles * M, p.head_dim))[:, :, :q.shape[2]]
    if deterministic:
        dq_acc[:] = np.nan  # the Q-major pass writes every row
        for row in launch.dq_launch.work_table:
            (qs, dos, lses, deltas, dqs), (ks, vs) = [q, do, lse, delta, dq_acc], [k, v]
            b, h, kvh, i = (int(row[c]) for c in (WORK_BATCH, WORK_HEAD, WORK_KV_HEAD,
                                                  WORK_Q_TILE))
            if packed:
                (qs, dos, lses, deltas, dqs), (ks, vs) = _sequence_views(
                    row, (WORK_Q_START, WORK_KV_START, WORK_SEQLEN_Q, WORK_SEQLEN_KV),
                    (qs, dos, lses, deltas, dqs), (ks, vs))
                b = 0
            seqlen_kv = ks.shape[2]
            qt, dot = _tile(qs, b, h, i, M), _tile(dos, b, h, i, M)
            lse_t = _tile(lses[..., None], b, h, i, M)
            if p.causal:
                lse_t = _seen_lse(lse_t)
            delta_t = _tile(deltas[..., None], b, h, i, M)
            acc = np.zeros((M, p.head_dim))
            tiles = ([(int(row[WORK_SCAN_START] + row[WORK_SCAN_STEP] * t), False)
                      for t in range(row[WORK_SCAN_COUNT])]
                     + [(j, True) for j in range(row[WORK_MASKED_LO], row[WORK_MASKED_HI])])
            for j, masked in tiles:
                kt, vt = _tile(ks, b, kvh, j, N), _tile(vs, b, kvh, j, N)
                s = qt @ kt.T
                if masked:
                    cols = j * N + np.arange(N)[None, :]
                    keep = cols < seqlen_kv
                    if p.causal:
                        keep = keep & (i * M + np.arange(M)[:, None] + row[WORK_DIAGONAL] >= cols)
                    s = np.where(keep, s, -np.inf)
                pm = np.exp(s * scale - lse_t)
                acc += pm * (dot @ vt.T - delta_t) * scale @ kt
            _put(dqs, b, h, i, M, acc)
    return dq_acc, dk, dv


@pytest.mark.parametrize("deterministic", [False, True])
@pytest.mark.parametrize("schedule", ["persistent+sawtooth", "grouped+linear",
                                      "longest_first+sawtooth", "grid+linear"])
@pytest.mark.parametrize("problem", [
    AttentionProblem(2, 4, 2, 77, 77, 8, True, 16, 32),
    AttentionProblem(1, 3, 1, 50, 83, 8, True, 32, 16),
    AttentionProblem(1, 2, 2, 83, 50, 8, False, 16, 16),
    AttentionProblem(1, 3, 1, 50, 83, 8, True, 32, 16, causal_alignment="bottom_right"),
    AttentionProblem(2, 4, 2, 83, 50, 8, True, 16, 32, causal_alignment="bottom_right"),
    AttentionProblem(1, 2, 1, 77, 77, 8, True, 32, 16, causal_alignment="bottom_right"),
], ids=["gqa-causal", "long-kv-causal", "long-q-full", "long-kv-bottom-right",
        "long-q-bottom-right", "equal-bottom-right"])
def test_the_kernels_walk_of_the_tables_gives_the_reference(problem, schedule, deterministic):
    """The tables walked as the kernels walk them (masks only where the tables say, the causal
    diagonal from the row, rows that saw no key through `_seen_lse`) give the float64
    reference's gradients; bottom-right with S_q > S_kv: the blind rows' dQ exactly 0."""
    p = problem
    q, k, v, do = _inputs(7, p.batch, p.heads, p.kv_heads, p.seqlen_q, p.seqlen_kv, p.head_dim)
    scale = 1 / math.sqrt(p.head_dim)
    out, lse, dq, dk, dv = reference_attention_backward(q, k, v, do, causal=p.causal,
                                                        causal_alignment=p.causal_alignment)
    launch = BackwardLaunch.of(p, schedule, sms=3, ctas_per_sm=1, l2_bytes=4000)
    got = _emulate(launch, q, k, v, do, out, lse, scale, deterministic)
    for mine, want in zip(got, (dq, dk, dv)):
        np.testing.assert_allclose(mine, want, rtol=1e-9, atol=1e-10)
    blind = max(0, p.seqlen_q - p.seqlen_kv) if p.causal_alignment == "bottom_right" else 0
    assert (got[0][:, :, :blind] == 0).all()


@pytest.mark.parametrize("problem", [
    AttentionProblem(2, 4, 2, 77, 77, 8, True, 16, 32),
    AttentionProblem(1, 2, 2, 83, 50, 8, False, 16, 16),
    AttentionProblem(2, 4, 2, 83, 50, 8, True, 16, 32, causal_alignment="bottom_right"),
], ids=["gqa-causal", "long-q-full", "long-q-bottom-right"])
def test_coalesced_dq_accumulator_gives_the_reference(problem):
    """The atomic mode's coalesced dQ accumulator (config `atomic_coalesced`): each Q tile's
    contribution added at `dq_tile_offsets` (a column-major tile, the last one padded past
    seqlen_q) and read back as `convert_dq_tiles` reads it gives the float64 reference's dQ;
    the offsets of a tile are each of its elements once."""
    from wavefront.kernel.backward import dq_tile_offsets
    p = problem
    offsets = dq_tile_offsets(p.tile_m, p.head_dim)
    assert sorted(offsets.ravel()) == list(range(p.tile_m * p.head_dim))
    assert (offsets[1:] - offsets[:-1] == 1).all()  # rows adjacent: a warp's adds contiguous
    q, k, v, do = _inputs(9, p.batch, p.heads, p.kv_heads, p.seqlen_q, p.seqlen_kv, p.head_dim)
    out, lse, dq, dk, dv = reference_attention_backward(q, k, v, do, causal=p.causal,
                                                        causal_alignment=p.causal_alignment)
    launch = BackwardLaunch.of(p, "persistent+sawtooth", sms=3, ctas_per_sm=1, l2_bytes=4000)
    got = _emulate(launch, q, k, v, do, out, lse, 1 / math.sqrt(p.head_dim), False,
                   coalesced=True)
    for mine, want in zip(got, (dq, dk, dv)):
        np.testing.assert_allclose(mine, want, rtol=1e-9, atol=1e-10)


# --------------------------------------------------------------------------------------------
# Ahead-of-time compilation (no GPU)
# --------------------------------------------------------------------------------------------

def _compile(variant):
    from wavefront.kernel.attention import compile_variant
    from wavefront.kernel.cubin import kernel_resources
    try:
        return variant.label, kernel_resources(compile_variant(variant, "sm_90")), None
    except Exception as exc:  # reported with the variant's name below
        return variant.label, None, f"{type(exc).__name__}: {exc}"


def _compile_all(variants):
    with ProcessPoolExecutor(max_workers=max(2, os.cpu_count() or 2)) as pool:
        results = list(pool.map(_compile, variants))
    failed = [(label, err) for label, _, err in results if err]
    assert not failed, failed[:3]
    for label, resources, _ in results:
        (kernel,) = resources
        assert kernel.registers is not None and 0 < kernel.registers <= 255, label
        assert kernel.shared_bytes <= 227 * 1024, label
    return results


@pytest.mark.compile
def test_backward_binaries_of_one_dtype_compile_for_sm90():
    pytest.importorskip("cuda.tile", reason="compiling needs cuda-tile (the gpu extra)")
    from wavefront.kernel.backward import all_backward_variants
    variants = list(all_backward_variants(dtypes=("bfloat16",)))
    # per head dim, dense and packed: K/V-major (2 masks x atomic/deterministic) and the dQ
    # kernel (2 masks); the preprocess, the dQ conversion and the coalesced accumulator's (the
    # default config adds coalesced)
    assert len(variants) == 2 * (2 * (4 + 2) + 3)
    _compile_all(variants)


@pytest.mark.compile
@pytest.mark.slow
def test_float16_and_other_tile_shapes_compile_for_sm90():
    """float16's dense binaries, and every tile shape of the bfloat16 K/V-major kernel (causal,
    both dQ modes): the specialisations the fast test above leaves out, kept to about 25
    compiles for the CI's time budget (the packed float16 ones differ from bfloat16's only in
    the element type)."""
    pytest.importorskip("cuda.tile", reason="compiling needs cuda-tile (the gpu extra)")
    from wavefront.backward_schedules import BACKWARD_TILE_SHAPES
    from wavefront.kernel.backward import BackwardKvVariant, all_backward_variants
    variants = {v for v in all_backward_variants(dtypes=("float16",))
                if not getattr(v, "varlen", False)}
    for tiles in BACKWARD_TILE_SHAPES:
        for head_dim in (64, 128):
            variants |= {BackwardKvVariant("bfloat16", head_dim, *tiles, True, atomic)
                         for atomic in (True, False)}
    variants -= set(all_backward_variants(dtypes=("bfloat16",)))
    _compile_all(sorted(variants, key=lambda v: v.label))


@pytest.mark.compile
@pytest.mark.slow
def test_every_named_backward_config_compiles_for_sm90():
    """Every binary the named configs (`BACKWARD_CONFIGS`, the bench's `--variants all`) run,
    bfloat16, both masks (the causal binaries read each item's diagonal: top-left and
    bottom-right alike); the atomic mode's with a latency hint left out (the bench times
    none)."""
    pytest.importorskip("cuda.tile", reason="compiling needs cuda-tile (the gpu extra)")
    from wavefront.backward_schedules import BACKWARD_CONFIGS
    from wavefront.kernel.backward import all_backward_variants, config_variants
    variants = {v for by_dim in BACKWARD_CONFIGS.values() for d, c in by_dim.items()
                for causal in (False, True)
                for v in config_variants(c, "bfloat16", d, causal).values()
                if not (getattr(v, "atomic_dq", False) and v.q_latency)}
    variants -= set(all_backward_variants(dtypes=("bfloat16",)))  # the fast test's
    _compile_all(sorted(variants, key=lambda v: v.label))


@pytest.mark.compile
def test_two_warpgroups_kv_kernel_keeps_its_accumulators_in_registers():
    """The lever `two_warpgroups` pulls (FlashAttention-3's 64 x 128 cut, two consumer
    warpgroups): the K/V-major kernel's dK, dV stay in registers, 168 a thread and no local
    memory at all, where one warpgroup over 128 K/V rows spills hundreds of values (SASS of
    sm_90, tileiras 13.4; `scripts/backward_bench.py --sass`). The loop does the same tensor
    work per warpgroup as the default's at D=128 (24 HGMMAs, 2 Mi multiply-accumulates)."""
    pytest.importorskip("cuda.tile", reason="compiling needs cuda-tile (the gpu extra)")
    from wavefront.kernel.sass import find_cuobjdump, mma_loop_table, summarise, disassemble
    if find_cuobjdump() is None:
        pytest.skip("cuobjdump not found")
    from wavefront.backward_schedules import backward_config
    from wavefront.kernel.attention import compile_variant
    from wavefront.kernel.backward import config_variants
    from wavefront.kernel.cubin import kernel_resources
    variants = config_variants(backward_config("two_warpgroups", 128), "bfloat16", 128, False)
    two = compile_variant(variants["kv_det"], "sm_90")
    sass = disassemble(two)
    summary = summarise(sass)
    assert summary.local_loads == summary.local_stores == 0, summary
    assert kernel_resources(two)[0].registers <= 168
    loops = mma_loop_table(sass)
    assert loops and all(r["hgmma"] == 24 and r["macs"] == 2 * 1024 * 1024 for r in loops), loops
    one = summarise(disassemble(compile_variant(
        dataclasses.replace(variants["kv_det"], worker_warps=None), "sm_90")))
    assert one.local_loads + one.local_stores > 100, one


@pytest.mark.compile
def test_masked_first_dq_kernel_keeps_its_unmasked_loop_out_of_local_memory():
    """The dQ kernel at D=128 (64x64, sm_90, tileiras 13.4): with the unmasked K/V loop first
    (the default) that loop spills; with the masked tiles first it keeps everything in
    registers and is shorter. The unmasked loop: the MMA loop with the fewest compares."""
    pytest.importorskip("cuda.tile", reason="compiling needs cuda-tile (the gpu extra)")
    from wavefront.kernel.sass import disassemble, find_cuobjdump, mma_loop_table
    if find_cuobjdump() is None:
        pytest.skip("cuobjdump not found")
    from wavefront.kernel.attention import compile_variant
    from wavefront.kernel.backward import BackwardDqVariant
    unmasked = {}
    for first in (False, True):
        variant = BackwardDqVariant("bfloat16", 128, 64, 64, False, masked_first=first)
        loops = mma_loop_table(disassemble(compile_variant(variant, "sm_90")))
        assert len(loops) == 2, loops
        unmasked[first] = min(loops, key=lambda r: r["isetp"])
    assert unmasked[False]["ldl"] + unmasked[False]["stl"] > 0, unmasked
    assert unmasked[True]["ldl"] == unmasked[True]["stl"] == 0, unmasked
    assert unmasked[True]["instructions"] < unmasked[False]["instructions"], unmasked
    assert unmasked[True]["hgmma"] == unmasked[False]["hgmma"], unmasked


@pytest.mark.compile
@pytest.mark.parametrize("head_dim", [64, 128])
def test_coalesced_dq_accumulate_compiles_without_spills(head_dim):
    """The atomic mode's coalesced dQ accumulate (config `atomic_coalesced`, the default's
    64x128 cut with two consumer warpgroups; sm_90, tileiras 13.4): no local memory, shared
    memory within a CTA's 227 KiB and no more than the row-major accumulate's, as many float
    reductions per trip of the steady loop, in fewer instructions (no bounds checks, one
    address per row pair of lanes); and its conversion kernel builds."""
    pytest.importorskip("cuda.tile", reason="compiling needs cuda-tile (the gpu extra)")
    from wavefront.kernel.sass import disassemble, find_cuobjdump, mma_loop_table, summarise
    if find_cuobjdump() is None:
        pytest.skip("cuobjdump not found")
    from wavefront.kernel.attention import compile_variant
    from wavefront.kernel.backward import BackwardKvVariant, RowsVariant
    from wavefront.kernel.cubin import kernel_resources
    found = {}
    for coalesced in (False, True):
        variant = BackwardKvVariant("bfloat16", head_dim, 64, 128, False, True, worker_warps=8,
                                    dq_coalesced=coalesced)
        cubin = compile_variant(variant, "sm_90")
        (resources,) = kernel_resources(cubin)
        sass = disassemble(cubin)
        steady = min(mma_loop_table(sass), key=lambda r: (r["isetp"], r["instructions"]))
        found[coalesced] = (resources, summarise(sass), steady, sass)
    (res, summary, steady, _), (res0, _, steady0, _) = found[True], found[False]
    assert summary.local_loads == summary.local_stores == 0, summary
    assert res.registers <= 168 and res.shared_bytes <= min(227 * 1024, res0.shared_bytes)
    assert steady["red"] == steady0["red"] == 64 * head_dim // 256, (steady, steady0)
    assert steady["instructions"] < steady0["instructions"], (steady, steady0)
    # where a warp's adds land (`backward_sass`): 128 contiguous bytes, 4 sectors, against
    # 4 adjacent floats per lane (D128: 16 sectors half used; D64, two rows a warp: ~8.6)
    from wavefront.kernel.backward_sass import sectors_per_red
    assert set(sectors_per_red(found[True][3])) == {4.0}
    assert min(sectors_per_red(found[False][3])) >= (16 if head_dim == 128 else 8)
    (convert,) = kernel_resources(compile_variant(
        RowsVariant("convert_dq_tiles", "bfloat16", head_dim, 64), "sm_90"))
    assert 0 < convert.registers <= 255 and convert.shared_bytes <= 227 * 1024


@pytest.mark.compile
def test_dq_add_probe_compiles_for_sm90():
    """The atomic dQ accumulate timed alone (`scripts/backward_bench.py --red-probe`), both
    layouts, both head dims: built without local memory, one REDG per float it adds."""
    pytest.importorskip("cuda.tile", reason="compiling needs cuda-tile (the gpu extra)")
    from wavefront.kernel.sass import disassemble, find_cuobjdump, summarise
    if find_cuobjdump() is None:
        pytest.skip("cuobjdump not found")
    from wavefront.kernel.attention import compile_variant
    from wavefront.kernel.backward import TILE_M_PROBE, DqAddProbeVariant
    from wavefront.kernel.cubin import kernel_resources
    for head_dim in (64, 128):
        for coalesced in (False, True):
            cubin = compile_variant(DqAddProbeVariant(head_dim, TILE_M_PROBE, coalesced),
                                    "sm_90")
            (resources,) = kernel_resources(cubin)
            sass = disassemble(cubin)
            summary = summarise(sass)
            assert 0 < resources.registers <= 255
            assert summary.local_loads == summary.local_stores == 0, summary
            reds = sass.count("REDG.E.ADD.F32")
            # one add per float of the tile and thread, the loop's body possibly twice
            assert reds in (TILE_M_PROBE * head_dim // 128, TILE_M_PROBE * head_dim // 64)
            if head_dim == 128:  # the layouts derived by hand from this SASS
                from wavefront.kernel.backward_sass import red_addresses
                _, lanes = red_addresses(sass, 128)[0]
                # row-major: each lane 4 adjacent floats, lanes 16 bytes apart; coalesced:
                # lanes one float (4 bytes) apart (modulo 2^32: the low words)
                assert set(np.diff(lanes[:32]) % (1 << 32)) == ({4} if coalesced else {16})


def test_named_configs_and_their_errors():
    from wavefront.backward_schedules import (BACKWARD_CONFIGS, DEFAULT_BACKWARD_CONFIG,
                                              DEFAULT_BACKWARD_TILES, BackwardConfig,
                                              backward_config)
    for d, tiles in DEFAULT_BACKWARD_TILES.items():
        assert backward_config(None, d) == BACKWARD_CONFIGS[DEFAULT_BACKWARD_CONFIG][d]
        assert backward_config(None, d).kv_tiles == tiles
    assert set(BACKWARD_CONFIGS) >= {"first_cut", "two_warpgroups"}
    for by_dim in BACKWARD_CONFIGS.values():
        assert set(by_dim) == {64, 128}
    with pytest.raises(ValueError, match="config must be"):
        backward_config("fastest", 64)
    with pytest.raises(ValueError, match="kv_tiles"):
        BackwardConfig((32, 64), (64, 64))
    with pytest.raises(ValueError, match="dq_worker_warps"):
        BackwardConfig((64, 64), (64, 64), None, 4)
    with pytest.raises(ValueError, match="dq_masked_first"):
        BackwardConfig((64, 64), (64, 64), dq_masked_first=1)
    with pytest.raises(ValueError, match="dq_coalesced"):
        BackwardConfig((64, 64), (64, 64), dq_coalesced="yes")
    from wavefront.kernel.backward import BackwardKvVariant, RowsVariant
    for atomic, varlen in ((False, False), (True, True)):
        with pytest.raises(ValueError, match="dq_coalesced .* needs atomic_dq"):
            BackwardKvVariant("bfloat16", 64, 64, 128, False, atomic, varlen=varlen,
                              dq_coalesced=True)
    with pytest.raises(ValueError, match="which must be one of"):
        RowsVariant("convert", "bfloat16", 64)
    with pytest.raises(ValueError, match="tile_m must be 64 or 128"):
        RowsVariant("convert_dq_tiles", "bfloat16", 64, 32)
    # the coalesced config changes the atomic mode only: the default is measured_pick's cut
    # with its atomic mode coalesced
    for d, coalesced in BACKWARD_CONFIGS["atomic_coalesced"].items():
        pick = BACKWARD_CONFIGS["measured_pick"][d]
        assert coalesced.dq_coalesced and not pick.dq_coalesced
        assert dataclasses.replace(coalesced, dq_coalesced=False) == pick
        assert BACKWARD_CONFIGS[DEFAULT_BACKWARD_CONFIG][d] == coalesced
    from wavefront.kernel.backward_call import config_for, dq_launch_of
    with pytest.raises(ValueError, match="tiles or config"):
        config_for("64x64", "first_cut", 64)
    assert config_for("64x128", None, 128) == BackwardConfig((64, 128), (64, 128))
    from wavefront.kernel.backward_call import backward_launch
    chosen = backward_config("two_warpgroups", 128)
    launch = backward_launch((1, 4, 1000, 128), (1, 2, 1000, 128), causal=True, config=chosen)
    assert (launch.problem.tile_m, launch.problem.tile_n) == chosen.kv_tiles
    dq = dq_launch_of(launch, chosen)
    assert (dq.problem.tile_m, dq.problem.tile_n) == chosen.dq_tiles
    # the dQ pass's table at its own tiles is the forward's table of that cut
    from wavefront.schedules import Launch
    assert (dq.work_table == Launch(dq.problem, launch.cta, launch.q_scan, launch.sms, 1,
                                    launch.l2_bytes).work_table).all()


def test_backward_contracts_follow_the_kernel_signatures():
    pytest.importorskip("cuda.tile", reason="the kernels need cuda-tile")
    import inspect

    from wavefront.kernel import backward
    for params, function in ((backward.BWD_KV_PARAMS, backward.flash_attention_bwd_kv),
                             (backward.BWD_DQ_PARAMS, backward.flash_attention_bwd_dq),
                             (backward.PREPROCESS_PARAMS, backward.backward_preprocess._pyfunc),
                             (backward.CONVERT_DQ_PARAMS, backward.convert_dq._pyfunc)):
        assert [p.name for p in params] == list(inspect.signature(function).parameters)
    with pytest.raises(ValueError, match="tiles"):
        backward.BackwardKvVariant("bfloat16", 64, 32, 64, False, True)
    with pytest.raises(ValueError, match="head_dim"):
        backward.BackwardDqVariant("bfloat16", 96, 64, 64, False)


# --------------------------------------------------------------------------------------------
# Packed variable-length batches
# --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("cta", ["grid", "persistent", "longest_first"])
@pytest.mark.parametrize("causal,alignment", [(False, "top_left"), (True, "top_left"),
                                              (True, "bottom_right")])
def test_varlen_table_is_each_sequences_own_table(cta, causal, alignment):
    """Each sequence's rows (its starts and lengths aside) are the rows a dense launch of that
    sequence alone has (linear scan: the rows do not depend on the order), its causal
    diagonal its own lengths' (bottom-right), and every (sequence, K/V head, K/V tile) is one
    item; empty sequences have none, a sequence with keys and no queries still writes its zero
    dK, dV."""
    from wavefront.backward_schedules import (BWD_KV_START, BWD_Q_START, BWD_SEQLEN_KV,
                                              BWD_SEQLEN_Q, VarlenBackwardLaunch)
    from wavefront.schedules import cta_schedule, kv_schedule
    seqlens_q, seqlens_kv = (70, 0, 130, 5, 0, 90, 17), (70, 0, 130, 5, 33, 40, 100)
    problem = AttentionProblem(1, 4, 2, sum(seqlens_q), sum(seqlens_kv), 64, causal, 32, 16,
                               causal_alignment=alignment)
    launch = VarlenBackwardLaunch(problem, cta_schedule(cta), kv_schedule("linear"), 3, 1,
                                  1 << 20, None, seqlens_q, seqlens_kv)
    table = launch.work_table
    assert launch.num_items == len(table) == 2 * sum(-(-n // 16) for n in seqlens_kv)
    starts_q = np.cumsum(seqlens_q) - seqlens_q
    starts_kv = np.cumsum(seqlens_kv) - seqlens_kv
    columns = [BWD_KV_HEAD, BWD_KV_TILE, BWD_HEAD_FIRST, BWD_HEAD_STEP, BWD_SCAN_START,
               BWD_SCAN_STEP, BWD_SCAN_COUNT, BWD_MASKED_LO, BWD_MASKED_HI, BWD_DIAGONAL]
    for seq, (sq, sk) in enumerate(zip(seqlens_q, seqlens_kv)):
        mine = table[table[:, BWD_BATCH] == seq]
        if sk == 0:
            assert len(mine) == 0
            continue
        assert (mine[:, BWD_Q_START] == starts_q[seq]).all()
        assert (mine[:, BWD_KV_START] == starts_kv[seq]).all()
        assert (mine[:, BWD_SEQLEN_Q] == sq).all() and (mine[:, BWD_SEQLEN_KV] == sk).all()
        alone = BackwardLaunch.of(AttentionProblem(1, 4, 2, max(sq, 1), sk, 64, causal, 32, 16,
                                                   causal_alignment=alignment),
                                  "persistent+linear", 3, 1, 1 << 20).work_table
        if sq == 0:  # no Q tile sees the keys
            assert (mine[:, BWD_SCAN_COUNT] == 0).all()
            assert (mine[:, BWD_MASKED_LO] == mine[:, BWD_MASKED_HI]).all()
            continue
        assert sorted(map(tuple, mine[:, columns])) == sorted(map(tuple, alone[:, columns]))
        if causal and alignment == "bottom_right":
            assert (mine[:, BWD_DIAGONAL] == sk - sq).all()
    if cta == "longest_first":
        work = table[:, BWD_SCAN_COUNT] + table[:, BWD_MASKED_HI] - table[:, BWD_MASKED_LO]
        assert (np.diff(work) <= 0).all()


@pytest.mark.parametrize("deterministic", [False, True])
@pytest.mark.parametrize("schedule", ["persistent+sawtooth", "longest_first+linear",
                                      "grid+sawtooth"])
@pytest.mark.parametrize("causal,alignment", [(False, "top_left"), (True, "top_left"),
                                              (True, "bottom_right")])
def test_the_kernels_walk_of_a_packed_table_gives_each_sequences_reference(
        causal, alignment, schedule, deterministic):
    """A packed batch (GQA; more keys, fewer (rows that see nothing under bottom-right), none,
    keys and no queries, one query, equal) walked as the kernels walk it, each row's
    sequence sliced out of the packed arrays: every sequence's gradients are its own float64
    reference's, a sequence without queries gets dK = dV = 0."""
    from wavefront.backward_schedules import VarlenBackwardLaunch
    seqlens_q, seqlens_kv = (20, 45, 0, 0, 1, 33), (50, 13, 0, 17, 9, 33)
    heads, kv_heads, head_dim = 4, 2, 8
    q, k, v, do = _inputs(11, 1, heads, kv_heads, sum(seqlens_q), sum(seqlens_kv), head_dim)
    bounds_q, bounds_kv = np.cumsum((0,) + seqlens_q), np.cumsum((0,) + seqlens_kv)
    out, lse = np.zeros(q.shape), np.zeros(q.shape[:3])
    want = [np.zeros(x.shape) for x in (q, k, v)]
    for s in range(len(seqlens_q)):
        rows, keys = (slice(bounds_q[s], bounds_q[s + 1]),
                      slice(bounds_kv[s], bounds_kv[s + 1]))
        if rows.start == rows.stop:
            continue
        o, l_, dq, dk, dv = reference_attention_backward(
            q[:, :, rows], k[:, :, keys], v[:, :, keys], do[:, :, rows], causal=causal,
            causal_alignment=alignment)
        out[:, :, rows], lse[:, :, rows] = o, l_
        for w, g, where in zip(want, (dq, dk, dv), (rows, keys, keys)):
            w[:, :, where] = g
    problem = AttentionProblem(1, heads, kv_heads, sum(seqlens_q), sum(seqlens_kv), head_dim,
                               causal, 16, 8, causal_alignment=alignment)
    cta, scan = schedule.split("+")
    from wavefront.schedules import cta_schedule, kv_schedule
    launch = VarlenBackwardLaunch(problem, cta_schedule(cta), kv_schedule(scan), 3, 1, 1 << 20,
                                  None, seqlens_q, seqlens_kv)
    got = _emulate(launch, q, k, v, do, out, lse, 1 / math.sqrt(head_dim), deterministic)
    for mine, theirs in zip(got, want):
        np.testing.assert_allclose(mine, theirs, rtol=1e-9, atol=1e-10)
    if causal and alignment == "bottom_right":
        assert (got[0][:, :, bounds_q[1]:bounds_q[1] + 45 - 13] == 0).all()


def test_varlen_refuses_the_grouped_schedule_and_bad_lengths():
    from wavefront.backward_schedules import VarlenBackwardLaunch
    from wavefront.schedules import cta_schedule, kv_schedule
    p = AttentionProblem(1, 2, 2, 10, 10, 64)
    with pytest.raises(ValueError, match="grouped"):
        VarlenBackwardLaunch(p, cta_schedule("grouped"), kv_schedule("linear"), 3, 1, 1 << 20,
                             None, (10,), (10,))
    with pytest.raises(ValueError, match="no keys"):
        VarlenBackwardLaunch(p, cta_schedule("persistent"), kv_schedule("linear"), 3, 1,
                             1 << 20, None, (5, 5), (10, 0))
    with pytest.raises(ValueError, match="end at the packed rows"):
        VarlenBackwardLaunch(p, cta_schedule("persistent"), kv_schedule("linear"), 3, 1,
                             1 << 20, None, (5,), (10,))
