"""Properties of the schedule vocabulary, on the same functions the kernel compiles."""
import random
from dataclasses import replace

import pytest

import numpy as np

from wavefront.schedules import (
    WORK_COLUMNS,
    WORK_MASKED_HI,
    WORK_MASKED_LO,
    WORK_SCAN_COUNT,
    WORK_SCAN_START,
    WORK_SCAN_STEP,
    AttentionProblem,
    GroupedSchedule,
    Launch,
    cta_schedule,
    decode_work_item,
    kv_schedule,
    kv_tile_span,
)


def random_problem(rng, causal=None):
    kv_heads = rng.choice([1, 2, 3])
    return AttentionProblem(
        batch=rng.randint(1, 3), heads=kv_heads * rng.choice([1, 2, 4]), kv_heads=kv_heads,
        seqlen_q=rng.randint(1, 700), seqlen_kv=rng.randint(1, 700), head_dim=64,
        causal=rng.random() < 0.5 if causal is None else causal,
        tile_m=rng.choice([64, 128]), tile_n=rng.choice([64, 128]))


def random_launch(rng, cta_name, kv_name="linear"):
    cta = cta_schedule(cta_name)
    if isinstance(cta, GroupedSchedule):
        cta = replace(cta, l2_fraction=rng.choice([0.001, 0.05, 0.5, 2.0]))
    return Launch(random_problem(rng), cta, kv_schedule(kv_name), sms=rng.randint(1, 9),
                  ctas_per_sm=rng.randint(1, 3), l2_bytes=rng.choice([1 << 16, 1 << 22, 50 << 20]),
                  ctas=rng.choice([None, rng.randint(1, 40)]))


