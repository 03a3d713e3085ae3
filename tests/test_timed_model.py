"""The timed cache model: clocks, fills, the DRAM queue, calibration (CPU only)."""
import json
from pathlib import Path

import numpy as np
import pytest

from wavefront.model.presets import PRESETS
from wavefront.model.timed import (
    Calibration, ComputeTiming, MemoryTiming, calibrate, memory_timing, projected_compute,
    simulate_timed)
from wavefront.point import plan

ROOT = Path(__file__).resolve().parents[1]
MEMORY = MemoryTiming(l2_ns=150.0, far_ns=150.0, dram_ns=400.0, dram_bytes_per_s=3e12)
L2 = 50 << 20


def _launch(seqlen=4096, heads=1, batch=1, causal=False, schedule="persistent+linear",
            tiles="64x64", ctas=None, sms=132, occupancy=None):
    return plan((batch, heads, seqlen, 64), (batch, heads, seqlen, 64), sms=sms, l2_bytes=L2,
                causal=causal, schedule=schedule, tiles=tiles, ctas=ctas,
                occupancy=occupancy)


def test_one_cta_in_the_l2_costs_its_steps_and_reads_each_tile_once():
    """One CTA, K/V far smaller than the L2: every byte comes from DRAM exactly once, and with
    steps much longer than any latency the time is the compute (plus the first loads)."""
    launch = _launch(seqlen=2048, ctas=1, sms=1, occupancy=1)
    compute = ComputeTiming(step_ns=5000.0, item_ns=700.0, launch_ns=3000.0)
    pred = simulate_timed(launch, MEMORY, compute, l2_bytes=L2, partitions=1)
    kv_bytes = 2 * 2048 * 64 * 2
    q_bytes = 2048 * 64 * 2
    assert pred.dram_read_bytes == kv_bytes + q_bytes
    items, steps = launch.num_items, launch.problem.kv_tiles
    compute_ns = items * (steps * 5000.0 + 700.0)
    # each item waits once for its Q and first K/V (the pipeline drains between items)
    assert compute_ns < pred.kernel_ns - 3000.0 < compute_ns + items * (400 + 150)
    assert pred.dram_series.sum() == pred.dram_read_bytes
    assert (np.diff(pred.item_start_ns) > 0).all()  # one CTA takes its items in order


def test_concurrent_misses_to_one_line_are_served_once():
    """Two CTAs on one head start together: each K/V tile is read from DRAM once, the second
    reader waits on the first one's fill instead of missing again."""
    launch = _launch(seqlen=128 * 64, ctas=2, sms=2, occupancy=1)
    pred = simulate_timed(launch, MEMORY, ComputeTiming(100.0, 0.0, 0.0), l2_bytes=L2,
                          partitions=1)
    kv_bytes = 2 * 128 * 64 * 64 * 2
    assert pred.dram_read_bytes == kv_bytes + 128 * 64 * 64 * 2  # K, V and every Q once
    assert pred.fill_waits > 0


def test_a_narrow_dram_sets_the_time():
    """At 1 GB/s the launch cannot end before its DRAM bytes have crossed."""
    slow = MemoryTiming(150.0, 150.0, 400.0, 1e9)
    launch = _launch(seqlen=8192, heads=4)
    pred = simulate_timed(launch, slow, ComputeTiming(10.0, 0.0, 0.0), l2_bytes=L2,
                          partitions=1)
    assert pred.kernel_ns >= pred.dram_read_bytes / 1.0  # bytes at 1 byte/ns
    fast = simulate_timed(launch, MEMORY, ComputeTiming(10.0, 0.0, 0.0), l2_bytes=L2,
                          partitions=1)
    assert fast.kernel_ns < pred.kernel_ns / 10


