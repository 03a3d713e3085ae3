"""Measured orders (tickets -> traces, the drift model), the throughput model's terms, the
presets' sources: properties that can fail, on synthetic inputs with known answers."""
import numpy as np
import pandas as pd
import pytest

from wavefront.model.fits import fit_throughput, roofline_s
from wavefront.model.presets import PRESETS
from wavefront.model.simulation import (
    DriftModel,
    access_trace,
    order_lag,
    simulate_l2,
    timed_trace,
)
from wavefront.point import GpuShape, Point, plan
from wavefront.results.orders import load_order, save_order
from wavefront.results.sweep import expand, parse_spec


def _launch(causal=False, schedule="persistent+linear"):
    return plan((2, 4, 4096, 64), (2, 4, 4096, 64), causal=causal, schedule=schedule,
                tiles="64x64", sms=12, l2_bytes=4 << 20)


@pytest.mark.parametrize("schedule", ["persistent+linear", "persistent+sawtooth"])
def test_a_drift_free_order_reproduces_lock_step(schedule):
    launch = _launch(schedule=schedule)
    start, end = DriftModel(0.0, 0.0).item_times(launch)
    timed = timed_trace(launch, start, end)
    lock = access_trace(launch)
    assert sorted(timed.address.tolist()) == sorted(lock.address.tolist())
    for capacity in (256 << 10, 1 << 20):
        a = simulate_l2(timed, capacity).dram_read_sectors
        b = simulate_l2(lock, capacity).dram_read_sectors
        assert abs(a - b) <= 0.01 * b


def test_tickets_are_a_clock_and_drift_is_recovered_from_order_alone():
    """Ranks of the events (what tickets are) keep the order in which items start and end
    (K/V steps in between are interpolated, in rank instead of time), and the fit tells a
    drifting launch from a lock-step one from the order alone."""
    launch = _launch()
    start, end = DriftModel(0.08, 0.0).item_times(launch, seed=3)
    events = np.concatenate([start, end])
    rank = np.empty(len(events), np.int64)
    rank[np.argsort(events, kind="stable")] = np.arange(len(events))
    by_rank = timed_trace(launch, rank[:len(start)], rank[len(start):])
    by_time = timed_trace(launch, start, end)
    for kind in (2, 3):  # Q reads (item starts) and O writes (item ends), in order
        assert (by_rank.address[by_rank.kind == kind]
                == by_time.address[by_time.kind == kind]).all()
    assert sorted(by_rank.address.tolist()) == sorted(by_time.address.tolist())
    lock = DriftModel(0.0, 0.0).item_times(launch)
    assert order_lag(launch, lock[0]).max() < order_lag(launch, start).max()
    fitted = DriftModel.fit(launch, [(rank[:len(start)], rank[len(start):])])
    still = DriftModel.fit(launch, [lock])
    assert fitted.rate_spread > still.rate_spread


def test_timed_trace_rejects_bad_times():
    launch = _launch()
    with pytest.raises(ValueError, match="one time per work item"):
        timed_trace(launch, [0.0], [1.0])
    start = np.zeros(launch.num_items)
    with pytest.raises(ValueError, match="end no earlier"):
        timed_trace(launch, start + 1, start)


def test_orders_round_trip_and_refuse_another_point(tmp_path):
    save_order(tmp_path, "p=1", 2, [0, 2], [1, 3])
    start, end = load_order(tmp_path, "p=1", 2)
    assert start.tolist() == [0, 2] and end.tolist() == [1, 3]
    assert load_order(tmp_path, "p=2", 2) is None
    # a file renamed onto another point's name is caught by the key stored inside
    from wavefront.results.orders import order_path
    order_path(tmp_path, "p=1", 2).rename(order_path(tmp_path, "p=3", 0))
    with pytest.raises(ValueError, match="holds the order of p=1"):
        load_order(tmp_path, "p=3", 0)


