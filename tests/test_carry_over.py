"""The measured carry-over on the CPU: which configurations a shape without an entry of its own
chooses from, when it times them, that its choice is kept and forgotten with the cache, and the
answers to a bad setting. The timing itself runs in the GPU tests."""
import json
from types import SimpleNamespace

import pytest

from wavefront.kernel.tuning import (CARRY_OVER_VARIABLE, carry_over_configs, carry_over_mode,
                                     tuned_config)

BASE = {"schedule": "persistent+linear", "tiles": "128x128", "occupancy": 2, "worker_warps": 8,
        "cluster": 1, "kv_latency": 0, "rescale_threshold": 0, "exp2_poly": 0, "qk_ahead": 0}
OTHER = {**BASE, "schedule": "grouped_dynamic+linear", "cluster": 2, "worker_warps": None}


def _table(tmp_path):
    path = tmp_path / "tuned.json"
    path.write_text(json.dumps({"G": {
        "d64_full": {**OTHER, "shape": "B=1 H=32 KV=32 S=8192 bfloat16"},
        "d64_full_b8_h16_kv16_s2048": {**BASE, "shape": "B=8 H=16 KV=16 S=2048 bfloat16"},
        "d64_full_b1_h32_kv32_s65536": {**OTHER, "shape": "B=1 H=32 KV=32 S=65536 bfloat16"},
        "d64_causal": {**BASE, "shape": "B=1 H=32 KV=32 S=8192 bfloat16"}}}))
    return path


def test_the_candidates_are_the_entries_distinct_configurations_nearest_first(tmp_path):
    path = _table(tmp_path)
    near_s2k = (8, 16, 1024, 64)  # 1 octave from the S2k entry, more from the others
    exact, configs = carry_over_configs("G", near_s2k, near_s2k, False, path)
    assert not exact
    assert configs == [BASE, OTHER]  # the S8k and S64k entries share one configuration
    assert configs[0] == tuned_config("G", near_s2k, near_s2k, False, path)  # nearest first
    s8k = (1, 32, 8192, 64)
    exact, configs = carry_over_configs("G", s8k, s8k, False, path)
    assert exact and configs == [OTHER, BASE]
    as_many_rows = (4, 8, 8192, 64)  # distance 0 from B1 H32 S8k, not its shape
    exact, configs = carry_over_configs("G", as_many_rows, as_many_rows, False, path)
    assert not exact and configs == [OTHER, BASE]
    # the mask and the head dim select the entries; none: nothing to choose from
    assert carry_over_configs("G", s8k, s8k, True, path) == (True, [BASE])
    assert carry_over_configs("G", (1, 32, 8192, 128), (1, 32, 8192, 128), False,
                              path) == (False, [])
    assert carry_over_configs("other GPU", s8k, s8k, False, path) == (False, [])


def test_the_carry_over_mode_is_read_from_the_environment(monkeypatch):
    monkeypatch.delenv(CARRY_OVER_VARIABLE, raising=False)
    assert carry_over_mode() == "nearest"
    monkeypatch.setenv(CARRY_OVER_VARIABLE, " Measure ")
    assert carry_over_mode() == "measure"
    monkeypatch.setenv(CARRY_OVER_VARIABLE, "fastest")
    with pytest.raises(ValueError, match=rf"{CARRY_OVER_VARIABLE} must be one of nearest, "
                                         r"measure, got 'fastest'"):
        carry_over_mode()


def test_the_fastest_median_wins_and_a_tie_keeps_the_nearer_entry():
    from wavefront.kernel.carry_over import CarryOverChoice, fastest
    assert fastest([("a", 0.30, (0.29, 0.31)), ("b", 0.28, (0.27, 0.33))]) == 1
    assert fastest([("a", 0.30, (0.29, 0.31)), ("b", 0.30, (0.28, 0.30))]) == 0
    choice = CarryOverChoice(BASE, ((BASE, 0.28, (0.27, 0.33)),), ((OTHER, "differs"),), 2.5)
    assert choice.as_dict() == {
        "config": BASE, "timed": [{"config": BASE, "ms": 0.28, "range_ms": [0.27, 0.33]}],
        "left_out": [{"config": OTHER, "why": "differs"}], "seconds": 2.5}


@pytest.fixture
def launcher_on_fake_gpu(monkeypatch, tmp_path):
    """The configuration choice (`kernel.tuning`) with a GPU named after the committed table's
    H100 and that table."""
    pytest.importorskip("wavefront.kernel.call")
    import wavefront.kernel.tuning as tuning
    gpu = SimpleNamespace(name="NVIDIA H100 80GB HBM3", sms=132, l2_bytes=50 << 20)
    monkeypatch.setattr(tuning, "current_device", lambda: gpu)
    clear_cache()
    yield tuning, tuning, gpu
    clear_cache()