def test_a_dynamic_schedule_hands_out_rows_in_simulated_time():
    """grouped_dynamic: every item after the first wave starts when some CTA's previous item
    ended (the row counter is taken in time order)."""
    launch = _launch(seqlen=16384, causal=True, schedule="dynamic+linear", ctas=8, sms=8,
                     occupancy=1)
    pred = simulate_timed(launch, MEMORY, ComputeTiming(300.0, 100.0, 0.0), l2_bytes=L2,
                          partitions=1)
    first_wave = np.argsort(pred.item_start_ns)[:8]
    ends = set(np.round(pred.item_end_ns, 6))
    later = [i for i in range(launch.num_items) if i not in set(first_wave)]
    assert all(round(pred.item_start_ns[i], 6) in ends for i in later)
    order = np.argsort(pred.item_start_ns, kind="stable")
    assert (np.diff(order[8:]) > 0).mean() > 0.9  # rows leave the counter in table order


def test_sawtooth_reads_less_than_linear_when_the_kv_does_not_fit():
    """The effect the toolkit studies, from the clocked simulation: with K/V larger than the
    L2, the alternating scan reuses the previous wave's tail."""
    kw = dict(seqlen=65536, tiles="128x64", ctas=16, sms=16, occupancy=1)
    small_l2 = 8 << 20
    lin = simulate_timed(_launch(**kw), MEMORY, ComputeTiming(500.0, 0.0, 0.0),
                         l2_bytes=small_l2, partitions=1)
    saw = simulate_timed(_launch(schedule="persistent+sawtooth", **kw), MEMORY,
                         ComputeTiming(500.0, 0.0, 0.0), l2_bytes=small_l2, partitions=1)
    assert saw.dram_read_bytes < 0.8 * lin.dram_read_bytes


def test_calibration_recovers_the_costs_it_was_made_with():
    truth = ComputeTiming(step_ns=640.0, item_ns=900.0, launch_ns=5000.0)
    launches = [_launch(seqlen=s, heads=h, tiles=t) for s in (2048, 8192) for h in (2, 8)
                for t in ("64x64", "128x64")]
    measured = [simulate_timed(l, MEMORY, truth, l2_bytes=L2, partitions=2).kernel_ns
                for l in launches]
    cal = calibrate("G", launches, measured, MEMORY, l2_bytes=L2, partitions=2,
                    training="synthetic")
    assert cal.errors["max"] < 0.01
    for v, step in cal.step_ns.items():
        assert step == pytest.approx(640.0, rel=0.03), v
    again = Calibration.from_dict(json.loads(json.dumps(cal.as_dict())))
    assert again.step_ns == cal.step_ns and again.item_ns == cal.item_ns
    # an untrained CTAs-per-SM count is scaled from the trained one, and says so
    two_only = Calibration("G", 0.0, 0.0, {(64, 64, 64, False, 2): 640.0}, "t", 3, {})
    one_per_sm = _launch(seqlen=8192, ctas=132, occupancy=1)
    timing = two_only.compute(one_per_sm)
    assert timing.step_ns == pytest.approx(320.0) and "scaled" in timing.source
    assert two_only.compute(_launch(causal=True)) is None


def test_projected_compute_keeps_the_fraction_of_peak():
    cal = Calibration("H100", 5000.0, 900.0, {(64, 64, 64, False, 1): 540.0}, "t", 3,
                      {"median": 0, "max": 0})
    gb10 = PRESETS["gb10"]
    launch = plan((8, 1, 131072, 64), (8, 1, 131072, 64), sms=gb10.sms,
                  l2_bytes=gb10.l2_bytes, tiles="64x64", occupancy=1, ctas=gb10.sms)
    mid = projected_compute(cal, PRESETS["h100"], gb10, launch)
    ratio = (PRESETS["h100"].peak_bf16_flops / 132) / (gb10.peak_bf16_flops / 48)
    assert mid.step_ns == pytest.approx(540.0 * ratio)
    fast = projected_compute(cal, PRESETS["h100"], gb10, launch, 0.75)
    assert fast.step_ns < mid.step_ns and "75%" in fast.source


