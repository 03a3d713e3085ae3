"""The cache model against brute force: stack distances, LRU, partitions, traces."""
import json
import random
import subprocess
import sys
from collections import OrderedDict

import numpy as np
import pytest

from wavefront.model.fits import analytic_misses, error_table, knee, predict
from wavefront.model.presets import PRESETS, gpu_preset
from wavefront.model.simulation import (
    COLD,
    KIND_O,
    KIND_Q,
    Trace,
    access_trace,
    miss_bytes_at,
    miss_ratio_curve,
    reuse_distances,
    sampled_reuse_distances,
    check_simulable,
    simulate_l2,
)
from wavefront.point import plan


def make_trace(addresses, sizes=None, kinds=None, slots=None):
    a = np.asarray(addresses, dtype=np.int64)
    n = len(a)
    sizes = np.asarray(sizes if sizes is not None else [64] * n, dtype=np.int32)
    kinds = np.asarray(kinds if kinds is not None else [0] * n, dtype=np.int8)
    slots = np.asarray(slots if slots is not None else [0] * n, dtype=np.int32)
    return Trace(a, sizes, kinds, slots, int(slots.max()) + 1 if n else 1)


def brute_distances(addresses, sizes):
    out = []
    for t, a in enumerate(addresses):
        prev = max((i for i in range(t) if addresses[i] == a), default=None)
        if prev is None:
            out.append(COLD)
            continue
        between = {addresses[i] for i in range(prev + 1, t)} - {a}
        out.append(sum(sizes[b] for b in between))
    return out


def brute_lru_miss_bytes(addresses, sizes, capacity):
    cache, used, miss = OrderedDict(), 0, 0
    for a in addresses:
        if a in cache:
            cache.move_to_end(a)
            continue
        miss += sizes[a]
        cache[a] = True
        used += sizes[a]
        while used > capacity and len(cache) > 1:
            victim, _ = cache.popitem(last=False)
            used -= sizes[victim]
    return miss


@pytest.mark.parametrize("seed", range(6))
def test_stack_distances_match_brute_force_on_random_traces(seed):
    rng = random.Random(seed)
    n_ids = rng.randint(1, 40)
    sizes = {i: rng.choice([32, 64, 128, 4096]) for i in range(n_ids)}
    addresses = [rng.randrange(n_ids) for _ in range(rng.randint(1, 400))]
    trace = make_trace(addresses, [sizes[a] for a in addresses])
    assert list(reuse_distances(trace)) == brute_distances(addresses, sizes)


def test_stack_distances_on_structured_traces():
    # A cyclic scan of N tiles: every reuse sees the other N-1 tiles.
    n = 16
    cyclic = list(range(n)) * 3
    d = reuse_distances(make_trace(cyclic))
    assert list(d[:n]) == [COLD] * n and set(d[n:]) == {(n - 1) * 64}
    # A sawtooth scan: the k-th tile after the turn saw the k tiles beyond it.
    saw = list(range(n)) + list(range(n - 1, -1, -1))
    d = reuse_distances(make_trace(saw))
    assert list(d[n:]) == [k * 64 for k in range(n)]


@pytest.mark.parametrize("seed", range(4))
def test_lru_equals_brute_force_and_reuse_threshold(seed):
    rng = random.Random(100 + seed)
    n_ids = rng.randint(5, 60)
    sizes = {i: rng.choice([64, 128, 256]) for i in range(n_ids)}
    addresses = [rng.randrange(n_ids) for _ in range(600)]
    trace = make_trace(addresses, [sizes[a] for a in addresses])
    d = reuse_distances(trace)
    for capacity in (256, 1024, 4096, 1 << 20):
        expected = brute_lru_miss_bytes(addresses, sizes, capacity)
        sim = simulate_l2(trace, capacity, partitions=1)
        assert sim.dram_read_sectors * 32 == expected
        if len(set(sizes.values())) == 1:
            assert miss_bytes_at(d, trace.nbytes, capacity) == expected


def test_uniform_sizes_make_the_reuse_model_exact_lru():
    rng = random.Random(5)
    addresses = [rng.randrange(50) for _ in range(2000)]
    trace = make_trace(addresses, [64] * len(addresses))
    d = reuse_distances(trace)
    for capacity in (64 * k for k in (1, 5, 17, 49, 50)):
        assert miss_bytes_at(d, trace.nbytes, capacity) == brute_lru_miss_bytes(
            addresses, {i: 64 for i in range(50)}, capacity)
        assert simulate_l2(trace, capacity).dram_read_sectors * 32 == brute_lru_miss_bytes(
            addresses, {i: 64 for i in range(50)}, capacity)


