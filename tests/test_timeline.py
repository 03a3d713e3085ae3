"""PM-sampling timelines: the ncu command, the launch description's checks, and reading the
sampled series from a report (through a stand-in for NVIDIA's `ncu_report`)."""
import types

import pytest

from wavefront.measure import timeline


class _Metric:
    def __init__(self, values, stamps=None):
        self.values, self.stamps = values, stamps

    def num_instances(self):
        return len(self.values)

    def as_double(self, i=None):
        return self.values[0 if i is None else i]

    def has_correlation_ids(self):
        return self.stamps is not None

    def correlation_ids(self):
        return _Metric(self.stamps)


class _Action:
    def __init__(self, metrics):
        self.metrics = metrics

    def metric_names(self):
        return list(self.metrics)

    def metric_by_name(self, name):
        return self.metrics.get(name)


def _fake_module(actions):
    rng = types.SimpleNamespace(num_actions=lambda: len(actions),
                                action_by_idx=lambda i: actions[i])
    ctx = types.SimpleNamespace(num_ranges=lambda: 1, range_by_idx=lambda r: rng)
    return types.SimpleNamespace(load_report=lambda path: ctx)


def test_ncu_command_samples_one_launch_from_a_cold_l2():
    cmd = timeline.ncu_command("ncu", "r.ncu-rep", ["dram__bytes_read.sum"])
    assert cmd[cmd.index("--launch-count") + 1] == "1"
    assert cmd[cmd.index("--cache-control") + 1] == "all"
    assert [cmd[i + 1] for i, a in enumerate(cmd) if a == "--section"] == list(timeline.SECTIONS)
    metrics = cmd[cmd.index("--metrics") + 1].split(",")
    assert "pmsampling:dram__bytes_read.sum" in metrics and "dram__bytes_read.sum" in metrics
    # the program launched is the version-neutral one, whatever package it finds
    assert cmd[-1] == timeline.LAUNCH_PROGRAM and "wavefront.attention" in cmd[-1]


def test_read_series_keeps_sampled_series_with_their_timestamps(monkeypatch):
    action = _Action({
        "pmsampling:dram__throughput.avg.pct_of_peak_sustained_elapsed":
            _Metric([1.0, 5.0, 2.0], [100.0, 200.0, 300.0]),
        "pmsampling:sm__warps_active.avg": _Metric([7.0, 8.0]),
        "pmsampling:empty": _Metric([]),
        "dram__bytes_read.sum": _Metric([4.5e9]),
        "unrelated__metric.sum": _Metric([1.0]),
    })
    monkeypatch.setattr(timeline, "find_ncu_report", lambda ncu: _fake_module([action]))
    series, totals = timeline.read_series("r.ncu-rep", "ncu")
    dram = series["pmsampling:dram__throughput.avg.pct_of_peak_sustained_elapsed"]
    assert dram == {"values": [1.0, 5.0, 2.0], "t": [100.0, 200.0, 300.0]}
    assert series["pmsampling:sm__warps_active.avg"]["t"] is None
    assert "pmsampling:empty" not in series
    assert totals == {"dram__bytes_read.sum": 4.5e9}


def test_read_series_refuses_a_report_of_several_kernels(monkeypatch):
    monkeypatch.setattr(timeline, "find_ncu_report",
                        lambda ncu: _fake_module([_Action({}), _Action({})]))
    with pytest.raises(RuntimeError, match="2 kernels profiled, expected 1"):
        timeline.read_series("r.ncu-rep", "ncu")


@pytest.mark.parametrize("kwargs, message", [
    ({"seqlen": 0}, "seqlen must be a positive integer"),
    ({"heads": 6, "kv_heads": 4}, r"heads \(6\) must be a multiple of kv_heads \(4\)"),
    ({"schedule": "persistent"}, "schedule must be '<cta>\\+<kv>'"),
])
def test_a_bad_launch_names_its_argument(kwargs, message):
    with pytest.raises(ValueError, match=message):
        timeline.TimelineLaunch(label="x", **kwargs)
