"""The KV-cache call on the CPU: its argument checks and messages, its work tables (coverage,
orders), the masks and paged addressing the kernels compute (with the kernels' own integer
functions, run here on NumPy), and the kernels compiled ahead of time for sm_90."""
import itertools
import os
from concurrent.futures import ProcessPoolExecutor

import numpy as np
import pytest

from wavefront.decode_schedules import (CTA_ORDERS, DECODE_BATCH, DECODE_KV_COUNT,
                                        DECODE_KV_HEAD, DECODE_KV_START, DECODE_Q_TILE,
                                        DECODE_SPLIT, DECODE_SPLITS, DEFAULT_TILE_N,
                                        DecodeLaunch, DecodeProblem, choose_splits, key_span,
                                        page_slot, pages_per_tile, plan_decode, split_tiles,
                                        sub_tile_page)


# --------------------------------------------------------------------------------------------
# Work tables
# --------------------------------------------------------------------------------------------

PROBLEMS = [
    DecodeProblem(3, 32, 8, 1, 1000, 128),  # decode, GQA 4, ragged capacity
    DecodeProblem(2, 8, 8, 1, 4096, 64, page_size=16),  # MHA, pages of 16
    DecodeProblem(2, 12, 4, 300, 700, 128, seqlen_new=300),  # chunked prefill, group 3
    DecodeProblem(1, 6, 1, 5, 64, 64),  # group 6 (padded to 8), a capacity of one tile
]


@pytest.mark.parametrize("problem", PROBLEMS)
@pytest.mark.parametrize("splits", [1, 3, 7])
def test_every_kv_tile_of_every_unit_is_covered_once_over_the_splits(problem, splits):
    table = DecodeLaunch(problem, splits, 264).work_table()
    assert len(table) == problem.units * splits
    assert (table[:, DECODE_SPLITS] == splits).all()
    seen = {}
    for row in table:
        unit = (row[DECODE_BATCH], row[DECODE_KV_HEAD], row[DECODE_Q_TILE])
        tiles = range(row[DECODE_KV_START], row[DECODE_KV_START] + row[DECODE_KV_COUNT])
        for tile in tiles:
            key = unit + (tile,)
            assert key not in seen, f"tile {key} in splits {seen.get(key)} and {row}"
            seen[key] = row[DECODE_SPLIT]
    expected = set(itertools.product(range(problem.batch), range(problem.kv_heads),
                                     range(problem.q_tiles), range(problem.kv_tiles)))
    assert set(seen) == expected


@pytest.mark.parametrize("tiles,splits", [(0, 1), (0, 5), (1, 4), (7, 3), (64, 16), (1000, 7)])
def test_split_tiles_covers_any_real_length_exactly_once(tiles, splits):
    """The kernel splits an item's own key count (read on the GPU), not the capacity."""
    spans = [split_tiles(s, splits, tiles) for s in range(splits)]
    assert spans[0][0] == 0 and spans[-1][1] == tiles
    assert all(a[1] == b[0] for a, b in zip(spans, spans[1:]))
    sizes = [hi - lo for lo, hi in spans]
    assert min(sizes) >= 0 and max(sizes) - min(sizes) <= 1


@pytest.mark.parametrize("problem", PROBLEMS)
def test_cta_orders_are_permutations_of_one_set_of_items(problem):
    sharing = tuple(b % 2 for b in range(problem.batch))
    tables = {order: DecodeLaunch(problem, 2, 264, order, sharing).work_table()
              for order in CTA_ORDERS}
    rows = {order: sorted(map(tuple, t)) for order, t in tables.items()}
    assert rows["kv_head_major"] == rows["batch_major"] == rows["prefix_grouped"]
    first = tables["batch_major"]
    assert (first[: problem.kv_heads * problem.q_tiles * 2, DECODE_BATCH] == 0).all()
    by_head = tables["kv_head_major"]
    assert (by_head[: problem.batch * problem.q_tiles * 2, DECODE_KV_HEAD] == 0).all()