def test_record_order_travels_from_spec_to_tasks_and_needs_a_directory():
    from wavefront.measure.runner import SubprocessRunner
    base = ('name = "x"\nmeasure = ["counters"]\n{}\n[grid]\nseqlen = [1024]\n'
            'head_dim = [64]\nschedule = ["persistent+linear"]\n')
    spec = parse_spec(base.format("record_order = true"))
    tasks = expand(spec, gpu="H100", sms=132, l2_bytes=50 << 20)
    assert all(t["record_order"] for t in tasks)
    plain = expand(parse_spec(base.format("")), gpu="H100", sms=132, l2_bytes=50 << 20)
    assert not any("record_order" in t for t in plain)
    per_cta = expand(parse_spec(base.format('record_order = "per_cta"')), gpu="H100", sms=132,
                     l2_bytes=50 << 20)
    assert all(t["record_order"] == "per_cta" for t in per_cta)
    with pytest.raises(ValueError, match="record_order must be true, false or one of"):
        parse_spec(base.format('record_order = "yes"'))
    free = expand(parse_spec(base.format("free_shapes = true")), gpu="H100", sms=132,
                  l2_bytes=50 << 20)
    assert all(t["free_shapes"] is True for t in free)
    with pytest.raises(ValueError, match="free_shapes must be true or false"):
        parse_spec(base.format('free_shapes = "yes"'))
    with pytest.raises(ValueError, match="free_shapes applies to counter runs only"):
        parse_spec(base.format("free_shapes = true").replace('"counters"', '"timing"'))
    with pytest.raises(ValueError, match="order_dir"):
        SubprocessRunner()._run_counters(tasks, spec, lambda *a: None, None)


def _synthetic_rows(rate_f, rate_d, gamma, rng, heads=(1, 4, 16, 64, 256)):
    """Timed rows from a known model: heads sweep occupancy (few items) and DRAM traffic."""
    rows = []
    for h in heads:
        for s in (4096, 16384):
            point = Point(batch=1, heads=h, seqlen=s, head_dim=64, tiles="64x64",
                          schedule="persistent+linear")
            rec = point.to_record(GpuShape(132, 50 << 20), "synthetic")
            launch = point.launch(GpuShape(132, 50 << 20))
            flops = 4 * 64 * s * s * h
            dram = 2.0 * s * 64 * 2 * h * (s / 64) * (1.0 if h >= 64 else 0.01)
            occ = min(1.0, launch.num_items / launch.resident_ctas)
            t = float(roofline_s(flops, dram, rate_f * occ ** gamma, rate_d)) + 5e-6
            rows.append({**rec, "executed_flops": flops, "dram_read_bytes": dram,
                         "dram_write_bytes": 0.0, "median_ms": t * 1e3 * rng.normal(1, 0.01)})
    return pd.DataFrame(rows)



def test_throughput_fit_identifies_the_dram_term_only_where_it_binds():
    rng = np.random.default_rng(0)
    rows = _synthetic_rows(400e12, 2.5e12, 0.5, rng)
    fit = fit_throughput(rows, "synthetic", bootstrap=50)
    assert fit.dram_bound_points > 0
    assert fit.dram_rate == pytest.approx(2.5e12, rel=0.05)
    lo, hi = fit.intervals["dram_rate"]
    assert lo <= 2.5e12 <= hi and hi / lo < 1.3
    assert fit.occupancy_exponent == pytest.approx(0.5, abs=0.1)
    compute_only = _synthetic_rows(400e12, 2.5e12, 0.5, rng, heads=(1, 4, 16))
    blind = fit_throughput(compute_only, "synthetic", bootstrap=50)
    assert blind.dram_bound_points == 0
    assert blind.intervals["dram_rate"][1] > 3 * blind.intervals["dram_rate"][0]


def test_every_preset_names_a_source_for_every_field():
    fields = {"sms", "l2_bytes", "l2_partitions", "dram_bytes_per_s", "peak_bf16_flops",
              "l2_latency_ns", "dram_latency_ns", "dram_read_bytes_per_s"}
    for key, gpu in PRESETS.items():
        named = dict(gpu.sources)
        assert set(named) == fields, key
        assert all(text.strip() for text in named.values())


def test_the_median_interval_covers_the_median_about_95_percent_of_the_time():
    from wavefront.measure.rounds import median_ci95
    rng = np.random.default_rng(5)
    for n in (6, 15, 40):
        hits = 0
        for _ in range(2000):
            lo, hi = median_ci95(rng.normal(0.0, 1.0, n))
            hits += lo <= 0.0 <= hi
        assert hits / 2000 >= 0.93, n
    lo, hi = median_ci95([5.0, 1.0, 3.0, 2.0, 4.0, 6.0, 7.0])
    assert lo <= 4.0 <= hi
    with pytest.raises(ValueError, match="at least 6 rounds"):
        median_ci95([1.0, 2.0])