def clear_cache():
    """The public call's cache cleared (and with it the measured carry-overs)."""
    from wavefront.kernel.call import clear_launcher_cache
    clear_launcher_cache()


def _resolve(L, shape, causal, measure):
    return L.resolve_config(shape, shape, causal, None, None, None,
                            dict.fromkeys(L.KERNEL_LEVERS), measure)


def test_a_shape_without_its_own_entry_is_timed_once_and_keeps_its_choice(
        launcher_on_fake_gpu, monkeypatch):
    """B1 H32 S4k D64 non-causal sits between the H100's two D=64 non-causal entries
    (data/untuned_shapes/tie_s4k/): "nearest" takes the first by name; "measure" hands both
    configurations to the timing once and keeps what it chose, for any later launcher of the
    problem; the cache's clearing forgets it."""
    from wavefront.kernel.carry_over import CarryOverChoice
    L, tuning, gpu = launcher_on_fake_gpu
    shape = (1, 32, 4096, 64)
    timed = []

    def measure(configs):
        timed.append(configs)
        return CarryOverChoice(configs[-1], tuple((c, 1.0, (1.0, 1.0)) for c in configs))
    monkeypatch.setenv(CARRY_OVER_VARIABLE, "nearest")
    nearest = _resolve(L, shape, False, measure)
    assert timed == [] and nearest == tuned_config(gpu.name, shape, shape, False)
    monkeypatch.setenv(CARRY_OVER_VARIABLE, "measure")
    chosen = _resolve(L, shape, False, measure)
    _, configs = carry_over_configs(gpu.name, shape, shape, False)
    assert len(configs) >= 2 and timed == [configs] and chosen == configs[-1] != nearest
    assert _resolve(L, shape, False, measure) == chosen and len(timed) == 1
    assert _resolve(L, shape, False, None) == chosen  # a later launcher, nothing to time with
    key = (gpu.name, shape, shape, False)
    assert L.carry_over_choices()[key].config == chosen
    clear_cache()
    assert L.carry_over_choices() == {}


def test_nothing_is_timed_where_there_is_nothing_to_choose(launcher_on_fake_gpu, monkeypatch):
    """An entry tuned at the very shape, a caller's own choice, or a timing that could not run
    (a stream under capture: `measure` answers None) take the table's or the caller's way, and
    a None is not kept."""
    L, tuning, gpu = launcher_on_fake_gpu
    monkeypatch.setenv(CARRY_OVER_VARIABLE, "measure")
    calls = []

    def measure(configs):
        calls.append(configs)
        return None
    tuned_shape = (1, 32, 8192, 64)  # the H100's d64_full entry
    assert _resolve(L, tuned_shape, False, measure) == tuned_config(
        gpu.name, tuned_shape, tuned_shape, False)
    assert calls == []
    shape = (1, 32, 4096, 64)
    own = L.resolve_config(shape, shape, False, "persistent+sawtooth", None, None,
                           dict.fromkeys(L.KERNEL_LEVERS), measure)
    assert own["schedule"] == "persistent+sawtooth" and calls == []
    assert _resolve(L, shape, False, measure) == tuned_config(gpu.name, shape, shape, False)
    assert len(calls) == 1 and L.carry_over_choices() == {}
    _resolve(L, shape, False, measure)
    assert len(calls) == 2  # not kept: tried again on the next launcher's first call


def test_a_causal_launch_of_one_wave_times_the_entries_as_one_wave_runs_them(
        launcher_on_fake_gpu, monkeypatch):
    """When the causal items fit one wave every entry's configuration takes ONE_WAVE_CAUSAL's
    64-row tiles (a measured rule): the candidates are the entries so fitted, and only what
    still differs (the H100's two D=64 causal entries: their K/V latency hints) is timed."""
    L, tuning, gpu = launcher_on_fake_gpu
    monkeypatch.setenv(CARRY_OVER_VARIABLE, "measure")
    small = (1, 8, 1024, 64)
    calls = []
    _resolve(L, small, True, lambda configs: calls.append(configs))
    (configs,) = calls
    assert all(c.items() >= L.ONE_WAVE_CAUSAL.items() for c in configs)
    assert len(configs) == len({json.dumps(c, sort_keys=True) for c in configs}) >= 2