def test_prefix_grouped_hands_out_the_sharers_items_of_one_head_and_split_together():
    problem = DecodeProblem(6, 8, 2, 1, 4096, 128, page_size=64)
    sharing = (7, 3, 7, 3, 7, 9)  # sequences 0, 2, 4 share their first page, 1 and 3 theirs
    table = DecodeLaunch(problem, 2, 264, "prefix_grouped", sharing).work_table()
    batches = table[:, DECODE_BATCH]
    # the first group (first page 7) comes first, its members consecutive per (head, split)
    assert list(batches[:3]) == [0, 2, 4]
    assert (table[:3, DECODE_KV_HEAD] == 0).all() and (table[:3, DECODE_SPLIT] == 0).all()
    assert list(batches[3:6]) == [0, 2, 4] and (table[3:6, DECODE_SPLIT] == 1).all()
    assert set(batches[:12]) == {0, 2, 4} and set(batches[12:20]) == {1, 3}
    assert set(batches[20:]) == {5}


def test_splits_fill_the_gpu_and_stay_one_where_the_batch_does():
    slots = 132 * 2
    assert choose_splits(DecodeProblem(64, 32, 8, 1, 32768, 128), slots) == 1
    # B8 KV8: 64 items; 4 splits fill 256 of 264 slots in one wave (3 fill 192, 5 spill)
    assert choose_splits(DecodeProblem(8, 32, 8, 1, 4096, 128), slots) == 4
    one = choose_splits(DecodeProblem(1, 32, 8, 1, 131072, 128), slots)
    assert 0.85 * slots <= one * 8 <= slots
    # a short cache keeps at least four tiles per split
    assert choose_splits(DecodeProblem(1, 32, 8, 1, 512, 128), slots) == 2
    assert choose_splits(DecodeProblem(1, 32, 8, 1, 131072, 128), slots, seqlen_hint=100) == 1
    launch = plan_decode(DecodeProblem(1, 32, 8, 1, 4096, 128), sms=132, ctas_per_sm=2,
                         num_splits=5)
    assert launch.num_splits == 5 and launch.grid == min(264, 40)


@pytest.mark.parametrize("bad,message", [
    (dict(num_splits=0), "num_splits must be a positive integer"),
    (dict(num_splits=129), "num_splits must be at most 128"),
    (dict(cta_order="random"), "cta_order must be one of"),
    (dict(sharing=(1, 2)), "sharing must hold one key per sequence"),
])
def test_launch_parameters_are_checked(bad, message):
    args = dict(problem=DecodeProblem(3, 8, 2, 1, 256, 64), num_splits=1, ctas=8)
    with pytest.raises(ValueError, match=message):
        DecodeLaunch(**{**args, **bad})


def test_problem_shapes_pack_the_group_into_the_tile():
    p = DecodeProblem(1, 32, 8, 1, 4096, 128)
    assert (p.group, p.group_tile, p.tile_m, p.rows_per_tile, p.q_tiles) == (4, 4, 64, 16, 1)
    p = DecodeProblem(1, 12, 4, 100, 4096, 128)  # group 3, padded to 4
    assert (p.group_tile, p.tile_m, p.rows_per_tile, p.q_tiles) == (4, 64, 16, 7)
    p = DecodeProblem(1, 64, 1, 3, 4096, 128)  # MQA, 64 heads: one position per tile
    assert (p.group_tile, p.tile_m, p.rows_per_tile, p.q_tiles) == (64, 64, 1, 3)
    with pytest.raises(ValueError, match="heads / kv_heads must be at most 64"):
        DecodeProblem(1, 128, 1, 1, 4096, 128)
    paged = DecodeProblem(1, 8, 8, 1, 100, 64, page_size=16)
    assert (paged.tile_n, paged.pages_per_tile) == (64, 4)
    assert DecodeProblem(1, 8, 8, 1, 100, 64, page_size=256).pages_per_tile == 1
    with pytest.raises(ValueError, match="page_size must be one of"):
        DecodeProblem(1, 8, 8, 1, 100, 64, page_size=48)
    with pytest.raises(ValueError, match="multiple of kv_heads"):
        DecodeProblem(1, 6, 4, 1, 100, 64)