def test_tiled_chunks_partition_each_items_tiles_and_run_chunk_major():
    rng = random.Random(21)
    for _ in range(40):
        launch = random_launch(rng, rng.choice(["grid", "persistent"]), "tiled")
        p = launch.problem
        tiles = {}
        for w in launch.all_work():
            assert list(w.kv_tiles) == sorted(w.kv_tiles)  # forward inside a chunk
            assert all(j // launch.chunk_tiles == w.chunk for j in w.kv_tiles)
            tiles.setdefault((w.batch, w.head, w.q_tile), []).extend(w.kv_tiles)
        for (b, h, t), got in tiles.items():
            visited, _ = p.kv_span(t)
            assert sorted(got) == list(range(visited))
        # Chunk-major inside a (batch, K/V head) unit: item numbers grow with the chunk.
        plans = [launch.item_plan(i) for i in range(launch.num_items)]
        for a, b in zip(plans, plans[1:]):
            unit_a = a[0] * p.kv_heads + a[1] // p.qheads_per_kv
            unit_b = b[0] * p.kv_heads + b[1] // p.qheads_per_kv
            assert (unit_a, a[3]) <= (unit_b, b[3])


def test_tiled_chunk_size_from_l2_and_grouped_refused():
    from wavefront.schedules import TiledScan
    p = AttentionProblem(1, 1, 1, 131072, 131072, 64, tile_m=64, tile_n=64)
    # 0.4 x 50 MiB, less 264 CTAs' Q tiles and partials, over 16 KiB of K+V per tile
    stream = 264 * 64 * (64 * 2 + 64 * 4 + 8)
    assert TiledScan().chunk_tiles(p, 50 << 20, 264) == int(
        (0.4 * (50 << 20) - stream) // (2 * 64 * 64 * 2))
    # A stream over half the budget (128-row tiles) leaves the chunk the whole budget.
    big = AttentionProblem(1, 1, 1, 131072, 131072, 128, tile_m=128, tile_n=64)
    assert TiledScan().chunk_tiles(big, 50 << 20, 264) == int(0.4 * (50 << 20)) // (
        2 * 64 * 128 * 2)
    assert TiledScan(tiles_per_chunk=100).chunk_tiles(p, 50 << 20, 264) == 100
    with pytest.raises(ValueError, match="grouped\\+tiled"):
        Launch(p, cta_schedule("grouped"), kv_schedule("tiled"), 132, 2, 50 << 20)


def _unmasked(launch, w):
    """The part of an item's K/V order that its scan direction orders (masked tiles follow)."""
    return w.kv_tiles[:launch.work_table[w.item, WORK_SCAN_COUNT]]


def test_sawtooth_alternates_per_cta_and_linear_never_reverses():
    rng = random.Random(3)
    for cta_name in ("persistent", "grouped", "longest_first", "dynamic", "grouped_dynamic"):
        for _ in range(30):
            launch = random_launch(rng, cta_name, "sawtooth")
            for cta in range(launch.num_ctas):
                work = list(launch.work_of_cta(cta))
                assert [w.local_iter for w in work] == list(range(len(work)))
                for w in work:
                    scan = _unmasked(launch, w)
                    if len(scan) > 1:
                        assert (scan[0] < scan[-1]) == (w.local_iter % 2 == 0)
                    # masked tiles (diagonal, ragged end) come last, forward
                    assert list(w.kv_tiles[len(scan):]) == sorted(w.kv_tiles[len(scan):])
                    assert all(j < min(w.kv_tiles[len(scan):], default=j + 1) for j in scan)
            linear = Launch(launch.problem, launch.cta, kv_schedule("linear"), launch.sms,
                            launch.ctas_per_sm, launch.l2_bytes, launch.ctas)
            assert all(list(w.kv_tiles) == sorted(w.kv_tiles) for w in linear.all_work())


def test_the_work_table_is_what_the_kernel_reads():
    """Static schedules carry each item's own direction in its row; a dynamic schedule's rows
    scan forward and the kernel reverses a CTA's odd-numbered items (`alternate`)."""
    rng = random.Random(8)
    for cta_name in ("grid", "persistent", "grouped", "dynamic", "grouped_dynamic"):
        for kv_name in ("linear", "sawtooth"):
            launch = random_launch(rng, cta_name, kv_name)
            table = launch.work_table
            assert table.dtype == np.int32 and table.shape == (launch.num_items, WORK_COLUMNS)
            assert launch.alternate == (cta_name.endswith("dynamic") and kv_name == "sawtooth")
            for item in range(launch.num_items):
                row = table[item]
                backward = 0 if launch.cta.dynamic else launch.item_plan(item)[7]
                assert tuple(row[:2]) == launch.item_plan(item)[:2]
                assert row[WORK_SCAN_STEP] == (-1 if backward else 1)
                assert launch.kv_order(item, backward) == tuple(
                    [row[WORK_SCAN_START] + row[WORK_SCAN_STEP] * t
                     for t in range(row[WORK_SCAN_COUNT])]
                    + list(range(row[WORK_MASKED_LO], row[WORK_MASKED_HI])))


def test_grid_sawtooth_flips_by_wave():
    p = AttentionProblem(1, 4, 4, 1024, 1024, 64, tile_m=64, tile_n=64)
    launch = Launch(p, cta_schedule("grid"), kv_schedule("sawtooth"), sms=3, ctas_per_sm=2,
                    l2_bytes=1 << 20)
    assert launch.num_ctas == p.num_items
    for w in launch.all_work():
        assert w.local_iter == w.item // 6
        scan = _unmasked(launch, w)
        assert (scan[0] > scan[-1]) == (w.local_iter % 2 == 1)


def test_persistent_grid_is_resident_ctas_and_strides():
    p = AttentionProblem(2, 8, 8, 8192, 8192, 128)
    launch = Launch(p, cta_schedule("persistent"), kv_schedule("linear"), 132, 2, 50 << 20)
    assert launch.num_ctas == 264
    assert list(launch.items_of_cta(5))[:3] == [5, 269, 533]
    small = AttentionProblem(1, 1, 1, 256, 256, 64)
    assert Launch(small, cta_schedule("persistent"), kv_schedule("linear"), 132, 2,
                  50 << 20).num_ctas == small.num_items


def test_grouped_group_size_from_l2_budget():
    # K+V per head at S=8192, D=128, bf16: 4 MiB; half of 50 MiB holds 6 -> power of two 4.
    p = AttentionProblem(1, 32, 32, 8192, 8192, 128)
    assert GroupedSchedule().group_units(p, 50 * 2**20) == 4
    assert GroupedSchedule().group_units(p, 1024) == 1  # never below one unit
    assert GroupedSchedule(l2_fraction=4.0).group_units(p, 2**40) == 32  # never above all units


def test_grouped_keeps_gqa_heads_together():
    rng = random.Random(11)
    for _ in range(50):
        kv_heads = rng.randint(1, 5)
        per_kv = rng.choice([2, 3, 4])
        p = AttentionProblem(rng.randint(1, 3), kv_heads * per_kv, kv_heads,
                             rng.randint(64, 1500), rng.randint(64, 1500), 64)
        group = rng.randint(1, 6)
        items_per_group = group * per_kv * p.q_tiles
        for start in range(0, p.num_items, items_per_group):
            units = set()
            heads = set()
            for item in range(start, min(start + items_per_group, p.num_items)):
                b, h, _ = decode_work_item(item, p.q_tiles, p.heads, p.kv_heads, p.kv_units,
                                           group, 2)
                units.add((b, h // per_kv))
                heads.add((b, h))
            # The group is whole K/V units with every query head of each.
            assert len(units) <= group
            assert heads == {(b, kvh * per_kv + i) for b, kvh in units for i in range(per_kv)}
        # Heads run fastest inside a group: consecutive items are sibling heads, same Q tile.
        b0, h0, t0 = decode_work_item(0, p.q_tiles, p.heads, p.kv_heads, p.kv_units, group, 2)
        b1, h1, t1 = decode_work_item(1, p.q_tiles, p.heads, p.kv_heads, p.kv_units, group, 2)
        assert (b0, t0) == (b1, t1) and h1 == h0 + 1


def test_kv_tile_span_masks_only_where_needed():
    for causal in (False, True):
        for seqlen in (1, 63, 64, 65, 200, 1000):
            for tile_m, tile_n in ((64, 64), (128, 64), (128, 128)):
                q_tiles = -(-seqlen // tile_m)
                for q_tile in range(q_tiles):
                    visited, first_masked = kv_tile_span(q_tile, tile_m, tile_n, seqlen, seqlen,
                                                         causal)
                    assert 0 <= first_masked <= visited
                    rows = range(q_tile * tile_m, min((q_tile + 1) * tile_m, seqlen))
                    for j in range(visited):
                        cols = range(j * tile_n, (j + 1) * tile_n)
                        needs_mask = any(c >= seqlen for c in cols) or (
                            causal and any(c > r for r in rows for c in cols))
                        if needs_mask:
                            assert j >= first_masked


@pytest.mark.parametrize("bad", [
    dict(batch=0), dict(heads=3, kv_heads=2), dict(seqlen_q=-1), dict(head_dim=1.5),
    dict(tile_m=True)])
def test_problem_validation(bad):
    args = dict(batch=1, heads=2, kv_heads=1, seqlen_q=10, seqlen_kv=10, head_dim=64)
    args.update(bad)
    with pytest.raises(ValueError):
        AttentionProblem(**args)


def test_unknown_schedule_names():
    with pytest.raises(ValueError, match="cta schedule must be one of"):
        cta_schedule("diagonal")
    with pytest.raises(ValueError, match="kv schedule must be one of"):
        kv_schedule("blocked")


def test_longest_first_hands_out_items_in_decreasing_length():
    for causal in (False, True):
        p = AttentionProblem(2, 4, 2, 1000, 1000, 64, causal=causal, tile_m=64, tile_n=64)
        launch = Launch(p, cta_schedule("longest_first"), kv_schedule("linear"), 3, 2, 1 << 20)
        lengths = [launch.item_plan(i)[6] for i in range(launch.num_items)]
        assert lengths == sorted(lengths, reverse=True)
        # Every (batch, head) of a Q tile before the next Q tile; GQA siblings adjacent.
        plans = [launch.item_plan(i)[:3] for i in range(launch.num_items)]
        assert [t for _, _, t in plans[:8]] == [p.q_tiles - 1] * 8
        assert [(b, h) for b, h, _ in plans[:4]] == [(0, 0), (0, 1), (0, 2), (0, 3)]
        # Each persistent CTA's rounds shrink (causal) or stay equal: no CTA keeps a long tail.
        for cta in range(launch.num_ctas):
            own = [len(w.kv_tiles) for w in launch.work_of_cta(cta)]
            assert own == sorted(own, reverse=True)


def test_longest_first_balances_causal_work_better_than_persistent():
    p = AttentionProblem(1, 8, 8, 8192, 8192, 128, causal=True, tile_m=128, tile_n=64)

    def spread(name):
        launch = Launch(p, cta_schedule(name), kv_schedule("linear"), 132, 2, 50 << 20)
        work = [sum(len(w.kv_tiles) for w in launch.work_of_cta(c))
                for c in range(launch.num_ctas)]
        return max(work) / (sum(work) / len(work))

    assert spread("longest_first") < spread("persistent")


def _varlen(lengths, cta_name, kv_name, heads=4, kv_heads=2, causal=False, tile_m=128,
            tile_n=64, l2_bytes=50 << 20, ctas=None, sms=5):
    from wavefront.schedules import VarlenLaunch
    total = sum(lengths)
    p = AttentionProblem(1, heads, kv_heads, total, total, 64, causal, tile_m, tile_n)
    return VarlenLaunch(p, tuple(lengths), tuple(lengths), cta_schedule(cta_name),
                        kv_schedule(kv_name), sms=sms, ctas_per_sm=2, l2_bytes=l2_bytes,
                        ctas=ctas)


def test_varlen_with_equal_lengths_is_the_dense_batch():
    """Packed sequences of one length give the dense batch's table, row for row (the sequence
    in the batch column), for every schedule whose order does not depend on group sizes."""
    for cta_name in ("grid", "persistent", "longest_first", "dynamic"):
        for kv_name in ("linear", "sawtooth"):
            for causal in (False, True):
                packed = _varlen([300] * 3, cta_name, kv_name, causal=causal)
                p = AttentionProblem(3, 4, 2, 300, 300, 64, causal, 128, 64)
                dense = Launch(p, cta_schedule(cta_name), kv_schedule(kv_name), sms=5,
                               ctas_per_sm=2, l2_bytes=50 << 20)
                assert np.array_equal(packed.work_table[:, :10], dense.work_table[:, :10]), (
                    cta_name, kv_name, causal)


def test_varlen_rows_cover_every_sequences_tiles_once():
    from wavefront.schedules import (WORK_BATCH, WORK_HEAD, WORK_KV_START, WORK_Q_START,
                                     WORK_Q_TILE, WORK_SEQLEN_KV, WORK_SEQLEN_Q)
    rng = random.Random(12)
    for cta_name in CTA_NAMES_FOR_VARLEN:
        for kv_name in ("linear", "sawtooth"):
            lengths = [rng.choice([0, 1, 63, 64, 65, 300, 1000]) for _ in range(rng.randint(1, 6))]
            if not sum(lengths):
                lengths.append(5)
            causal = rng.random() < 0.5
            launch = _varlen(lengths, cta_name, kv_name, causal=causal, l2_bytes=1 << 18,
                             ctas=rng.choice([None, 3]))
            table = launch.work_table
            starts = np.cumsum([0] + lengths)
            seen = set()
            for row in table:
                seq, head, q_tile = int(row[WORK_BATCH]), int(row[WORK_HEAD]), int(row[WORK_Q_TILE])
                assert row[WORK_Q_START] == row[WORK_KV_START] == starts[seq]
                assert row[WORK_SEQLEN_Q] == row[WORK_SEQLEN_KV] == lengths[seq]
                visited, first_masked = kv_tile_span(q_tile, 128, 64, lengths[seq],
                                                     lengths[seq], causal)
                tiles = ([row[WORK_SCAN_START] + row[WORK_SCAN_STEP] * t
                          for t in range(row[WORK_SCAN_COUNT])]
                         + list(range(row[WORK_MASKED_LO], row[WORK_MASKED_HI])))
                assert sorted(tiles) == list(range(visited)), (cta_name, row)
                seen.add((seq, head, q_tile))
            expected = {(s, h, t) for s, n in enumerate(lengths) for h in range(4)
                        for t in range(-(-n // 128))}
            assert seen == expected and len(table) == len(expected)


CTA_NAMES_FOR_VARLEN = ("grid", "persistent", "grouped", "longest_first", "dynamic",
                        "grouped_dynamic")


def test_varlen_groups_fit_the_budget_and_longest_first_is_by_work():
    from wavefront.schedules import WORK_BATCH, WORK_KV_HEAD, group_by_budget
    sizes = np.array([5.0, 3.0, 4.0, 9.0, 1.0, 1.0])
    assert group_by_budget(sizes, 8.0).tolist() == [0, 0, 1, 2, 3, 3]
    launch = _varlen([2000, 100, 4000, 50], "longest_first", "linear", causal=True)
    work = [r[WORK_SCAN_COUNT] + r[WORK_MASKED_HI] - r[WORK_MASKED_LO] for r in launch.work_table]
    assert work == sorted(work, reverse=True)
    # grouped: units (sequence, K/V head) appear group by group, in order
    launch = _varlen([2000, 100, 4000, 50], "grouped", "linear", l2_bytes=1 << 20)
    units = [int(r[WORK_BATCH]) * 2 + int(r[WORK_KV_HEAD]) for r in launch.work_table]
    first_seen = list(dict.fromkeys(units))
    assert first_seen == sorted(first_seen)


def _items_in_order_by_sorting_items(launch):
    """(sequence, head, Q tile) of every work item in hand-out order, sorted item by item as
    the CTA schedules' docstrings state the order: the reference for `VarlenLaunch._order`,
    which sorts tile rows and spreads them over heads."""
    from wavefront.schedules import group_by_budget, kv_tile_span
    p = launch.problem
    items = [(s, h, t) for s, n in enumerate(launch.seqlens_q) for h in range(p.heads)
             for t in range(-(-n // p.tile_m))]
    seq, head, q_tile = (np.array([item[i] for item in items], dtype=np.int64)
                         for i in range(3))
    visited = np.array([kv_tile_span(t, p.tile_m, p.tile_n, launch.seqlens_q[s],
                                     launch.seqlens_kv[s], p.causal)[0] for s, _, t in items])
    name = launch.cta.name
    if name in ("grid", "persistent"):
        order = np.arange(len(items))
    elif name in ("longest_first", "dynamic"):
        order = np.lexsort((head, seq, -q_tile, -visited))
    else:
        unit = seq * p.kv_heads + head // p.qheads_per_kv
        unit_bytes = (2 * np.repeat(np.array(launch.seqlens_kv, dtype=np.float64), p.kv_heads)
                      * p.head_dim * p.element_bytes)
        group = group_by_budget(unit_bytes, launch.cta.l2_fraction * launch.l2_bytes)[unit]
        order = (np.lexsort((head, unit, q_tile, group)) if name == "grouped" else
                 np.lexsort((head, unit, -q_tile, -visited, group)))
    return [items[i] for i in order]


@pytest.mark.parametrize("cta_name", CTA_NAMES_FOR_VARLEN)
def test_varlen_order_is_each_schedules_item_order(cta_name):
    from wavefront.schedules import WORK_BATCH, WORK_HEAD, WORK_Q_TILE
    rng = random.Random(cta_name)
    for _ in range(25):
        lengths = [rng.choice([0, 1, 64, 129, 300, 1000, rng.randint(1, 3000)])
                   for _ in range(rng.randint(1, 9))]
        if not sum(lengths):
            lengths.append(3)
        kv_heads = rng.choice([1, 2, 4])
        launch = _varlen(lengths, cta_name, rng.choice(["linear", "sawtooth"]),
                         heads=kv_heads * rng.choice([1, 2, 3]), kv_heads=kv_heads,
                         causal=rng.random() < 0.5, l2_bytes=rng.choice([1 << 16, 1 << 19]))
        table = launch.work_table
        got = [tuple(int(x) for x in r) for r in table[:, [WORK_BATCH, WORK_HEAD, WORK_Q_TILE]]]
        assert got == _items_in_order_by_sorting_items(launch), (lengths, launch.problem)


@pytest.mark.parametrize("library", ["numpy", "torch"])
@pytest.mark.parametrize("cta_name", CTA_NAMES_FOR_VARLEN)
def test_a_table_from_lengths_on_the_device_is_the_hosts_table_then_padding(cta_name, library):
    """`DeviceVarlenLaunch` writes a packed batch's table from cu_seqlens arrays without
    reading them: its first rows, as many as it counts, are `VarlenLaunch`'s table for the
    same lengths, in as many rows as the packed rows could need; the rest are padding,
    whatever the lengths. On NumPy arrays and on (CPU) torch tensors: the GPU runs the torch
    code on CUDA tensors. The device launch is made for as many sequences or more (the call
    pads cu_seqlens to a launcher's bucket with empty sequences), and the table is the same."""
    from wavefront.schedules import DeviceVarlenLaunch, VarlenLaunch, fill_rows
    as_library = np.asarray
    if library == "torch":
        torch = pytest.importorskip("torch")
        import wavefront.kernel.torch_arrays  # noqa: F401  (registers torch's operations)
        as_library = torch.from_numpy
    rng = random.Random(cta_name)
    for _ in range(30):
        n = rng.randint(1, 9)
        lengths_q = [rng.choice([0, 1, 64, 129, 300, rng.randint(1, 2000)]) for _ in range(n)]
        lengths_kv = [rng.choice([1, 64, 200, rng.randint(1, 2000)]) if sq else
                      rng.choice([0, 7]) for sq in lengths_q]
        if not sum(lengths_q):
            lengths_q[-1], lengths_kv[-1] = 5, 9
        heads_per_kv, kv_heads = rng.choice([1, 2, 3]), rng.choice([1, 2])
        tiles = rng.choice([(64, 64), (128, 64), (128, 128)])
        p = AttentionProblem(1, heads_per_kv * kv_heads, kv_heads, sum(lengths_q),
                             sum(lengths_kv), 64, rng.random() < 0.5, *tiles)
        placement = dict(cta=cta_schedule(cta_name),
                         kv=kv_schedule(rng.choice(["linear", "sawtooth"])), sms=5,
                         ctas_per_sm=2, l2_bytes=rng.choice([1 << 16, 1 << 19, 1 << 22]),
                         ctas=rng.choice([None, 3, 7]))
        host = VarlenLaunch(p, tuple(lengths_q), tuple(lengths_kv), **placement)
        bucket = n + rng.choice([0, 0, 1, 7])
        device = DeviceVarlenLaunch(p, bucket, **placement)
        cu_q, cu_kv = (np.concatenate([[0], np.cumsum(x), [sum(x)] * (bucket - n)])
                       .astype(np.int32) for x in (lengths_q, lengths_kv))
        columns, count = device.table_columns(as_library(cu_q), as_library(cu_kv))
        table = np.empty((device.num_items, 16), dtype=np.int32)
        fill_rows(table, [np.asarray(c) for c in columns])
        assert device.num_items >= host.num_items == int(count)
        assert np.array_equal(table[:count], host.work_table), (lengths_q, lengths_kv, p)
        assert device.num_ctas >= host.num_ctas


def test_lengths_on_the_device_are_clamped_to_the_packed_rows():
    """Lengths on the GPU are not checked (that would wait for them): bad ones are clamped, so
    every row the table names lies inside the packed arrays."""
    from wavefront.schedules import (WORK_KV_START, WORK_Q_START, WORK_SEQLEN_KV,
                                     WORK_SEQLEN_Q, DeviceVarlenLaunch, fill_rows)
    p = AttentionProblem(1, 2, 2, 100, 90, 64, True, 64, 64)
    device = DeviceVarlenLaunch(p, 3, cta_schedule("dynamic"), kv_schedule("linear"), sms=4,
                                ctas_per_sm=1, l2_bytes=1 << 20)
    columns, count = device.table_columns(np.array([0, 500, -3, 100]),
                                          np.array([7, 60, 1000, 20]))
    table = np.empty((device.num_items, 16), dtype=np.int32)
    fill_rows(table, columns)
    real = table[:count]
    assert count <= device.num_items
    assert (real[:, WORK_Q_START] + real[:, WORK_SEQLEN_Q] <= 100).all()
    assert (real[:, WORK_KV_START] + real[:, WORK_SEQLEN_KV] <= 90).all()
    assert (real >= 0).all()
    columns, count = device.table_columns(np.array([0, 50, 80, 100]), np.array([0, 30, 60, 90]),
                                          np.int64(60), 40)  # a call with fewer rows
    table = np.empty((device.num_items, 16), dtype=np.int32)
    fill_rows(table, columns)
    real = table[:count]
    assert count == 2 * 2  # two heads of a tile each: sequence 0's 50 rows, 1's 10 left
    assert (real[:, WORK_Q_START] + real[:, WORK_SEQLEN_Q] <= 60).all()
    assert (real[:, WORK_KV_START] + real[:, WORK_SEQLEN_KV] <= 40).all()


def test_varlen_refuses_what_it_cannot_run():
    with pytest.raises(ValueError, match="does not apply to variable-length"):
        _varlen([10, 20], "persistent", "tiled")
    from wavefront.point import plan_varlen
    with pytest.raises(ValueError, match="^cu_seqlens_k: sequence 1 has 20 queries and no keys"):
        plan_varlen((30, 4, 64), (10, 4, 64), [0, 10, 30], [0, 10, 10], sms=4, l2_bytes=1 << 20)
    with pytest.raises(ValueError, match="^cu_seqlens_q must be a sequence of integers"):
        plan_varlen((30, 4, 64), (30, 4, 64), [0, 1.5, 30], [0, 10, 30], sms=4, l2_bytes=1 << 20)


@pytest.mark.parametrize("schedule", ["persistent+sawtooth", "grouped_dynamic+linear",
                                      "persistent+tiled", "longest_first+linear"])
def test_a_table_built_in_slices_on_threads_is_the_table_built_whole(monkeypatch, schedule):
    """Long tables are built in slices on a thread pool; the rows must not depend on it."""
    import wavefront.schedules as schedules
    from wavefront.point import plan
    shape = (2, 8, 16384, 64)

    def table(per_slice):
        monkeypatch.setattr(schedules, "TABLE_SLICE_ITEMS", per_slice)
        monkeypatch.setattr(schedules.table_chunks, "__defaults__", (per_slice,))
        return plan(shape, (2, 4, 16384, 64), sms=132, l2_bytes=50 << 20, causal=True,
                    schedule=schedule).work_table
    whole = table(1 << 30)
    sliced = table(97)  # an odd slice length: slices end mid-head and mid-group
    assert len(schedules.table_chunks(len(whole), 97)) > 1
    assert np.array_equal(whole, sliced) and not sliced.flags.writeable

