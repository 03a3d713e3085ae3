"""Every registered schedule runs through these checks automatically (see
docs/adding_a_schedule.md): each work item exactly once, each item's K/V order a permutation of
exactly the tiles it must visit, the simulator's trace in the order the kernel's mapping gives,
and a closed-form count that matches. GPU correctness on ragged, causal and GQA shapes for every
schedule is in tests/test_gpu_attention.py, compilation in tests/test_compile.py."""
import random
from collections import Counter
from dataclasses import replace

import pytest

from wavefront.model.counting import launch_counts
from wavefront.model.simulation import KIND_O, access_trace
from wavefront.point import SECTOR_BYTES
from wavefront.schedules import (
    CTA_SCHEDULES,
    KV_SCHEDULES,
    AttentionProblem,
    GroupedSchedule,
    Launch,
    cta_schedule,
    kv_schedule,
    schedule_names,
)

SCHEDULES = schedule_names()


def launches(schedule: str, n: int, seed: int):
    """Random small launches: ragged lengths, GQA, causal or not (top-left or bottom-right
    aligned), several items per CTA."""
    rng = random.Random(seed)
    cta_name, kv_name = schedule.split("+")
    for _ in range(n):
        kv_heads = rng.choice([1, 2, 3])
        p = AttentionProblem(rng.randint(1, 3), kv_heads * rng.choice([1, 2, 4]), kv_heads,
                             rng.randint(1, 700), rng.randint(1, 700), 64,
                             causal=rng.random() < 0.5, tile_m=rng.choice([64, 128]),
                             tile_n=rng.choice([64, 128]),
                             causal_alignment=rng.choice(["top_left", "bottom_right"]))
        cta = cta_schedule(cta_name)
        if isinstance(cta, GroupedSchedule):
            cta = replace(cta, l2_fraction=rng.choice([0.001, 0.05, 0.5, 2.0]))
        yield Launch(p, cta, kv_schedule(kv_name), sms=rng.randint(1, 9),
                     ctas_per_sm=rng.randint(1, 3),
                     l2_bytes=rng.choice([1 << 16, 1 << 22, 50 << 20]),
                     ctas=rng.choice([None, rng.randint(1, 40)]))


def test_registry_is_consistent():
    assert len({s.code for s in CTA_SCHEDULES.values()}) == len(CTA_SCHEDULES)
    assert len({s.code for s in KV_SCHEDULES.values()}) == len(KV_SCHEDULES)
    for name, s in {**CTA_SCHEDULES, **KV_SCHEDULES}.items():
        doc = (type(s).__doc__ or "").strip()
        assert s.name == name and doc and not doc.startswith(type(s).__name__ + "("), name


@pytest.mark.parametrize("schedule", SCHEDULES)
def test_every_work_item_exactly_once(schedule):
    for launch in launches(schedule, 40, SCHEDULES.index(schedule)):
        p = launch.problem
        seen = Counter((w.batch, w.head, w.q_tile, w.chunk) for w in launch.all_work())
        expected = {(b, h, t, c) for b in range(p.batch) for h in range(p.heads)
                    for t in range(p.q_tiles) for c in range(launch.n_chunks)}
        assert set(seen) == expected, launch
        assert all(n == 1 for n in seen.values()), launch


@pytest.mark.parametrize("schedule", SCHEDULES)
def test_kv_order_is_a_permutation_of_the_tiles_to_visit(schedule):
    for launch in launches(schedule, 30, 100 + SCHEDULES.index(schedule)):
        p = launch.problem
        tiles = {}
        for w in launch.all_work():
            assert len(set(w.kv_tiles)) == len(w.kv_tiles)
            tiles.setdefault((w.batch, w.head, w.q_tile), []).extend(w.kv_tiles)
        for (_, _, t), got in tiles.items():
            last_row = min((t + 1) * p.tile_m, p.seqlen_q) - 1
            needed = [j for j in range(p.kv_tiles)
                      if not p.causal or j * p.tile_n <= last_row + p.diagonal]
            assert sorted(got) == needed


@pytest.mark.parametrize("schedule", SCHEDULES)
def test_simulator_trace_follows_the_kernel_mapping(schedule):
    """Each CTA slot's K accesses in the trace are its items' K/V tiles in the order the
    kernel's mapping (Launch.work_of_cta -> item_plan) gives, unit by unit."""
    for launch in launches(schedule, 12, 200 + SCHEDULES.index(schedule)):
        trace = access_trace(launch)
        p = launch.problem
        assert (trace.kind == KIND_O).sum() == p.num_items
        if not launch.cta.persistent or launch.cta.dynamic:
            continue  # a free slot takes the next item (run time); see test_dynamic_replay
        for cta in range(launch.num_ctas):
            k = trace.address[(trace.slot == cta) & (trace.kind == 0)]
            got = [(int(a // 8) // p.kv_tiles, int(a // 8) % p.kv_tiles) for a in k]
            expected = [(w.batch * p.kv_heads + w.head // p.qheads_per_kv, j)
                        for w in launch.work_of_cta(cta) for j in w.kv_tiles]
            assert got == expected


@pytest.mark.parametrize("schedule", SCHEDULES)
def test_trace_reads_what_the_closed_form_counts(schedule):
    for launch in launches(schedule, 12, 300 + SCHEDULES.index(schedule)):
        trace = access_trace(launch)
        counts = launch_counts(launch.problem, launch.n_chunks, launch.partial_row_bytes)
        kv = trace.nbytes[(trace.kind == 0) | (trace.kind == 1)].sum()
        assert kv // SECTOR_BYTES == pytest.approx(counts.kv_read_sectors, rel=0.02)


def test_the_readme_and_the_cli_list_schedules_from_the_registry():
    from click.testing import CliRunner

    from wavefront.cli import main
    out = CliRunner().invoke(main, ["schedules"]).output
    for name, s in {**CTA_SCHEDULES, **KV_SCHEDULES}.items():
        assert name in out and (type(s).__doc__ or "").strip().splitlines()[0] in out