# --------------------------------------------------------------------------------------------
# What the kernels compute, with their own integer functions
# --------------------------------------------------------------------------------------------

def _visible_keys(seqlen_k, seqlen_q, causal, rows):
    """For each query of a tile of rows [first, first + rows): the keys it sees, as the kernel
    masks them (unmasked tiles below keys_all, masked tiles up to keys_any)."""
    masks = []
    for first in range(0, seqlen_q, rows):
        offset, keys_any, keys_all = key_span(seqlen_k, seqlen_q, causal, first, rows)
        for s in range(first, min(first + rows, seqlen_q)):
            end = min(s + offset, seqlen_k)
            assert end <= keys_any, "a row sees a key its tile does not scan"
            assert max(end, 0) >= keys_all, "an unmasked key a row must not see"
            masks.append(np.arange(seqlen_k) < end)
    return np.array(masks).reshape(seqlen_q, seqlen_k)


@pytest.mark.parametrize("seqlen_k,seqlen_q", [(1, 1), (100, 1), (100, 37), (64, 64),
                                               (5, 9), (0, 3), (513, 512)])
@pytest.mark.parametrize("rows", [1, 4, 32])
def test_masks_are_flash_attentions_bottom_right_causal_and_full(seqlen_k, seqlen_q, rows):
    i = np.arange(seqlen_q)[:, None]
    j = np.arange(seqlen_k)[None, :]
    bottom_right = j <= i + seqlen_k - seqlen_q
    assert (_visible_keys(seqlen_k, seqlen_q, 1, rows) == bottom_right).all()
    everything = np.ones((seqlen_q, seqlen_k), dtype=bool)
    assert (_visible_keys(seqlen_k, seqlen_q, 0, rows) == everything).all()