def test_bad_arguments_name_themselves():
    launch = _launch()
    with pytest.raises(ValueError, match="partitions"):
        simulate_timed(launch, MEMORY, ComputeTiming(1, 1, 1), l2_bytes=L2, partitions=3)
    with pytest.raises(ValueError, match="step_ns"):
        simulate_timed(launch, MEMORY, ComputeTiming(-1, 1, 1), l2_bytes=L2)
    with pytest.raises(ValueError, match="loads_ahead"):
        simulate_timed(launch, MEMORY, ComputeTiming(1, 1, 1), l2_bytes=L2, loads_ahead=0)
    with pytest.raises(ValueError, match="at least 3"):
        calibrate("G", [launch], [1.0], MEMORY, l2_bytes=L2, partitions=1, training="t")


def test_the_presets_memory_timings_are_the_microbenchmarks_medians():
    """H100 and H200 presets carry what `wavefront microbench` measured (data/microbench):
    one copy of each number, checked against its source."""
    lines = (ROOT / "data" / "microbench" / "microbench.jsonl").read_text().splitlines()
    records = [json.loads(line) for line in lines if line.strip()]
    for key, name in (("h100", "H100"), ("h200", "H200")):
        mine = [r for r in records if name in r["gpu"]]
        timing = memory_timing(PRESETS[key])
        assert timing.l2_ns == pytest.approx(np.median([r["l2_near_ns"] for r in mine]),
                                             rel=0.01)
        assert timing.dram_ns == pytest.approx(np.median([r["dram_ns"] for r in mine]),
                                               rel=0.01)
        assert timing.dram_bytes_per_s == pytest.approx(
            np.median([r["dram_read_gbps"] for r in mine]) * 1e9, rel=0.01)
    assert "guess" in memory_timing(PRESETS["gb10"]).source