def test_a_bench_under_measure_times_the_choice_beside_what_nearest_takes(
        launcher_on_fake_gpu, monkeypatch):
    """`wavefront bench --carry-over measure`: the choice is made before the rounds (here stood
    in for), the api's bound launcher is the chosen configuration and the configuration
    "nearest" would have taken is a contender too; the api row's record names it."""
    import wavefront.measure.bench as bench
    from wavefront.kernel.carry_over import CarryOverChoice
    from wavefront.measure.rounds import bench_shapes, carry_over_record, contender_name
    from wavefront.point import Point
    L, tuning, gpu = launcher_on_fake_gpu
    monkeypatch.setenv(CARRY_OVER_VARIABLE, "measure")
    shape = Point(schedule="persistent+linear", batch=1, heads=32, seqlen=4096, head_dim=64)
    q = (1, 32, 4096, 64)
    _, configs = carry_over_configs(gpu.name, q, q, False)
    made = []

    def measure(*arrays, causal):
        made.append((arrays, causal))
        choice = CarryOverChoice(configs[1], tuple((c, 1.0, (1.0, 1.0)) for c in configs))
        L._carry_over_choices[(gpu.name, q, q, causal)] = choice
        return choice
    monkeypatch.setattr(bench, "random_inputs", lambda point, seed: ("q", "k", "v"))
    from wavefront.kernel import call
    monkeypatch.setattr(call, "measure_carry_over", measure)
    shapes, bound_of_api = bench_shapes([shape], gpu.name, tuned=False, api=True,
                                        log=lambda m: None)
    (members,) = shapes.values()
    names = [contender_name(p, members[0]) for p in members]
    nearest = shape.replace(**L.nearest_config(q, q, False))
    chosen = shape.replace(**configs[1])
    assert made == [(("q", "k", "v"), False)]
    assert bound_of_api[shape] == contender_name(chosen, members[0]) in names
    assert contender_name(nearest, members[0]) in names and nearest != chosen
    record = carry_over_record(gpu.name, shape, members)
    assert record["nearest"] == contender_name(nearest, members[0])
    assert record["config"] == configs[1] and len(record["timed"]) == len(configs)


def test_a_stored_choice_is_read_back_for_its_problem_and_table_only(tmp_path):
    """The choices file keeps each problem's choice beside the others; a choice is read back
    only for the same GPU, shapes, mask and version of the tuned table, and only while its
    configuration is still a candidate; a file that is not one names the variable."""
    from wavefront.kernel.carry_over import (CARRY_OVER_FILE_VARIABLE, CarryOverChoice,
                                             store_choice, stored_choice)
    path = tmp_path / "deep" / "choices.json"
    q = (1, 32, 4096, 64)
    choice = CarryOverChoice(OTHER, ((BASE, 0.31, (0.30, 0.32)), (OTHER, 0.30, (0.29, 0.31))),
                             ((BASE, "differs"),), 3.5)
    assert stored_choice(path, "G", q, q, False, "t1", [BASE, OTHER]) is None  # no file yet
    store_choice(path, "G", q, q, False, "t1", choice)
    store_choice(path, "G", q, q, True, "t1", CarryOverChoice(BASE, ((BASE, 0.2, (0.2, 0.2)),)))
    assert stored_choice(path, "G", q, q, False, "t1", [BASE, OTHER]) == choice
    assert stored_choice(path, "G", q, q, True, "t1", [BASE, OTHER]).config == BASE
    assert stored_choice(path, "G", q, q, False, "t2", [BASE, OTHER]) is None  # another table
    assert stored_choice(path, "H", q, q, False, "t1", [BASE, OTHER]) is None  # another GPU
    assert stored_choice(path, "G", q, q, False, "t1", [BASE]) is None  # no longer a candidate
    assert [p.name for p in path.parent.iterdir()] == ["choices.json"]  # no temporary left
    path.write_text("[1, 2]")
    with pytest.raises(ValueError, match=f"{CARRY_OVER_FILE_VARIABLE}=.*expected a JSON object"):
        stored_choice(path, "G", q, q, False, "t1", [BASE])


def test_a_later_process_takes_the_stored_choice_without_timing(
        launcher_on_fake_gpu, monkeypatch, tmp_path):
    """With WAVEFRONT_CARRY_OVER_FILE set, the first timing is stored; once the process's
    choices are forgotten (a new process), the problem's first launcher reads it back and
    times nothing."""
    from wavefront.kernel.carry_over import CARRY_OVER_FILE_VARIABLE, CarryOverChoice
    L, tuning, gpu = launcher_on_fake_gpu
    path = tmp_path / "choices.json"
    monkeypatch.setenv(CARRY_OVER_VARIABLE, "measure")
    monkeypatch.setenv(CARRY_OVER_FILE_VARIABLE, str(path))
    shape = (1, 32, 4096, 64)

    def measure(configs):
        return CarryOverChoice(configs[-1], tuple((c, 1.0, (1.0, 1.0)) for c in configs))
    chosen = _resolve(L, shape, False, measure)
    assert path.exists() and len(json.loads(path.read_text())) == 1
    clear_cache()

    def must_not_time(configs):
        raise AssertionError("timed again")
    assert _resolve(L, shape, False, must_not_time) == chosen
    assert L.carry_over_choices()[(gpu.name, shape, shape, False)].config == chosen