@pytest.mark.parametrize("page_size", [16, 32, 64, 128, 256])
def test_paged_addressing_reads_what_the_contiguous_cache_holds(page_size):
    """A contiguous cache scattered into a shuffled page pool and read back tile by tile
    through the block table, as the kernel addresses it (a tile within one page, or made of
    whole pages, one load each), equals the contiguous tiles; the append's (page, key) of
    each new position lands where the contiguous cache has it."""
    rng = np.random.default_rng(7)
    batch, max_pages, kv_heads, dim = 3, 8, 2, 8
    capacity = max_pages * page_size
    tile_n = DEFAULT_TILE_N
    contiguous = rng.standard_normal((batch, capacity, kv_heads, dim)).astype(np.float32)
    pages = rng.permutation(batch * max_pages + 4)[: batch * max_pages]
    block_table = pages.reshape(batch, max_pages)
    pool = np.zeros((batch * max_pages + 4, page_size, kv_heads, dim), dtype=np.float32)
    for b, slot in itertools.product(range(batch), range(max_pages)):
        pool[block_table[b, slot]] = contiguous[b, slot * page_size:(slot + 1) * page_size]
    parts = pages_per_tile(page_size)
    sub_n = tile_n // parts
    subs_per_page = page_size // sub_n  # as the kernel works it out
    for b, j in itertools.product(range(batch), range(capacity // tile_n)):
        tile = []
        for part in range(parts):
            slot, sub = sub_tile_page(j, part, parts, subs_per_page)
            tile.append(pool[block_table[b, slot], sub * sub_n:(sub + 1) * sub_n])
        np.testing.assert_array_equal(np.concatenate(tile),
                                      contiguous[b, j * tile_n:(j + 1) * tile_n])
    for b, position in itertools.product(range(batch), range(0, capacity, 7)):
        slot, key = page_slot(position, page_size)
        np.testing.assert_array_equal(pool[block_table[b, slot], key], contiguous[b, position])


# --------------------------------------------------------------------------------------------
# Argument checks (on array descriptions: no GPU)
# --------------------------------------------------------------------------------------------

def _view(shape, dtype="bfloat16", library="torch", device=0, strides=None):
    from wavefront.kernel.arrays import _ArrayView
    if strides is None:
        strides = tuple(int(np.prod(shape[i + 1:])) for i in range(len(shape)))
    return _ArrayView(library, tuple(shape), dtype, device, strides)


def _check(q=(2, 1, 32, 128), k_cache=(2, 1024, 8, 128), v_cache=None, k=None, v=None,
           table=None):
    """check_arrays on shapes (contiguous bfloat16 torch arrays on GPU 0) or descriptions."""
    from wavefront.kernel.kvcache import check_arrays
    def make(shape):
        return shape if shape is None or not isinstance(shape, tuple) else _view(shape)
    return check_arrays(make(q), make(k_cache), make(v_cache or k_cache), make(k), make(v),
                        table)


def test_a_good_call_describes_its_cache():
    shape = _check()
    assert (shape.capacity, shape.page_size, shape.seqlen_new) == (1024, None, 0)
    shape = _check(k_cache=(40, 16, 8, 128), table=(2, 10), k=(2, 3, 8, 128),
                   v=(2, 3, 8, 128))
    assert (shape.capacity, shape.page_size, shape.num_pages, shape.seqlen_new) == (
        160, 16, 40, 3)


@pytest.mark.parametrize("arguments,message", [
    (dict(q=(2, 32, 128)), r"q must be 4-D \(batch, seqlen_q, heads, head_dim\)"),
    (dict(q=(2, 1, 32, 96), k_cache=(2, 8, 8, 96)), "q head_dim must be one of"),
    (dict(q=(2, 1, 30, 128)), r"q heads \(30\) must be a multiple of k_cache kv_heads \(8\)"),
    (dict(k_cache=(3, 1024, 8, 128)), r"k_cache batch must equal q batch \(2\)"),
    (dict(v_cache=(2, 512, 8, 128)), "v_cache shape must equal k_cache shape"),
    (dict(k_cache=(2, 1024, 8, 64)), r"k_cache head_dim must equal q head_dim \(128\)"),
    (dict(k_cache=(40, 48, 8, 128), table=(2, 10)), "k_cache page_size .* must be one of"),
    (dict(k_cache=(40, 16, 8, 128), table=(3, 10)), r"block_table must be 2-D \(batch=2"),
    (dict(k=(2, 3, 8, 128)), "k and v must be given together"),
    (dict(k=(2, 3, 4, 128), v=(2, 3, 4, 128)), r"k must be \(batch=2, seqlen_new >= 1"),
    (dict(k=(2, 3, 8, 128), v=(2, 4, 8, 128)), "v shape must equal k shape"),
    (dict(k=(2, 2000, 8, 128), v=(2, 2000, 8, 128)), "more than the cache holds"),
])
def test_bad_arrays_are_named(arguments, message):
    with pytest.raises(ValueError, match=message):
        _check(**arguments)


def test_bad_dtypes_devices_libraries_and_layouts_are_named():
    q = (2, 1, 32, 128)
    cache = (2, 64, 8, 128)
    with pytest.raises(ValueError, match="q dtype must be one of"):
        _check(q=_view(q, "float32"))
    with pytest.raises(ValueError, match=r"k_cache dtype must match q \(bfloat16\)"):
        _check(k_cache=_view(cache, "float16"))
    with pytest.raises(ValueError, match=r"v_cache must be on q's device \(0\)"):
        _check(v_cache=_view(cache, device=1))
    with pytest.raises(ValueError, match="k_cache must come from the same library as q"):
        _check(k_cache=_view(cache, library="cupy"))
    with pytest.raises(ValueError, match="k_cache must be contiguous in its last"):
        _check(k_cache=_view(cache, strides=(1, 2, 3, 4)))


def _lengths_check(lengths, table=None, **shape):
    from wavefront.kernel.kvcache import check_arrays, check_host_lengths
    cache = (40, 16, 2, 64) if table is not None else (2, 100, 2, 64)
    new = shape.get("new")
    checked = check_arrays(_view((2, 1, 4, 64)), _view(cache), _view(cache),
                           None if new is None else _view((2, new, 2, 64)),
                           None if new is None else _view((2, new, 2, 64)),
                           None if table is None else np.asarray(table).shape)
    check_host_lengths(checked, np.asarray(lengths),
                       None if table is None else np.asarray(table))


@pytest.mark.parametrize("lengths,table,new,message", [
    ([3, -1], None, None, r"cache_seqlens must be >= 0, got -1 for sequence 1"),
    ([3, 101], None, None, r"cache_seqlens\[1\] = 101 exceeds the cache's 100 keys .*S_max"),
    ([99, 3], None, 2, r"cache_seqlens\[0\] = 99 \+ 2 new keys exceeds the cache's 100"),
    ([3], None, None, r"cache_seqlens must hold one length per sequence \(batch=2\)"),
    ([49, 0], [[0, 1, 2], [3, 4, 5]], None, r"exceeds the cache's 48 keys .*3 pages"),
    ([20, 0], [[0, 40, 2], [3, 4, 5]], None, r"block_table\[0, 1\] = 40 is not a page of "
                                             r"k_cache \(0 to 39\)"),
    ([0, 16], [[0, 1, 2], [-3, 4, 5]], 1, r"block_table\[1, 0\] = -3"),
])
def test_bad_host_lengths_and_block_tables_are_named(lengths, table, new, message):
    with pytest.raises(ValueError, match=message):
        _lengths_check(lengths, table, new=new)


def test_page_ids_past_a_sequences_length_are_not_read_so_not_checked():
    _lengths_check([16, 0], [[0, 1, -5], [3, 99, 5]])  # only page 0 of each is read


def test_flags_name_what_the_kernels_clamped():
    pytest.importorskip("cuda.tile", reason="the flag bits live in the kernel module")
    from wavefront.kernel.decode import FLAG_APPEND, FLAG_PAGE, FLAG_SEQLEN
    from wavefront.kernel.kvcache import describe_flags
    assert "cache_seqlens" in describe_flags(FLAG_SEQLEN)
    assert "block_table" in describe_flags(FLAG_PAGE)
    assert "appended" in describe_flags(FLAG_APPEND)
    assert describe_flags(FLAG_SEQLEN | FLAG_PAGE).count(";") == 1
    assert len({FLAG_SEQLEN, FLAG_PAGE, FLAG_APPEND}) == 3


def test_the_public_call_is_exported():
    import wavefront
    from wavefront import api
    assert "attention_with_kvcache" in wavefront.__all__
    assert wavefront.attention_with_kvcache is api.attention_with_kvcache
    import inspect
    params = inspect.signature(api.attention_with_kvcache).parameters
    assert list(params) == ["q", "k_cache", "v_cache", "cache_seqlens", "k", "v",
                            "block_table", "causal", "scale", "num_splits", "cta_order",
                            "return_lse", "out", "stream"]
    assert params["causal"].default is True


# --------------------------------------------------------------------------------------------
# Ahead-of-time compilation (tileiras, no GPU)
# --------------------------------------------------------------------------------------------

def _compile(variant):
    from wavefront.kernel.attention import compile_variant
    from wavefront.kernel.cubin import kernel_resources
    from wavefront.kernel.sass import find_cuobjdump, sass_summary
    try:
        cubin = compile_variant(variant, "sm_90")
        sass = sass_summary(cubin) if find_cuobjdump() else None
        return variant.label, kernel_resources(cubin), sass, None
    except Exception as exc:  # reported with the variant's name
        return variant.label, None, None, f"{type(exc).__name__}: {exc}"


def _compile_all(variants):
    with ProcessPoolExecutor(max_workers=max(2, os.cpu_count() or 2)) as pool:
        results = list(pool.map(_compile, variants))
    failed = [(label, err) for label, _, _, err in results if err]
    assert not failed, failed[:3]
    for label, resources, sass, _ in results:
        (kernel,) = resources
        assert 0 < kernel.registers <= 255, label
        assert kernel.shared_bytes <= 227 * 1024, label
        if sass is not None and label.startswith("decode_") and "_d128_" in label:
            # the tiles were chosen for this at D=128 (`decode_schedules.MIN_TILE_M`,
            # `DEFAULT_TILE_N`). D=64 binaries spill with tileiras 13.4 at two CTAs per SM
            # (43/38 local loads/stores with splits, 1289/1358 paged by 16-key pages): not
            # asserted, a known cost of the D=64 path.
            assert sass.local_loads == sass.local_stores == 0, (label, sass)
            assert sass.hgmma and sass.wgmma_pipelined, (label, sass)


@pytest.mark.compile
def test_each_cache_kernel_compiles_for_sm90():
    """One binary of each kernel and kind: decode (GQA 4, contiguous), split paged with pages
    of 16, chunked prefill with the LSE, the combine with the LSE (8, 1 and 4 splits a load),
    the paged append."""
    pytest.importorskip("cuda.tile", reason="compiling needs cuda-tile (the gpu extra)")
    from wavefront.kernel.decode import (AppendVariant, CombineSplitsVariant, DecodeVariant,
                                         variants_for)
    problem = DecodeProblem(4, 32, 8, 1, 8192, 128, page_size=16)
    append, attention, combine = variants_for(problem, "bfloat16", 4, True, True)
    assert attention.paged and attention.partials and attention.pages_per_tile == 4
    assert combine.write_lse and not attention.write_lse and append.paged
    _compile_all([DecodeVariant("bfloat16", 128, 64, 64, 4, False), attention,
                  DecodeVariant("float16", 64, 64, 64, 4, False, write_lse=True),
                  combine, CombineSplitsVariant("float16", 64, 16, 4, 1),
                  CombineSplitsVariant("bfloat16", 128, 1, 8, 4, True),
                  AppendVariant("float16", 64, True)])


@pytest.mark.compile
@pytest.mark.slow
def test_every_cache_binary_compiles_for_sm90():
    pytest.importorskip("cuda.tile", reason="compiling needs cuda-tile (the gpu extra)")
    from wavefront.kernel.decode import all_decode_variants
    _compile_all(list(all_decode_variants()))


@pytest.mark.parametrize("argv,expected", [
    (["--batch", "a,b"], "comma-separated list"),
    (["--heads", "3", "--kv-heads", "2"], "multiple of kv-heads"),
    (["--context", "0"], "must be positive"),
    (["--head-dim", "96"], "--head-dim"),
    (["--page-size", "48"], "--page-size"),
    (["--rounds", "2"], "--rounds"),
    (["--sweep-splits", "0"], "--sweep-splits"),
    (["--sweep-splits", "8,x"], "--sweep-splits"),
    (["--sweep-ctas-per-sm", "5"], "--sweep-ctas-per-sm"),
    (["--sweep-splits", "\u00b2"], "--sweep-splits"),
])
def test_bench_decode_names_its_bad_flags(argv, expected):
    from click.testing import CliRunner

    from wavefront.cli import main
    result = CliRunner().invoke(main, ["bench-decode", *argv])
    assert result.exit_code == 2, result.output
    assert expected in result.output and "Traceback" not in result.output


def test_a_split_and_occupancy_sweep_names_one_contender_per_pair():
    """The sweep's contenders: every (splits, CTAs per SM) pair once, 'auto' for the planned
    value, and none without a sweep (the bench's planned launch only)."""
    from wavefront.cli.measure import _decode_variants
    variants = _decode_variants("auto,16", "2,3")
    assert variants == {"sauto c2": {"num_splits": None, "ctas_per_sm": 2},
                        "sauto c3": {"num_splits": None, "ctas_per_sm": 3},
                        "s16 c2": {"num_splits": 16, "ctas_per_sm": 2},
                        "s16 c3": {"num_splits": 16, "ctas_per_sm": 3}}
    assert _decode_variants("", "") == {}
    assert list(_decode_variants("8", "")) == ["s8 cauto"]


@pytest.mark.compile
def test_the_decode_kernel_compiles_at_each_occupancy_a_sweep_asks_for():
    """`ctas_per_sm` is compiled into the attention kernel (cuTile's occupancy): the split
    binary at D128 builds for 2 and 3 CTAs per SM, each within an SM's shared memory."""
    pytest.importorskip("cuda.tile", reason="compiling needs cuda-tile (the gpu extra)")
    from wavefront.kernel.decode import variants_for
    problem = DecodeProblem(1, 32, 8, 1, 32768, 128)
    binaries = [variants_for(problem, "bfloat16", 16, False, False, occupancy)[1]
                for occupancy in (2, 3)]
    assert [b.occupancy for b in binaries] == [2, 3] and binaries[0] != binaries[1]
    assert binaries[1].label.endswith("_occ3")
    with ProcessPoolExecutor(max_workers=2) as pool:
        results = list(pool.map(_compile, binaries))
    assert all(err is None for *_, err in results), results
    assert all(res[0].shared_bytes * occ <= 228 * 1024
               for (_, res, _, _), occ in zip(results, (2, 3))), results


def test_decode_bench_records_read_back_with_failures_apart(tmp_path):
    from wavefront.results.records import DECODE_BENCH_RECORDS
    row = DECODE_BENCH_RECORDS.stamp({
        "gpu": "H100", "batch": 1, "context": 4096, "heads": 32, "kv_heads": 8,
        "head_dim": 128, "page_size": 64, "contender": "wavefront contiguous",
        "kv_bytes": 1 << 24, "samples_ms": [0.01] * 6, "median_ms": 0.01, "gbps": 1677.7,
        "gbps_ci95": [1600.0, 1700.0], "dram_peak_gbps": 3000.0})
    failed = {"gpu": "H100", "batch": 64, "context": 131072, "error": "OutOfMemoryError: x"}
    path = tmp_path / "bench_decode.jsonl"
    import json
    path.write_text(json.dumps(row) + "\n" + json.dumps(failed) + "\n")
    assert [r["contender"] for r in DECODE_BENCH_RECORDS.read(path)] == ["wavefront contiguous"]
    assert DECODE_BENCH_RECORDS.read(path, failed=True) == [failed]


def test_bench_sets_rotate_past_the_l2_and_fit_in_memory():
    from wavefront.measure.decode_bench import input_sets, kv_bytes
    l2 = 50 << 20
    small = kv_bytes(1, 4096, 8, 128)  # 16 MiB: 14 sets put 4 L2s between two reads
    assert small == 2 * 4096 * 8 * 128 * 2
    assert input_sets(small, l2, 80 << 30, copies=2) == 1 + -(-4 * l2 // small)
    huge = kv_bytes(64, 131072, 8, 128)  # 34 GB: one set, and no paged copy beside it
    assert input_sets(huge, l2, 79 << 30, copies=1) == 1
    assert input_sets(huge, l2, 79 << 30, copies=2) == 0


@pytest.mark.parametrize("page_size,splits,lse,new", [(None, 1, False, 0), (16, 4, True, 3),
                                                      (64, 1, True, 1), (256, 2, False, 0)])
def test_the_call_hands_each_kernel_every_parameter_once(page_size, splits, lse, new):
    """The call's per-call arrays plus what it binds once are exactly each kernel's
    parameters (a missing or extra name would first fail on the GPU)."""
    pytest.importorskip("cuda.tile", reason="the kernels' signatures")
    from wavefront.kernel.attention import launch_args
    from wavefront.kernel.decode import (APPEND_PARAMS, COMBINE_SPLITS_PARAMS, DECODE_PARAMS,
                                         variants_for)
    from wavefront.kernel.kvcache import (APPEND_PER_CALL, ATTENTION_PER_CALL,
                                          COMBINE_PER_CALL, bound_arguments)
    problem = DecodeProblem(2, 32, 8, 1 + new, 4096, 128, seqlen_new=new, page_size=page_size)
    launch = DecodeLaunch(problem, splits, 264)
    variants = variants_for(problem, "bfloat16", splits, lse, new > 0)
    bound, combined = bound_arguments(launch, variants, ("o", "m", "l"), "work", "flags",
                                      0.1, True)
    args = launch_args(DECODE_PARAMS, {**dict.fromkeys(ATTENTION_PER_CALL), **bound})
    assert len(args) == len(DECODE_PARAMS)
    assert (combined is not None) == (splits > 1) == variants[1].partials
    if combined is not None:
        launch_args(COMBINE_SPLITS_PARAMS, {**dict.fromkeys(COMBINE_PER_CALL), **combined})
    if new:
        launch_args(APPEND_PARAMS, {**dict.fromkeys(APPEND_PER_CALL), **variants[0].constants})
    assert bound["PAGED"] == (page_size is not None)
    assert bound["PAGES_PER_TILE"] == (4 if page_size == 16 else 1)


def test_prepared_launches_take_the_kernels_leading_parameters():
    """A prepared launch writes the addresses of its kernel's first parameters: the names the
    call passes by address must be those, in the kernel's order."""
    pytest.importorskip("cuda.tile", reason="the kernels' signatures")
    from wavefront.kernel.decode import COMBINE_SPLITS_PARAMS, DECODE_PARAMS
    from wavefront.kernel.kvcache import (ATTENTION_PER_CALL, ATTENTION_PREPARED,
                                          COMBINE_PER_CALL, COMBINE_PREPARED)
    for prepared, params, per_call in ((ATTENTION_PREPARED, DECODE_PARAMS, ATTENTION_PER_CALL),
                                       (COMBINE_PREPARED, COMBINE_SPLITS_PARAMS,
                                        COMBINE_PER_CALL)):
        assert prepared == tuple(p.name for p in params[:len(prepared)])
        assert set(per_call) <= set(prepared)  # every per-call array among them
        assert all(p.kind == "array" for p in params[:len(prepared)])


def test_a_launch_state_serves_every_capacity_of_its_split_count():
    """A cache growing a key a step shares its work table and workspace while its split count
    holds; another split count, batch or order gets its own."""
    from wavefront.kernel.kvcache import _state_key
    problem = DecodeProblem(1, 32, 8, 1, 4096, 128)
    grown = DecodeProblem(1, 32, 8, 1, 4097, 128)
    assert _state_key(DecodeLaunch(problem, 16, 264)) == _state_key(DecodeLaunch(grown, 16, 264))
    assert _state_key(DecodeLaunch(problem, 16, 264)) != _state_key(DecodeLaunch(grown, 17, 264))
    assert _state_key(DecodeLaunch(problem, 16, 264)) != _state_key(
        DecodeLaunch(DecodeProblem(2, 32, 8, 1, 4096, 128), 16, 264))
    assert _state_key(DecodeLaunch(problem, 16, 264)) != _state_key(
        DecodeLaunch(problem, 16, 264, "kv_head_major"))
    # what the kernel reads of the table is the same at both capacities
    read = [DECODE_BATCH, DECODE_KV_HEAD, DECODE_Q_TILE, DECODE_SPLIT, DECODE_SPLITS]
    assert (DecodeLaunch(problem, 16, 264).work_table()[:, read]
            == DecodeLaunch(grown, 16, 264).work_table()[:, read]).all()


def test_a_gpu_block_table_is_read_back_once_until_torch_writes_it(monkeypatch):
    """The prefix-grouped order reads a GPU block table's first column back to the host: once
    per tensor, and again after an in-place write (its version counter), not every call."""
    torch = pytest.importorskip("torch")
    from wavefront.kernel import kvcache
    monkeypatch.setattr(kvcache, "_gpu_sharing", [])
    reads = []

    class Table(torch.Tensor):  # a CPU tensor standing in for a GPU one, counting reads
        def tolist(self):
            reads.append(1)
            return super().tolist()

    table = torch.tensor([[3, 4], [3, 5], [7, 8]], dtype=torch.int32).as_subclass(Table)
    assert kvcache._gpu_table_sharing(table) == (3, 3, 7)
    assert kvcache._gpu_table_sharing(table) == (3, 3, 7)
    assert len(reads) == 1
    table[2, 0] = 3  # in place: the version counter moves
    assert kvcache._gpu_table_sharing(table) == (3, 3, 3)
    assert len(reads) == 2