def test_two_partitions_conserve_reads_and_need_fabric():
    rng = random.Random(9)
    addresses = [rng.randrange(200) for _ in range(5000)]
    trace = make_trace(addresses, [128] * 5000, slots=[rng.randrange(8) for _ in range(5000)])
    one = simulate_l2(trace, 1 << 30, partitions=1)
    two = simulate_l2(trace, 1 << 30, partitions=2, sms=8)
    assert one.tex_read_sectors == two.tex_read_sectors
    # With room for everything, each tile leaves DRAM exactly once in either model.
    assert one.dram_read_sectors == two.dram_read_sectors == 200 * 4
    assert two.fabric_read_sectors > 0 and two.fabric_read_hit_sectors > 0
    assert two.tex_read_hit_sectors < one.tex_read_hit_sectors


def test_sampled_distances_approximate_exact_miss_ratio():
    launch = plan((1, 1, 16384, 64), (1, 1, 16384, 64), schedule="persistent+linear",
                  tiles="64x64", sms=16, l2_bytes=1 << 22)
    trace = access_trace(launch)
    exact = reuse_distances(trace)
    sampled, mask, scale = sampled_reuse_distances(trace, rate=0.2)
    caps = [1 << 18, 1 << 20, 1 << 22]
    exact_mrc = miss_ratio_curve(exact, trace.nbytes, caps)
    sampled_mrc = miss_ratio_curve(sampled, trace.nbytes[mask], caps)
    assert np.allclose(exact_mrc, sampled_mrc, atol=0.05)
    assert scale == pytest.approx(5.0, rel=1e-3)