def test_no_cache_time_is_the_busiest_cta_of_items_and_steps():
    """The no-cache baseline: launch + the busiest CTA's item costs + its steps x step time;
    the timed model with free memory reaches it, and never beats it."""
    from wavefront.model.timed import no_cache_ns
    launch = _launch(seqlen=4096, heads=2, ctas=3, sms=3, occupancy=1)
    compute = ComputeTiming(step_ns=500.0, item_ns=1000.0, launch_ns=2000.0)
    items = launch.num_items  # 2 heads x 64 Q tiles, 64 steps each, over 3 CTAs
    busiest = -(-items // 3)
    expected = 2000.0 + busiest * (1000.0 + 64 * 500.0)
    assert no_cache_ns(launch, compute) == pytest.approx(expected)
    free = MemoryTiming(0.0, 0.0, 0.0, 1e15)
    pred = simulate_timed(launch, free, compute, l2_bytes=L2, partitions=1)
    assert pred.kernel_ns >= expected - 1e-6
    assert pred.kernel_ns == pytest.approx(expected, rel=1e-6)
    dynamic = _launch(seqlen=4096, heads=2, schedule="grid+linear", sms=3, occupancy=1)
    assert no_cache_ns(dynamic, compute) >= expected - 1e-6  # a grid is balanced at best


def test_honest_scores_split_at_the_knee_and_pair_the_scans():
    """Scores are per split (above the knee, at compulsory), and the linear/sawtooth pairs
    come out of the point strings, their ratios from the rows."""
    import pandas as pd
    from wavefront.report.timed import honest_scores, ratio_skill, sawtooth_pairs
    rows = []
    for i, (measured, saw_ms) in enumerate(((100.0, 0.9), (300.0, 1.0), (500.0, 0.8))):
        for scan, ms in (("linear", 1.0), ("sawtooth", saw_ms)):
            rows.append({"gpu": "NVIDIA H100", "family": "f", "causal": False, "seqlen": i,
                         "schedule": f"persistent+{scan}",
                         "point": f"seqlen={i},cta_schedule=persistent,kv_schedule={scan}",
                         "measured_dram_bytes": measured, "compulsory_bytes": 100.0,
                         "predicted_dram_bytes": measured * (1.1 if scan == "linear"
                                                             else 1.1 - i / 10),
                         "lockstep_dram_bytes": measured * 1.2,
                         "measured_ms": ms, "predicted_ms": ms * (1.0 if scan == "linear"
                                                                else 1.01),
                         "no_cache_ms": 1.0})
    rows = pd.DataFrame(rows)
    h = honest_scores(None, rows).set_index("points")
    assert h.loc["above knee", "n"] == 4 and h.loc["at compulsory", "n"] == 2
    assert h.loc["at compulsory", "timed DRAM median"] == pytest.approx(0.1)
    assert h.loc["above knee", "lock-step DRAM median"] == pytest.approx(0.2)
    pairs = sawtooth_pairs(rows)
    assert len(pairs) == 3
    assert sorted(pairs["measured_time_ratio"]) == pytest.approx([0.8, 0.9, 1.0])
    skill = ratio_skill(pairs)
    assert skill["pairs"] == 3 and skill["time pearson"] == pytest.approx(1.0)


def _paper_like(schedule="persistent+linear", seqlen=32768):
    shape = (2, 1, seqlen, 64)
    return plan(shape, shape, sms=132, l2_bytes=L2, causal=False, schedule=schedule,
                tiles="64x64", occupancy=1, ctas=48)


def test_exposure_takes_l2_and_dram_from_the_attention():
    """L2 held by a co-runner or flushed by its streaming lines costs the attention DRAM
    reads (its K/V fits in 50 MiB, not in 10); a co-runner whose lines do not allocate leaves
    the L2 alone; its DRAM traffic loads every miss's latency."""
    from wavefront.model.timed import Exposure
    compute = ComputeTiming(540.0, 1100.0, 7000.0)
    launch = _paper_like()

    def run(**kw):
        return simulate_timed(launch, MEMORY, compute, l2_bytes=L2, partitions=2,
                              loads_ahead=3, exposure=Exposure(**kw))
    base = run()
    compulsory = 2 * 2 * 32768 * 64 * 2 + 2 * 32768 * 64 * 2  # K, V and Q of two heads
    assert base.dram_read_bytes == pytest.approx(compulsory, rel=0.01)
    assert run(l2_bytes_taken=40 << 20).dram_read_bytes > 3 * base.dram_read_bytes
    assert run(corunner_dram_bytes_per_s=2e12).dram_read_bytes > 3 * base.dram_read_bytes
    assert run(corunner_dram_bytes_per_s=2e12, corunner_l2_fraction=0.0
               ).dram_read_bytes == pytest.approx(base.dram_read_bytes, rel=0.01)
    loaded = [Exposure(corunner_dram_bytes_per_s=r).loaded_dram_ns(MEMORY)
              for r in (0, 1e12, 2e12, 2.9e12)]
    assert loaded[0] == MEMORY.dram_ns and all(np.diff(loaded) > 0)
    with pytest.raises(ValueError, match="l2_bytes_taken"):
        run(l2_bytes_taken=L2)
    with pytest.raises(ValueError, match="corunner_l2_fraction"):
        run(corunner_dram_bytes_per_s=1e12, corunner_l2_fraction=2.0)


def test_cta_speeds_slow_the_launch_by_its_slowest_cta():
    """A measured per-CTA speed distribution is an input: one slow CTA of a persistent launch
    stretches it by about its slowness; a sample of another length is drawn from."""
    from wavefront.model.timed import Exposure, cta_speeds
    compute = ComputeTiming(540.0, 0.0, 0.0)
    launch = _paper_like(seqlen=8192)
    base = simulate_timed(launch, MEMORY, compute, l2_bytes=L2, partitions=1)
    speed = np.ones(48)
    speed[7] = 0.5
    slow = simulate_timed(launch, MEMORY, compute, l2_bytes=L2, partitions=1,
                          exposure=Exposure(cta_speed=tuple(speed)))
    assert 1.8 < slow.kernel_ns / base.kernel_ns < 2.1
    drawn = cta_speeds(Exposure(cta_speed=(0.9, 1.1), seed=3), 48)
    assert len(drawn) == 48 and set(np.unique(drawn)) <= {0.9, 1.1}
    with pytest.raises(ValueError, match="cta_speed"):
        cta_speeds(Exposure(cta_speed=(1.0, -1.0)), 4)


def test_fewer_loads_in_flight_expose_more_latency():
    """With one K/V step in flight a step waits for its loads; with three they hide behind
    compute (steps longer than the L2 latency)."""
    compute = ComputeTiming(540.0, 1100.0, 7000.0)
    launch = _paper_like(seqlen=8192)
    t = [simulate_timed(launch, MEMORY, compute, l2_bytes=L2, partitions=2,
                        loads_ahead=d).kernel_ns for d in (1, 2, 3)]
    assert t[0] > 1.1 * t[2] and abs(t[1] / t[2] - 1) < 0.01  # two steps already hide it


@pytest.mark.parametrize("corrupt, field", [
    (lambda d: d.pop("item_ns"), "item_ns"),
    (lambda d: d.update(step_ns=[]), "step_ns"),
    (lambda d: d["step_ns"][0].update(ns=0), "step_ns[0].ns"),
    (lambda d: d["step_ns"].append(dict(d["step_ns"][0])), "appears twice"),
    (lambda d: d["step_ns"][0].pop("tile_m"), "step_ns[0]"),
])
def test_a_malformed_calibration_is_refused_by_field(corrupt, field):
    """fits.json's calibrations are checked when read: each corruption names the file (here
    `where`) and the field."""
    cal = Calibration("H100", 7000.0, 1100.0, {(64, 64, 64, False, 1): 540.0,
                                               (64, 128, 64, False, 2): 1200.0},
                      "step_time", 5, {"median": 0.01, "max": 0.02})
    d = json.loads(json.dumps(cal.as_dict()))
    assert Calibration.from_dict(d).step_ns == cal.step_ns
    corrupt(d)
    with pytest.raises(ValueError, match="fits.json") as err:
        Calibration.from_dict(d, "fits.json: timed_model.calibrations['H100']")
    assert field in str(err.value)
    with pytest.raises(ValueError, match="mapping"):
        Calibration.from_dict([1, 2], "fits.json")


def test_the_timed_guard_is_sized_to_the_timed_model():
    """The paper's launch passes with an estimate in seconds; a launch past the step limit or
    the memory is refused by name before anything is allocated."""
    from wavefront.model.timed import check_timed, timed_cost
    paper = plan((8, 1, 131072, 64), (8, 1, 131072, 64), sms=48, l2_bytes=24 << 20,
                 schedule="persistent+linear", tiles="64x64", occupancy=1, ctas=48)
    need, steps = timed_cost(paper)
    assert steps == 8 * 2048 * 2048 and need < 2 << 30
    assert 0 < check_timed(paper) < 600
    huge = plan((8, 32, 262144, 64), (8, 32, 262144, 64), sms=132, l2_bytes=L2,
                schedule="persistent+linear", tiles="64x64")
    with pytest.raises(ValueError, match="K/V steps"):
        check_timed(huge)
    with pytest.raises(ValueError, match="GiB"):
        check_timed(paper, memory_bytes=1 << 20)


@pytest.mark.parametrize("schedule", ["persistent+linear", "grid+sawtooth", "persistent+tiled",
                                      "grouped+sawtooth"])
@pytest.mark.parametrize("seqlen_q,seqlen_kv,causal,alignment", [
    (1000, 1000, False, "top_left"), (1000, 1000, True, "top_left"),
    (300, 2100, True, "top_left"), (300, 2100, True, "bottom_right"),
    (2100, 300, True, "bottom_right"), (2100, 300, False, "top_left")])
def test_the_guard_counts_a_dense_launchs_steps_without_its_table(schedule, seqlen_q, seqlen_kv,
                                                                  causal, alignment):
    """The step count the guard refuses by (from the problem alone) is the work table's: a
    launch of 1.3e11 steps was refused only after building its table (30-60 s, gigabytes)."""
    from wavefront.model.simulation import item_steps
    from wavefront.model.timed import dense_steps
    launch = plan((3, 4, seqlen_q, 64), (3, 2, seqlen_kv, 64), sms=132, l2_bytes=L2,
                  causal=causal, schedule=schedule, tiles="64x64",
                  causal_alignment=alignment)
    assert dense_steps(launch) == int(item_steps(launch).sum()) > 0


def test_a_capacity_from_one_length_warns():
    import pandas as pd
    from wavefront.model.fits import fit_capacity
    rows = pd.DataFrame({"seqlen": [4096, 4096]})
    with pytest.warns(UserWarning, match="1 sequence length"):
        with pytest.raises(Exception):  # the toy rows hold no counters: only the warning counts
            fit_capacity(rows, "H100")


def test_the_no_cache_baseline_is_fitted_on_its_own():
    """Times made by the no-cache model itself are fitted back to its costs (the baseline is
    calibrated as carefully as the clock, not handed the clock's step times)."""
    from wavefront.model.timed import no_cache_ns
    from wavefront.report.timed import _fit_no_cache
    truth = ComputeTiming(step_ns=600.0, item_ns=1500.0, launch_ns=8000.0)
    launches = [_launch(seqlen=s, heads=h, ctas=c, sms=c, occupancy=1)
                for s, h, c in ((2048, 2, 3), (4096, 1, 5), (2048, 4, 7), (8192, 1, 4))]
    measured = [no_cache_ns(l, truth) for l in launches]
    fit = _fit_no_cache(launches, measured, "H100")
    assert fit.errors["max"] < 1e-6
    assert fit.compute(launches[0]).step_ns == pytest.approx(600.0, rel=1e-6)


def test_regime_skill_helpers_parse_corunners_and_check_sign_and_size():
    """The regimes' co-runners become Exposures at their counted rate (allocating in the L2
    only where a PTX policy does, untrusted counts skipped), and the sign/size check flags a
    prediction of the wrong sign or beyond max(2 points, half the measured change)."""
    import importlib.util

    import pandas as pd

    from wavefront.report.timed import _corunner_exposure
    rates = pd.DataFrame({"GPU": ["H100"] * 3, "mask": ["non-causal"] * 3,
                          "environment": ["append st.wb", "copy ld.cs st.cs", "read ld.ca"],
                          "trusted": [True, True, False], "co-runner GB/s": [2900.0, 3000.0,
                                                                             7000.0]})
    wb = _corunner_exposure(rates, "H100", "non-causal", "append st.wb")
    assert wb.corunner_dram_bytes_per_s == 2.9e12 and wb.corunner_l2_fraction == 1.0
    assert _corunner_exposure(rates, "H100", "non-causal", "copy ld.cs st.cs") \
        .corunner_l2_fraction == 0.0
    assert _corunner_exposure(rates, "H100", "non-causal", "read ld.ca") is None
    assert _corunner_exposure(rates, "H200", "non-causal", "append st.wb") is None
    path = Path(__file__).resolve().parents[1] / "experiments" / "timed_model.py"
    spec = importlib.util.spec_from_file_location("timed_model_experiment", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    rows = pd.DataFrame({"measured": [0.18, -0.05, 0.001, 0.10],
                         "lo": [0.17, -0.07, -0.01, 0.05], "hi": [0.19, -0.03, 0.01, 0.15],
                         "predicted": [0.23, 0.0, 0.5, 0.16]})
    checked = module.sign_size_check(rows)
    assert len(checked) == 3  # the third interval contains no change
    assert checked["right sign"].tolist() == [True, False, True]
    assert checked["within size"].tolist() == [True, False, False]


def test_the_measurement_ceiling_follows_spearman_brown():
    """A perfect predictor's largest correlation with a measurement whose halves correlate at
    r: sqrt(2r / (1 + r)); none where the halves do not agree at all."""
    from wavefront.report.timed import _ceiling
    assert abs(_ceiling(0.5) - (2 * 0.5 / 1.5) ** 0.5) < 1e-12
    assert _ceiling(1.0) == 1.0
    assert _ceiling(0.0) == 0.0 and _ceiling(-0.3) == 0.0
    assert _ceiling(0.21) < _ceiling(0.33) < _ceiling(0.65)


# ---------------------------------------------------------------------------------------------
# The K and V rings apart (issue 54's coupling): phases A (QK^T + softmax) and B (P.V)
# ---------------------------------------------------------------------------------------------

WIDE = MemoryTiming(l2_ns=150.0, far_ns=150.0, dram_ns=400.0, dram_bytes_per_s=1e18)


def _one_item(kv_tiles):
    """One CTA, one Q tile, `kv_tiles` K/V steps (64x64 tiles, D64)."""
    return plan((1, 1, 64, 64), (1, 1, 64 * kv_tiles, 64), sms=1, l2_bytes=L2,
                schedule="persistent+linear", tiles="64x64", ctas=1, occupancy=1)


def test_one_stage_rings_hide_a_miss_behind_the_other_phase():
    """With one K and one V stage, K_{t+1} loads during step t's P.V and V_{t+1} during the
    next QK^T: a 400 ns miss hides behind 1000 ns phases, where the joint one-step ring
    (K and V issued when the step ends) pays it every step. A phase shorter than the miss
    exposes the difference, step by step."""
    steps, step_ns = 20, 2000.0
    compute = ComputeTiming(step_ns, 0.0, 0.0)
    joint = simulate_timed(_one_item(steps), WIDE, compute, l2_bytes=L2, partitions=1,
                           loads_ahead=1)
    split = simulate_timed(_one_item(steps), WIDE, compute, l2_bytes=L2, partitions=1,
                           kv_stages=(1, 1), phase_a_fraction=0.5)
    assert joint.kernel_ns == pytest.approx(steps * (step_ns + 400.0), rel=1e-6)
    assert split.kernel_ns == pytest.approx(400.0 + steps * step_ns, rel=1e-6)
    # phase B of 200 ns leaves 200 ns of each later K's miss exposed
    short_b = simulate_timed(_one_item(steps), WIDE, compute, l2_bytes=L2, partitions=1,
                             kv_stages=(1, 1), phase_a_fraction=0.9)
    assert short_b.kernel_ns == pytest.approx(400.0 + steps * step_ns + (steps - 1) * 200.0,
                                              rel=1e-6)
    assert split.dram_read_bytes == joint.dram_read_bytes  # the same bytes, as two lines


def test_the_producer_issues_in_program_order():
    """One producer warp issues K_0, V_0, K_1, ... in order: K stages beyond the V ring's
    plus one change nothing (K_{t+2} waits behind V_{t+1}, and the one V stage sets the pace
    either way), so four behave as two; a second K stage does help where phase B is too short
    to hide K's miss (200 ns of 400 per step)."""
    compute = ComputeTiming(2000.0, 0.0, 0.0)

    def run(stages):
        return simulate_timed(_one_item(20), WIDE, compute, l2_bytes=L2, partitions=1,
                              kv_stages=stages, phase_a_fraction=0.9).kernel_ns
    assert run((4, 1)) == run((2, 1))
    assert run((2, 1)) < run((1, 1)) - 19 * 150.0


def test_k_and_v_are_two_lines_of_the_lru():
    """Two CTAs reading one head in lock-step (a DRAM without a queue): each K/V load of the
    second reader waits on the first one's fill, once per line: per step once when K and V
    are one line, twice when they are two. Every tile still comes from DRAM once."""
    launch = _launch(seqlen=128 * 64, ctas=2, sms=2, occupancy=1)
    compute = ComputeTiming(100.0, 0.0, 0.0)
    joint = simulate_timed(launch, WIDE, compute, l2_bytes=L2, partitions=1, loads_ahead=1)
    split = simulate_timed(launch, WIDE, compute, l2_bytes=L2, partitions=1, kv_stages=(1, 1))
    kv_tiles = launch.problem.kv_tiles
    assert joint.fill_waits == kv_tiles and split.fill_waits == 2 * kv_tiles
    assert split.dram_read_bytes == joint.dram_read_bytes == (2 * 128 * 64 * 64 * 2
                                                              + 128 * 64 * 64 * 2)


def test_an_explicit_depth_runs_the_joint_pipeline_as_before():
    """`loads_ahead` keeps the joint pipeline: these numbers are what the model gave before
    the rings were split (commit afd237e, identical here to the last digit; compared to 1e-9
    so that another CPU's rounding does not fail it), for a two-partition dynamic causal
    launch at two depths."""
    launch = _launch(seqlen=16384, causal=True, schedule="dynamic+linear", ctas=8, sms=8,
                     occupancy=1)
    before = {1: (1926835.4826666694, 6291456.0, 532742144.0, 2031616.0, 1764),
              3: (1249722.8800000013, 6291456.0, 532758528.0, 2015232.0, 1764)}
    for depth, expected in before.items():
        p = simulate_timed(launch, MEMORY, ComputeTiming(300.0, 100.0, 0.0), l2_bytes=L2,
                           partitions=2, loads_ahead=depth)
        got = (p.kernel_ns, p.dram_read_bytes, p.near_hit_bytes, p.far_hit_bytes)
        assert got == pytest.approx(expected[:4], rel=1e-9) and p.fill_waits == expected[4]


def test_a_read_binary_runs_its_rings_and_an_unread_one_the_assumed_depth():
    """Without a pipeline argument the launch's binary decides: its K and V rings where its
    SASS was read (the paper launch's D64 64x64 binary: 6 and 3), a joint two otherwise."""
    from wavefront.model.pipeline import kv_stages_of
    compute = ComputeTiming(540.0, 1100.0, 7000.0)
    read = _paper_like(seqlen=8192)
    assert kv_stages_of(read)[0] == (6, 3)
    default = simulate_timed(read, MEMORY, compute, l2_bytes=L2, partitions=2)
    rings = simulate_timed(read, MEMORY, compute, l2_bytes=L2, partitions=2, kv_stages=(6, 3))
    assert default.kernel_ns == rings.kernel_ns and default.fill_waits == rings.fill_waits
    unread = _launch(seqlen=8192, occupancy=4)
    assert kv_stages_of(unread)[0] is None
    assert (simulate_timed(unread, MEMORY, compute, l2_bytes=L2).kernel_ns
            == simulate_timed(unread, MEMORY, compute, l2_bytes=L2, loads_ahead=2).kernel_ns)


def test_bad_pipeline_arguments_name_themselves():
    launch = _launch()
    compute = ComputeTiming(1, 1, 1)
    with pytest.raises(ValueError, match="not both"):
        simulate_timed(launch, MEMORY, compute, l2_bytes=L2, loads_ahead=2, kv_stages=(2, 2))
    with pytest.raises(ValueError, match="kv_stages"):
        simulate_timed(launch, MEMORY, compute, l2_bytes=L2, kv_stages=(0, 2))
    with pytest.raises(ValueError, match="phase_a_fraction"):
        simulate_timed(launch, MEMORY, compute, l2_bytes=L2, kv_stages=(1, 1),
                       phase_a_fraction=1.5)