@pytest.mark.parametrize("schedule", ["grid+linear", "persistent+sawtooth", "grouped+linear"])
@pytest.mark.parametrize("causal", [False, True])
def test_trace_accesses_what_the_launch_visits(schedule, causal):
    launch = plan((2, 4, 700, 64), (2, 2, 700, 64), causal=causal, schedule=schedule,
                  tiles="128x64", sms=3, l2_bytes=1 << 20)
    trace = access_trace(launch)
    expected = sum(2 * len(w.kv_tiles) + 2 for w in launch.all_work())
    assert len(trace) == expected
    assert (trace.kind == KIND_O).sum() == launch.problem.num_items
    # A persistent slot's K accesses are its items' K/V tiles, in each item's own order
    # (sawtooth: backward on odd local iterations). K tile j of unit u is (u * kv_tiles + j) * 8.
    if launch.cta.persistent:
        p = launch.problem
        for cta in range(launch.num_ctas):
            k_addr = trace.address[(trace.slot == cta) & (trace.kind == 0)]
            got = [int(a // 8) % p.kv_tiles for a in k_addr]
            expected = [j for w in launch.work_of_cta(cta) for j in w.kv_tiles]
            assert got == expected
            units = [int(a // 8) // p.kv_tiles for a in k_addr]
            assert units == [w.batch * p.kv_heads + w.head // p.qheads_per_kv
                             for w in launch.work_of_cta(cta) for _ in w.kv_tiles]


def test_sawtooth_beats_linear_past_the_knee_and_ties_before():
    gpu = gpu_preset("h100")
    res = {}
    for seqlen in (8192, 131072):
        for kv in ("linear", "sawtooth"):
            launch = plan((1, 1, seqlen, 64), (1, 1, seqlen, 64), schedule=f"persistent+{kv}",
                          tiles="64x64", sms=gpu.sms, l2_bytes=gpu.l2_bytes)
            res[seqlen, kv] = predict(launch, gpu).read_miss_sectors
    assert res[8192, "linear"] == res[8192, "sawtooth"]  # compulsory only
    assert res[131072, "sawtooth"] < 0.6 * res[131072, "linear"]


def test_tiled_reads_kv_about_once_plus_partials():
    gpu = gpu_preset("h100")
    res = {}
    for kv in ("linear", "tiled"):
        launch = plan((1, 1, 262144, 64), (1, 1, 262144, 64), schedule=f"persistent+{kv}",
                      tiles="64x64", sms=gpu.sms, l2_bytes=gpu.l2_bytes)
        res[kv] = (predict(launch, gpu), launch)
    tiled, launch = res["tiled"]
    assert launch.n_chunks > 1
    trace = access_trace(launch)
    writes = trace.kind == 4
    reads = trace.kind == 5
    assert writes.sum() == reads.sum() == launch.num_items
    # K/V about once: within 1.5x of the minimum that counts the partial states
    assert tiled.dram_read_bytes < 1.5 * tiled.compulsory_read_bytes
    assert tiled.dram_read_bytes < 0.7 * res["linear"][0].dram_read_bytes


def test_analytic_model_brackets():
    gpu = gpu_preset("h200")
    small = plan((1, 1, 4096, 64), (1, 1, 4096, 64), sms=gpu.sms, l2_bytes=gpu.l2_bytes)
    assert analytic_misses(small, 30 << 20) == 3 * 4096 * 64 * 2  # Q, K, V once
    big_lin = plan((1, 1, 262144, 64), (1, 1, 262144, 64), sms=gpu.sms, l2_bytes=gpu.l2_bytes,
                   tiles="64x64")
    big_saw = plan((1, 1, 262144, 64), (1, 1, 262144, 64), sms=gpu.sms, l2_bytes=gpu.l2_bytes,
                   tiles="64x64", schedule="persistent+sawtooth")
    assert analytic_misses(big_saw, 30 << 20) < analytic_misses(big_lin, 30 << 20)


def test_error_table_and_knee():
    e = error_table([1.1, 2.0, 2.7], [1.0, 2.0, 3.0])
    assert e["n"] == 3 and e["mape"] == pytest.approx((0.1 + 0 + 0.1) / 3)
    assert knee([1, 2, 4, 8], [10, 10, 12, 40], [10, 10, 10, 10]) == 8
    assert knee([1, 2], [1, 1], [1, 1]) is None


def test_presets():
    assert set(PRESETS) >= {"h100", "h200", "b200", "gb10"}
    assert gpu_preset("GB10").l2_bytes == 24 << 20
    assert gpu_preset("h100").with_overrides(sms=100).sms == 100
    with pytest.raises(ValueError, match="gpu must be one of"):
        gpu_preset("a100")


def test_paper_sized_launch_streams_in_bounded_memory():
    """The paper's launch (GB10 preset, B=8, H=1, S=131072, D=64, 64x64, 48 CTAs, linear and
    sawtooth: 134 M tile accesses) in one process: memory stays under 2 GB because the trace
    is streamed. Seconds and accesses/s are printed for the CI log, not asserted."""
    out = subprocess.run([sys.executable, "-m", "wavefront.cli", "simulate", "--gpu", "gb10",
                          "--batch", "8", "--heads", "1", "--seqlen", "131072", "--head-dim",
                          "64", "--tile", "64x64", "--no-clock",
                          "--schedule", "persistent+linear,persistent+sawtooth", "--json"],
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr
    res = json.loads(out.stdout)
    # per launch: 8 x 2048 work items, each reads Q, 2048 K and 2048 V tiles, writes O
    assert sum(r["accesses"] for r in res["results"]) == 2 * 8 * 2048 * (2 + 2 * 2048)
    assert res["peak_rss_mib"] < 2048
    linear, sawtooth = res["results"]
    assert sawtooth["dram_read_bytes"] < linear["dram_read_bytes"]
    print(f"paper-sized simulate: {res['seconds']:.1f} s, "
          f"{res['accesses_per_s'] / 1e6:.1f} M accesses/s, peak {res['peak_rss_mib']:.0f} MiB")


def test_paper_sized_launch_with_the_clock_stays_under_2_gb():
    """The paper's launch as the paper ran it (48 persistent CTAs, one per SM) through the
    timed model, on the GB10 preset: memory under 2 GB; seconds printed for the CI log (the
    issue's 10 s is a target for this 2-core machine, not asserted in a unit test)."""
    out = subprocess.run([sys.executable, "-m", "wavefront.cli", "simulate", "--gpu", "gb10",
                          "--batch", "8", "--heads", "1", "--seqlen", "131072", "--head-dim",
                          "64", "--tile", "64x64", "--occupancy", "1", "--ctas", "48",
                          "--schedule", "persistent+linear,persistent+sawtooth", "--json"],
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr
    res = json.loads(out.stdout)
    assert res["model"] == "timed" and res["peak_rss_mib"] < 2048
    linear, sawtooth = res["results"]
    assert sawtooth["dram_read_bytes"] < linear["dram_read_bytes"]
    print("paper-sized simulate with the clock: "
          + ", ".join(f"{r['schedule']} {r['seconds']:.1f} s" for r in res["results"])
          + f", peak {res['peak_rss_mib']:.0f} MiB")


@pytest.mark.parametrize("schedule", ["grid+sawtooth", "persistent+tiled", "grouped+linear"])
def test_streamed_blocks_are_the_whole_trace(schedule):
    """Blocks of any size concatenate to the same stream, and the LRU fed block by block
    counts what it counts on the whole trace: the resumable state carries over exactly."""
    from wavefront.model.simulation import LruL2, address_bound, trace_blocks
    launch = plan((2, 4, 3000, 64), (2, 2, 3000, 64), causal=True, schedule=schedule,
                  tiles="64x64", sms=5, l2_bytes=1 << 20)
    whole = access_trace(launch)
    for block in (5, 97):
        blocks = [(b.address.copy(), b.kind.copy(), b.slot.copy())
                  for b in trace_blocks(launch, block_accesses=block)]
        assert all(len(a) <= max(block, 8) for a, _, _ in blocks)
        for got, want in zip((np.concatenate(parts) for parts in zip(*blocks)),
                             (whole.address, whole.kind, whole.slot)):
            assert (got == want).all()
        fed = LruL2(300_000, address_bound(launch), partitions=2, sms=5)
        for b in trace_blocks(launch, block_accesses=block):
            fed.feed(b)
        assert fed.result() == simulate_l2(whole, 300_000, partitions=2, sms=5)


def test_sampled_summary_of_a_large_launch_is_close_to_exact(monkeypatch):
    """Above SUMMARY_SAMPLE_ACCESSES the reuse summary comes from SHARDS (5% here): the tail
    quantile and the share within capacity stay close to the exact ones; short distances are
    resolved to about one tile x 1/rate, SHARDS' known resolution."""
    import wavefront.model.fits as fits
    gpu = gpu_preset("h100")
    launch = plan((1, 2, 16384, 64), (1, 2, 16384, 64), schedule="persistent+linear",
                  tiles="64x64", sms=8, l2_bytes=gpu.l2_bytes)
    capacity = 4 << 20
    exact = predict(launch, gpu, capacity_bytes=capacity)
    assert exact.reuse["sample_rate"] == 1.0
    monkeypatch.setattr(fits, "SUMMARY_SAMPLE_ACCESSES", exact.accesses // 20)
    sampled = predict(launch, gpu, capacity_bytes=capacity)
    rate = sampled.reuse["sample_rate"]
    assert 0.04 < rate < 0.06
    assert sampled.read_miss_sectors == exact.read_miss_sectors  # the LRU never samples
    resolution_mib = 64 * 64 * 2 / rate / 2**20
    for key in ("median_mib", "p90_mib", "p99_mib"):
        tolerance = max(0.15 * exact.reuse[key], resolution_mib)
        assert abs(sampled.reuse[key] - exact.reuse[key]) <= tolerance, key
    assert sampled.reuse["within_capacity"] == pytest.approx(exact.reuse["within_capacity"],
                                                             abs=0.03)
    assert sampled.reuse["reuses"] == pytest.approx(exact.reuse["reuses"], rel=0.25)


def test_simulator_refuses_what_it_cannot_hold():
    launch = plan((1, 1, 2**31, 64), (1, 1, 2**31, 64), sms=132, l2_bytes=50 << 20)
    with pytest.raises(ValueError, match="tile accesses"):
        check_simulable(launch)
    check_simulable(plan((1, 1, 4096, 64), (1, 1, 4096, 64), sms=132, l2_bytes=50 << 20))


def test_two_partitions_need_the_sm_count():
    trace = make_trace([1, 2, 3])
    with pytest.raises(ValueError, match="sms"):
        simulate_l2(trace, 1 << 20, partitions=2)


def test_oracle_general_trace_round_trips_and_an_independent_lru_agrees(tmp_path):
    """The trace written for other cache tools (libCacheSim's oracleGeneral) read back and run
    through an independent LRU (an OrderedDict) gives the simulator's DRAM bytes."""
    from wavefront.model.simulation import next_access, read_oracle_general, write_oracle_general
    launch = plan((1, 2, 2048, 64), (1, 2, 2048, 64), schedule="persistent+sawtooth",
                  tiles="64x64", sms=4, l2_bytes=1 << 20)
    trace = access_trace(launch)
    path = tmp_path / "t.oracleGeneral.bin"
    n = write_oracle_general(trace, path)
    rec = read_oracle_general(path)
    assert path.stat().st_size == 24 * n == 24 * int(trace.is_read.sum())
    assert (rec["clock"] == range(n)).all()
    ids, sizes = rec["obj_id"].tolist(), rec["obj_size"].tolist()
    for i in (0, 1, n // 2, n - 2, n - 1):  # the next request for the same object, or -1
        j = int(rec["next_access"][i])
        if j == -1:
            assert ids[i] not in ids[i + 1:]
        else:
            assert j > i and ids[j] == ids[i] and ids[i] not in ids[i + 1:j]
    reads = Trace(trace.address[trace.is_read], trace.nbytes[trace.is_read],
                  trace.kind[trace.is_read], trace.slot[trace.is_read], trace.n_slots)
    for capacity in (64 << 10, 256 << 10, 4 << 20):
        expected = brute_lru_miss_bytes(ids, dict(zip(ids, sizes)), capacity)
        assert simulate_l2(reads, capacity).dram_read_sectors * 32 == expected
    assert list(next_access(np.array([5, 7, 5, 5, 7]))) == [2, 4, 3, -1, -1]


def test_simulate_writes_traces(tmp_path):
    from click.testing import CliRunner

    from wavefront.cli import main
    res = CliRunner().invoke(main, ["simulate", "--seqlen", "4096", "--trace-out",
                                    str(tmp_path), "--no-clock", "--json"])
    assert res.exit_code == 0, res.output
    files = sorted(p.name for p in tmp_path.iterdir())
    assert files == ["persistent+linear_s4096_d64.oracleGeneral.bin",
                     "persistent+sawtooth_s4096_d64.oracleGeneral.bin"]


def test_random_replacement_has_a_soft_cliff_where_lru_has_a_hard_one():
    """A cyclic scan of 40 tiles through a 32-tile cache: LRU misses every access, random
    replacement keeps hitting part of the time; with room for all, both miss once per tile."""
    from wavefront.model.simulation import RandomL2
    trace = make_trace(list(range(40)) * 20, sizes=[64] * 800)
    lru = simulate_l2(trace, 32 * 64).dram_read_sectors
    rnd = RandomL2(32 * 64, 40).feed(trace).result().dram_read_sectors
    assert lru == 800 * 2  # 64-byte tiles are two sectors, every access a miss
    assert 40 * 2 < rnd < 0.8 * lru
    assert RandomL2(64 * 64, 40).feed(trace).result().dram_read_sectors == 40 * 2


@pytest.mark.parametrize("kv", ["linear", "sawtooth"])
def test_dynamic_schedules_replay_the_next_free_slot(kv):
    """A dynamic schedule's assignment is made at run time; the rounds give the next row to the
    first free slot. With equally long items that is the grid-stride assignment, in the
    launch's own description; with causal items each slot still alternates on its own count."""
    for causal in (False, True):
        launch = plan((1, 3, 700, 64), (1, 3, 700, 64), causal=causal,
                      schedule=f"dynamic+{kv}", tiles="64x64", sms=2, l2_bytes=1 << 20,
                      ctas=4)
        p = launch.problem
        trace = access_trace(launch)
        assert (trace.kind == KIND_O).sum() == p.num_items
        for slot in range(4):
            k = [int(a // 8) % p.kv_tiles
                 for a in trace.address[(trace.slot == slot) & (trace.kind == 0)]]
            if not causal:
                assert k == [j for w in launch.work_of_cta(slot) for j in w.kv_tiles]
            # Split the slot's stream into items at their Q reads; odd items run backward.
            items = []
            for kind, address in zip(trace.kind[trace.slot == slot],
                                     trace.address[trace.slot == slot]):
                if kind == KIND_Q:
                    items.append([])
                elif kind == 0:
                    items[-1].append(int(address // 8) % p.kv_tiles)
            assert [j for tiles in items for j in tiles] == k
            for n, tiles in enumerate(items):
                unmasked = tiles[:-1]  # 700 is ragged and 64x64 tiles: one masked tile, last
                if kv == "sawtooth" and len(unmasked) > 1:
                    assert (unmasked[0] > unmasked[-1]) == (n % 2 == 1)
                elif kv == "linear":
                    assert tiles == sorted(tiles)
