"""The CLI through click's test runner (CPU only): one grammar, --json everywhere."""
import json
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from wavefront.cli import main
from wavefront.device import has_gpu
from wavefront.point import Point
from wavefront.results.store import manifest_path, read_results_bytes, results_path

ROOT = Path(__file__).parent.parent
no_gpu = pytest.mark.skipif(has_gpu(), reason="checks the CPU-only messages")


@no_gpu
def test_info_on_cpu_only_machine():
    result = CliRunner().invoke(main, ["info"])
    assert result.exit_code == 0
    assert "GPU: none visible" in result.output
    data = json.loads(CliRunner().invoke(main, ["info", "--json"]).output)
    assert data["gpu"] is None


@pytest.mark.compile
def test_compile_one_variant_keeps_its_cubin(tmp_path):
    pytest.importorskip("cuda.tile")
    result = CliRunner().invoke(main, ["compile", "--filter",
                                       "d64_128x64_causal_static", "-j", "1",
                                       "--out", str(tmp_path), "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.output[result.output.index("{"):])
    rows = data["variants"]
    # the static binary, its packed variable-length twin and its partial-state writers (fp32,
    # bf16)
    assert len(rows) == 4
    row = rows[0]
    assert row["registers"] and row["error"] is None
    assert Path(row["cubin"]).exists() and Path(row["cubin"]).read_bytes()[:4] == b"\x7fELF"


def test_compile_list_and_filter():
    pytest.importorskip("cuda.tile")
    result = CliRunner().invoke(main, ["compile", "--list", "--filter", "dynamic"])
    assert result.exit_code == 0 and result.output.strip()
    assert all("dynamic" in line for line in result.output.splitlines())
    result = CliRunner().invoke(main, ["compile", "--filter", "no-such-variant"])
    assert result.exit_code == 2 and "--filter" in result.output


@no_gpu
@pytest.mark.parametrize("cmd", [["run"], ["bench", "--no-peers"], ["profile"],
                                 ["sweep", str(ROOT / "experiments" / "knee.py"), "--out", "x"]])
def test_measuring_commands_explain_missing_gpu(cmd):
    result = CliRunner().invoke(main, cmd)
    assert result.exit_code == 1
    assert "no CUDA GPU is visible" in result.output


@pytest.mark.parametrize("args,hint", [
    (["bench", "--schedule", "persistent+diagonal"], "not a schedule"),
    (["bench", "--seqlen", "0"], "seqlen must be a positive integer"),
    (["run", "--tile", "32x32"], "tiles"),
    (["run", "--head-dim", "96"], "head_dim must be one of"),
    (["simulate", "--schedule", "grouped+tiled"], "not a schedule"),
    (["simulate", "--heads", "3", "--kv-heads", "2"], "multiple of kv_heads"),
])
def test_bad_arguments_are_named(args, hint):
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 2
    assert hint in result.output


def test_simulate_json_carries_its_inputs():
    result = CliRunner().invoke(main, [
        "simulate", "--schedule", "persistent+sawtooth", "--seqlen", "4096", "--head-dim",
        "64", "--batch", "2", "--heads", "4", "--causal", "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    (row,) = data["results"]
    assert row["inputs"] == {"batch": 2, "heads": 4, "kv_heads": None, "seqlen": 4096,
                             "head_dim": 64, "dtype": "bfloat16", "causal": True,
                             "schedule": "persistent+sawtooth", "tiles": None,
                             "occupancy": None, "ctas": None, "chunk_tiles": None,
                             "worker_warps": None, "cluster": 1, "kv_latency": 0,
                             "rescale_threshold": 0, "exp2_poly": 0, "qk_ahead": 0}
    assert data["sms"] == 132 and row["schedule"] == "persistent+sawtooth"
    assert "simulating persistent+sawtooth" in result.stderr  # progress on stderr


def test_sweep_dry_run_needs_no_gpu():
    result = CliRunner().invoke(main, ["sweep", str(ROOT / "experiments" / "knee.py"),
                                       "--dry-run", "--gpu", "h200"])
    assert result.exit_code == 0, result.output
    assert "knee: 216 tasks on the H200 preset" in result.output
    assert "S262144 D128" in result.output


def test_fit_writes_only_where_told(tmp_path):
    # The knee data up to S=48k (a few seconds of simulation), with its manifest.
    src = ROOT / "data" / "knee"
    (tmp_path / "knee").mkdir()
    lines = read_results_bytes(results_path(src)).decode().splitlines()
    keep = [lines[0]] + [ln for ln in lines[1:] if any(f"seqlen={s}," in ln
                                                       for s in (16384, 24576, 32768, 49152))]
    data = tmp_path / "knee" / "results.csv"
    data.write_text("\n".join(keep) + "\n")
    (tmp_path / "knee" / "manifest.json").write_bytes(read_results_bytes(manifest_path(src)))
    result = CliRunner().invoke(main, ["fit", str(data), "--json"])
    assert result.exit_code == 0, result.output
    assert not (tmp_path / "knee" / "fits.json").exists()
    assert set(json.loads(result.output)["gpus"]) == {"NVIDIA H100 80GB HBM3", "NVIDIA H200"}
    result = CliRunner().invoke(main, ["fit", str(data), "--out", str(tmp_path / "fits")])
    assert result.exit_code == 0 and (tmp_path / "fits" / "fits.json").exists()
    assert "NVIDIA H100 80GB HBM3" in result.output  # full GPU names fit the table


def test_every_results_command_has_json():
    for name, cmd in main.commands.items():
        if name in ("info", "compile", "run", "bench", "profile", "sweep", "simulate", "fit"):
            assert any(p.name == "as_json" for p in cmd.params), name


Q_B1 = (1, 32, 8192, 128)  # the default tuned shape (batch, heads, seqlen, head_dim)


def test_tuned_table_round_trip_and_bad_entries(tmp_path):
    """The tuned table keeps other GPUs' entries, returns exactly the `attention` arguments,
    and names what a broken entry lacks."""
    from wavefront.kernel.tuning import CONFIG_FIELDS, tuned_config, write_entry
    path = tmp_path / "tuned.json"
    assert tuned_config("GPU A", Q_B1, Q_B1, True, path) is None
    entry = {"schedule": "dynamic+linear", "tiles": "128x128", "occupancy": 1,
             "worker_warps": 8, "cluster": 1, "kv_latency": 0, "rescale_threshold": 0,
             "exp2_poly": 0, "qk_ahead": 0, "tflops": 600.0, "shape": "B=1 H=32 KV=32 S=8192 bfloat16"}
    assert write_entry("GPU A", 128, True, entry, path) == "d128_causal"
    write_entry("GPU B", 64, False, {**entry, "tiles": "128x64"}, path)
    got = tuned_config("GPU A", Q_B1, Q_B1, True, path)
    assert set(got) == set(CONFIG_FIELDS) and got["tiles"] == "128x128"
    q64 = (1, 32, 8192, 64)
    assert tuned_config("GPU B", q64, q64, False, path)["tiles"] == "128x64"
    assert tuned_config("GPU A", Q_B1, Q_B1, False, path) is None
    with pytest.raises(ValueError, match="missing"):
        write_entry("GPU A", 64, True, {"schedule": "grid+linear"}, path)
    path.write_text('{"GPU A": {"d128_causal": {"schedule": "grid+linear", '
                    '"shape": "B=1 H=32 KV=32 S=8192"}}}')
    with pytest.raises(ValueError, match="lacks"):
        tuned_config("GPU A", Q_B1, Q_B1, True, path)


def test_the_tuned_table_is_parsed_once_and_handed_out_as_copies(tmp_path):
    """A new shape's first call reads the tuned table: parsed once per version of the file,
    and `load_table` hands out copies, so a caller's edit never reaches the next call."""
    from wavefront.kernel.tuning import _parsed_table, load_table, tuned_config, write_entry
    path = tmp_path / "tuned.json"
    entry = {"schedule": "dynamic+linear", "tiles": "128x128", "occupancy": 1,
             "worker_warps": 8, "cluster": 1, "kv_latency": 0, "rescale_threshold": 0,
             "exp2_poly": 0, "qk_ahead": 0, "shape": "B=1 H=32 KV=32 S=8192 bfloat16"}
    write_entry("GPU A", 128, True, entry, path)
    load_table(path)["GPU A"]["d128_causal"]["tiles"] = "64x64"
    assert tuned_config("GPU A", Q_B1, Q_B1, True, path)["tiles"] == "128x128"
    misses = _parsed_table.cache_info().misses
    for _ in range(3):
        tuned_config("GPU A", Q_B1, Q_B1, True, path)
    assert _parsed_table.cache_info().misses == misses
    write_entry("GPU A", 128, True, {**entry, "tiles": "128x64"}, path)
    assert tuned_config("GPU A", Q_B1, Q_B1, True, path)["tiles"] == "128x64"


def test_tuned_table_takes_the_nearest_tuned_shape(tmp_path):
    """A second shape's entry sits beside the default one; each call takes the entry whose
    shape is nearest to its own, and an entry written before the softmax levers existed
    means their defaults."""
    from wavefront.kernel.tuning import shape_distance, tuned_config, write_entry
    path = tmp_path / "tuned.json"
    old = {"schedule": "persistent+linear", "tiles": "128x128", "occupancy": 2,
           "worker_warps": 8, "cluster": 1, "kv_latency": 0,
           "shape": "B=1 H=32 KV=32 S=8192 bfloat16"}
    path.write_text(json.dumps({"GPU A": {"d128_full": old}}))
    assert tuned_config("GPU A", Q_B1, Q_B1, False, path)["rescale_threshold"] == 0
    gqa = {**old, "rescale_threshold": 0, "exp2_poly": 0, "qk_ahead": 0, "tiles": "128x64",
           "shape": "B=4 H=32 KV=8 S=4096 bfloat16"}
    assert write_entry("GPU A", 128, False, gqa, path) == "d128_full_b4_h32_kv8_s4096"
    assert tuned_config("GPU A", Q_B1, Q_B1, False, path)["tiles"] == "128x128"
    q, k = (4, 32, 4096, 128), (4, 8, 4096, 128)
    assert tuned_config("GPU A", q, k, False, path)["tiles"] == "128x64"
    # a GQA shape near the tuned one takes it; an MHA shape near the default the default
    q2, k2 = (8, 32, 4096, 128), (8, 8, 4096, 128)
    assert tuned_config("GPU A", q2, k2, False, path)["tiles"] == "128x64"
    q3 = (2, 32, 8192, 128)
    assert tuned_config("GPU A", q3, q3, False, path)["tiles"] == "128x128"
    a, b = (1, 32, 32, 8192), (4, 32, 8, 4096)
    assert shape_distance(a, a) == 0 and shape_distance(a, b) == shape_distance(b, a) > 0
    assert tuned_config("GPU A", (1, 32, 8192, 64), (1, 32, 8192, 64), False, path) is None


def test_a_causal_launch_of_one_wave_takes_64_row_tiles():
    """Its longest item bounds such a launch; more items than a wave, or no mask, keep the
    entry."""
    from wavefront.kernel import tuning as launcher
    entry = {"schedule": "grouped_dynamic+linear", "tiles": "128x64", "occupancy": 2,
             "worker_warps": 8, "kv_latency": 8, "qk_ahead": 1}
    small, big = (1, 8, 1024, 64), (1, 32, 8192, 64)  # 64 and 2048 items of 128 rows
    gpu = {"sms": 132, "l2_bytes": 50 << 20}
    got = launcher._one_wave_causal(entry, small, small, True, **gpu)
    assert got == {**entry, **launcher.ONE_WAVE_CAUSAL} and got["kv_latency"] == 8
    assert launcher._one_wave_causal(entry, small, small, False, **gpu) == entry
    assert launcher._one_wave_causal(entry, big, big, True, **gpu) == entry
    # 64 items > 31 SMs x 2
    assert launcher._one_wave_causal(entry, small, small, True, **{**gpu, "sms": 31}) == entry


def test_the_committed_tuned_table_names_valid_configurations():
    """Every committed entry is a valid `attention` configuration (a Point accepts it)."""
    from wavefront.kernel.tuning import _entry_shape, load_table, tuned_config, tuned_entry
    for gpu, entries in load_table().items():
        for key, entry in entries.items():
            d, mask = key[1:].split("_")[:2]
            batch, heads, kv_heads, seqlen = _entry_shape(entry, key)
            got_key, _ = tuned_entry(gpu, int(d), mask == "causal",
                                     (batch, heads, kv_heads, seqlen))
            assert got_key == key  # its own shape finds it
            config = tuned_config(gpu, (batch, heads, seqlen, int(d)),
                                  (batch, kv_heads, seqlen, int(d)), mask == "causal")
            Point(batch, heads, kv_heads, seqlen, head_dim=int(d), causal=mask == "causal",
                  **config)


def test_tuned_entries_are_ranked_by_distance_and_a_tie_goes_by_name(tmp_path):
    """`ranked_entries` orders a GPU's entries of one head dim and mask by their distance to
    the shape; `tuned_entry` takes the first, and a tie goes to the key first in name order."""
    from wavefront.kernel.tuning import ranked_entries, tuned_entry
    config = {"schedule": "persistent+linear", "tiles": "128x128", "occupancy": 2}
    table = {"G": {
        "d64_full": {**config, "shape": "B=1 H=32 KV=32 S=8192"},
        "d64_full_b8_h16_kv16_s2048": {**config, "shape": "B=8 H=16 KV=16 S=2048"},
        "d64_full_b1_h32_kv32_s65536": {**config, "shape": "B=1 H=32 KV=32 S=65536"},
        "d64_causal": {**config, "shape": "B=1 H=32 KV=32 S=4096"}}}
    path = tmp_path / "tuned.json"
    path.write_text(json.dumps(table))
    ranked = ranked_entries("G", 64, False, (1, 32, 32, 4096), path)
    assert [(d, k) for d, k, _, _ in ranked] == [
        (2.0, "d64_full"), (2.0, "d64_full_b8_h16_kv16_s2048"),
        (8.0, "d64_full_b1_h32_kv32_s65536")]
    assert tuned_entry("G", 64, False, (1, 32, 32, 4096), path)[0] == "d64_full"
    assert ranked_entries("G", 128, False, (1, 32, 32, 4096), path) == []
    assert tuned_entry("G", 128, False, (1, 32, 32, 4096), path) is None

def test_tune_lever_space_and_record():
    from wavefront.measure.tune import LEVERS, lever_record, lever_space
    shape = Point(head_dim=128, causal=True)
    space = lever_space(shape)
    n = 1
    for values in LEVERS.values():
        n *= len(values)
    assert len(space) == len(set(space)) == n
    assert all(p.head_dim == 128 and p.causal for p in space)
    rows = [{"label": str(i), "levers": {k: getattr(p, k) for k in LEVERS},
             "tflops": 100.0 + i if i % 3 else None} for i, p in enumerate(space)]
    record = lever_record(rows)
    assert len(record) == sum(len(v) for v in LEVERS.values())
    best = max(r["tflops"] for r in rows if r["tflops"])
    assert max(r["best_tflops"] for r in record) == best
    assert all(r["of_best"] is None or 0 < r["of_best"] <= 1 for r in record)


def test_tune_only_holds_levers_to_some_of_their_values():
    from wavefront.measure.tune import LEVERS, lever_space, restricted, tuned_entry
    held = restricted(["tiles=128x128", "worker-warps=8", "qk_ahead=0,1"])
    assert held["tiles"] == ("128x128",) and held["worker_warps"] == (8,)
    assert held["qk_ahead"] == LEVERS["qk_ahead"] and held["occupancy"] == LEVERS["occupancy"]
    space = lever_space(Point(head_dim=128), held)
    # one of the tile shapes, one of the two worker-warp values
    assert len(space) == len(lever_space(Point(head_dim=128))) // (2 * len(LEVERS["tiles"]))
    assert {p.tiles for p in space} == {"128x128"} and {p.worker_warps for p in space} == {8}
    entry = tuned_entry({"levers": {k: getattr(space[0], k) for k in (*LEVERS, "exp2_poly",
                                                                       "rescale_threshold")},
                         "tflops": 1.0}, (1, 32, 32, 8192), "bfloat16",
                        restricted(["tiles=128x128"]))
    assert entry["search held to"] == "tiles=128x128"
    for only, message in ((["tile=128x128"], "no searched lever 'tile'"),
                          (["tiles=64x64"], "tiles: expected values among 128x64, 128x128"),
                          (["occupancy="], "occupancy: expected values")):
        with pytest.raises(ValueError, match=message):
            restricted(only)
    # refused before any GPU is looked for
    for arg, message in (("tiles=64x64", "expected values among"), ("tiles", "LEVER=V")):
        result = CliRunner().invoke(main, ["tune", "--only", arg])
        assert result.exit_code == 2 and message in result.output and "--only" in result.output


def test_paired_speedup_cancels_what_a_round_shares():
    """Round-to-round drift common to both contenders cancels in the paired ratio."""
    from wavefront.measure.rounds import RoundsResult, paired_speedup
    drift = [1.0, 1.3, 0.9, 1.5, 1.1, 1.2, 0.8, 1.4]

    def result(name, ms):
        return RoundsResult(name, ms, 0.0, (0.0, 0.0), 0.0, (0.0, 0.0), 0, len(ms))
    ref = result("a", [2.0 * d for d in drift])
    other = result("b", [1.6 * d for d in drift])
    med, lo, hi = paired_speedup(ref, other)
    assert med == pytest.approx(1.25) and lo == pytest.approx(1.25) and hi == pytest.approx(1.25)
    with pytest.raises(ValueError, match="same rounds"):
        paired_speedup(ref, result("c", [1.0] * 7))


def test_a_dry_run_reads_the_experiment_as_data():
    """`wavefront sweep FILE --dry-run` lists the sweep without importing what the figure
    needs (pandas, seaborn, numba, matplotlib, scipy) and without running the file."""
    import subprocess
    import sys
    code = ("import sys\n"
            "from wavefront.cli import main\n"
            "try:\n"
            "    main(['sweep', 'experiments/knee.py', '--dry-run'])\n"
            "except SystemExit as exc:\n"
            "    assert not exc.code, exc.code\n"
            "heavy = {'pandas', 'seaborn', 'numba', 'matplotlib', 'scipy'} & set(sys.modules)\n"
            "print('heavy:', sorted(heavy))\n")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         cwd=Path(__file__).parent.parent, timeout=120)
    assert res.returncode == 0, res.stderr[-1000:]
    assert "knee: 216 tasks" in res.stdout and "heavy: []" in res.stdout, res.stdout


def test_experiment_sweeps_are_read_without_running_the_file(tmp_path):
    from wavefront.results.sweep import experiment_spec_texts
    shared = 'GRID = """\n[grid]\nseqlen = [128]\nhead_dim = [64]\nschedule = ["grid"]\n"""\n'
    good = tmp_path / "two.py"
    good.write_text("raise SystemExit('this file must not run')\n" + shared
                    + "SPECS = {'a': 'name = \"a\"\\n' + GRID, 'b': GRID}\n")
    texts = experiment_spec_texts(good)
    assert sorted(texts) == ["a", "b"] and texts["a"].startswith('name = "a"')
    res = CliRunner().invoke(main, ["sweep", str(good), "--dry-run"])
    assert res.exit_code == 2 and "owns 2 sweeps (a, b)" in res.output, res.output
    one = tmp_path / "one.py"
    one.write_text("import os\nos.remove(__file__)\n" + shared + "SPEC = GRID\n")
    res = CliRunner().invoke(main, ["sweep", str(one), "--dry-run"])
    assert res.exit_code == 0 and "1 tasks" in res.output and one.exists(), res.output
    computed = tmp_path / "computed.py"
    computed.write_text("def make():\n    return ''\nSPEC = make()\n")
    res = CliRunner().invoke(main, ["sweep", str(computed), "--dry-run"])
    assert res.exit_code == 2 and "SPEC must be built from literals" in res.output, res.output


def test_an_experiments_own_section_and_claims_join_the_draft():
    """The draft is the experiments' sections in DRAFT's order, and a claim of a section that
    the data contradicts stops the build like any other."""
    from types import SimpleNamespace

    import pytest as _pytest

    from wavefront.report import draft
    from wavefront.report.experiments import Experiments

    def section(text, holds):
        def make(study):
            s = draft.Section(text)
            s.claim(f"claim of {text}", holds, "checked" if holds else "contradicted")
            return s
        return SimpleNamespace(section=make)
    for ok in (True, False):
        numbers = draft.DraftNumbers()
        experiments = Experiments({"a": section("## A", True), "b": section("## B", ok),
                                   "c": SimpleNamespace()}, draft=("b", "a"))
        found = ("\n\nFindings, each checked against the data when the paper is built:\n\n"
                 "- claim of ## {}")
        assert draft.sections(numbers, None, experiments) == \
            "## B" + found.format("B") + "\n\n## A" + found.format("A")
        failed = [c for c in numbers.claims if not c.holds]
        assert (not failed) == ok
        if not ok:
            with _pytest.raises(draft.ClaimFailed, match="b: contradicted"):
                draft.render(numbers)


def test_simulate_defaults_to_the_timed_model():
    """The default is the model the draft validates out of sample: the timed one, with the
    H100's calibration from paper/fits.json; it answers time as well as DRAM reads, and says
    what the lock-step model's options need."""
    args = ["simulate", "--schedule", "persistent+linear,grid+linear", "--seqlen", "16384",
            "--head-dim", "128", "--json"]
    res = CliRunner().invoke(main, args)
    assert res.exit_code == 0, res.output
    data = json.loads(res.stdout)
    assert data["model"] == "timed" and data["partitions"] == 2
    for row in data["results"]:
        assert row["kernel_ms"] > 0 and row["dram_read_bytes"] >= row["compulsory_read_bytes"]
        assert "step_time" in row["compute"] and "microbench" in row["memory"]
    bad = CliRunner().invoke(main, args + ["--jitter", "0.1"])
    assert bad.exit_code == 2 and "--no-clock" in bad.output
    missing = CliRunner().invoke(main, args + ["--fits", str(ROOT / "README.md")])
    assert missing.exit_code == 2 and "no timed-model calibration" in missing.output


def test_simulate_writes_per_cta_timelines(tmp_path):
    res = CliRunner().invoke(main, ["simulate", "--schedule", "dynamic+linear", "--seqlen",
                                    "8192", "--causal", "--timeline-out", str(tmp_path)])
    assert res.exit_code == 0, res.output
    (path,) = tmp_path.iterdir()
    rows = np.loadtxt(path, delimiter=",", skiprows=1)
    assert len(rows) == 64  # 8192 / 128-row Q tiles (the default), one row per work item
    assert (rows[:, 3] > rows[:, 2]).all() and len(set(rows[:, 1])) > 1


def test_advise_ranks_configurations_by_predicted_time():
    res = CliRunner().invoke(main, ["advise", "--seqlen", "16384", "--head-dim", "64",
                                    "--schedule", "persistent+linear,grid+linear",
                                    "--no-budgets", "--json"])
    assert res.exit_code == 0, res.output
    ranking = json.loads(res.stdout)["ranking"]
    # two schedules x every tile shape the kernel compiles x CTAs per SM up to its default
    # (64x64 and 128x64 at 1 and 2, the 128-row-wide ones at 1)
    assert len(ranking) == 12
    times = [r["time_ms"] for r in ranking]
    assert times == sorted(times) and ranking[0]["vs_best"] == 1.0
    assert {r["step"] for r in ranking} >= {"calibrated"}
    text = CliRunner().invoke(main, ["advise", "--seqlen", "4096", "--heads", "24",
                                     "--schedule", "grouped+linear", "--no-causal"])
    assert text.exit_code == 0, text.output
    assert "H24 S4096" in text.output and "None" not in text.output
    assert "FlashAttention-3 dense (32 MB)" in text.output
    two = CliRunner().invoke(main, ["advise", "--seqlen", "1024,2048"])
    assert two.exit_code == 2 and "one shape" in two.output


def test_simulate_lock_step_uses_the_partition_model():
    """--no-clock: the lock-step rounds with the partition model the draft validates: on
    Hopper two partitions, each an LRU of half the L2, the DRAM column from the partitioned
    cache; --partitions 1 is one LRU."""
    args = ["simulate", "--schedule", "persistent+linear", "--seqlen", "65536", "--head-dim",
            "64", "--tile", "64x64", "--no-clock", "--json"]
    default = json.loads(CliRunner().invoke(main, args).stdout)
    one = json.loads(CliRunner().invoke(main, args + ["--partitions", "1"]).stdout)
    assert default["partitions"] == 2 and one["partitions"] == 1
    assert default["capacity_bytes"] == 25 * 2**20
    assert default["results"][0]["partitioned"] is not None
    assert one["results"][0]["partitioned"] is None
    assert default["results"][0]["model"].startswith("2 partitions")
    gb10 = json.loads(CliRunner().invoke(main, args + ["--gpu", "gb10"]).stdout)
    assert gb10["partitions"] == 1 and gb10["capacity_bytes"] == 24 * 2**20


def test_compress_packs_a_sweeps_table_and_refuses_a_directory_without_one(tmp_path):
    from wavefront.results.store import load_results, read_manifest, write_manifest
    d = tmp_path / "knee"
    d.mkdir()
    text = read_results_bytes(results_path(ROOT / "data" / "knee"))
    (d / "results.csv").write_bytes(text)
    (d / "manifest.json").write_bytes(read_results_bytes(manifest_path(ROOT / "data" / "knee")))
    runs = read_manifest(d)
    result = CliRunner().invoke(main, ["compress", str(d)])
    assert result.exit_code == 0, result.output
    assert not (d / "results.csv").exists() and not (d / "manifest.json").exists()
    assert read_results_bytes(d / "results.csv.gz") == text
    assert read_manifest(d) == runs and len(load_results(d / "results.csv.gz")) > 0
    # a later run's manifest entry goes into the packed manifest, which stays packed
    write_manifest(d, "later", {**next(iter(runs.values())), "date": "2026-11-24"})
    assert not (d / "manifest.json").exists() and set(read_manifest(d)) == {*runs, "later"}
    again = CliRunner().invoke(main, ["compress", str(d)])
    assert again.exit_code == 2 and "no results.csv, manifest.json or *.jsonl" in again.output


def test_compress_packs_record_files_the_report_still_reads(tmp_path):
    """A record data set packed by `compress` reads back the same records through the
    report's Study (which matches `*.jsonl` patterns to their .gz form)."""
    from wavefront.report.analysis import Study
    from wavefront.results.records import STARVED_RECORDS
    d = tmp_path / "starved_launch" / "sub"
    d.mkdir(parents=True)
    rows = [STARVED_RECORDS.stamp({"kind": "round", "gpu": "G", "value": i}) for i in range(3)]
    (d / "rounds.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    before = Study(tmp_path).records(STARVED_RECORDS, "starved_launch", "sub/rounds.jsonl")
    result = CliRunner().invoke(main, ["compress", str(tmp_path / "starved_launch")])
    assert result.exit_code == 0, result.output
    assert not (d / "rounds.jsonl").exists() and (d / "rounds.jsonl.gz").exists()
    after = Study(tmp_path).records(STARVED_RECORDS, "starved_launch", "sub/rounds.jsonl")
    assert after == before and len(after["sub/rounds"]) == 3



def test_compress_at_significant_digits_rounds_fractions_and_keeps_whole_numbers(tmp_path):
    """`--significant-digits 7` packs a committed table and its records again: fractions to 7
    significant digits, counters and byte counts exact, text, empty cells and NaN as they
    were; a table's rows still load as the same rows."""
    import gzip

    from wavefront.results.store import load_results
    d = tmp_path / "knee"
    (d / "sub").mkdir(parents=True)
    # the committed knee table with full-precision fractions, as a sweep writes them
    import csv
    import io
    committed = list(csv.DictReader(io.StringIO(
        read_results_bytes(results_path(ROOT / "data" / "knee")).decode())))
    for i, row in enumerate(committed):
        row["median_ms"] = repr(0.23588799685239792 + i / 3)
    text = io.StringIO()
    writer = csv.DictWriter(text, fieldnames=list(committed[0]), lineterminator="\n")
    writer.writeheader()
    writer.writerows(committed)
    table = gzip.compress(text.getvalue().encode())
    (d / "results.csv.gz").write_bytes(table)
    rows = [{"ms": 0.23588799685239792, "bytes": 68719476736.0, "n": 3, "name": "0.123456789",
             "nan": float("nan"), "samples": [1.9726144790649414, 2.0]}]
    (d / "sub" / "bench.jsonl.gz").write_bytes(gzip.compress(
        "".join(json.dumps(r) + "\n" for r in rows).encode()))
    before = load_results(d / "results.csv.gz", require_manifest=False)
    result = CliRunner().invoke(main, ["compress", str(d), "--significant-digits", "7"])
    assert result.exit_code == 0, result.output
    after = load_results(d / "results.csv.gz", require_manifest=False)
    assert (d / "results.csv.gz").stat().st_size < len(table)
    assert list(after.columns) == list(before.columns) and len(after) == len(before)
    for column in before.columns:
        if before[column].dtype.kind == "f":
            assert np.allclose(after[column], before[column], rtol=1e-6, equal_nan=True), column
            whole = before[column].notna() & (before[column] % 1 == 0)
            assert (after[column][whole] == before[column][whole]).all(), column
        else:
            assert after[column].equals(before[column]), column
    assert after["median_ms"].iloc[0] == 0.235888 and after["median_ms"].iloc[3] == 1.235888
    line = json.loads(gzip.decompress((d / "sub" / "bench.jsonl.gz").read_bytes()))
    assert line["ms"] == 0.235888 and line["bytes"] == 68719476736.0 and line["n"] == 3
    assert line["name"] == "0.123456789" and line["nan"] != line["nan"]
    assert line["samples"] == [1.972614, 2.0]
    # a directory with nothing to pack, plain or packed, is refused by name
    empty = tmp_path / "empty"
    empty.mkdir()
    refused = CliRunner().invoke(main, ["compress", str(empty), "--significant-digits", "7"])
    assert refused.exit_code == 2 and "nor a packed one" in refused.output
    too_few = CliRunner().invoke(main, ["compress", str(d), "--significant-digits", "3"])
    assert too_few.exit_code == 2 and "--significant-digits" in too_few.output

def test_every_experiments_sweeps_parse():
    """`experiment run NAME` reads every experiment's sweeps (a data set may be measured by
    another's spec): one spec that cannot be read as data stops them all."""
    from wavefront.report.experiments import discover
    experiments = discover(Path(__file__).parent.parent / "experiments")
    owned = {name: e.specs for name, e in experiments.items()}
    assert owned["kernel_drift"]["kernel_drift"].grid and owned["step_time"]["step_time"].grid


def test_tune_does_not_write_a_winner_timed_on_a_slowed_gpu():
    """A lent H100 once ran a whole call 4.4x slow with normal-looking ratios to cuDNN: a winner
    under half the speed the table recorded for its key is refused (a new key, or one without
    a speed, is written)."""
    from wavefront.measure.tune import SLOWED_GPU, slowed_gpu
    recorded = {"tflops": 652.7}
    assert "slowed GPU" in slowed_gpu({"tflops": 148.4}, recorded)
    assert slowed_gpu({"tflops": SLOWED_GPU * 652.7 + 1}, recorded) is None
    assert slowed_gpu({"tflops": 670.7}, recorded) is None
    assert slowed_gpu({"tflops": 148.4}, None) is None
    assert slowed_gpu({"tflops": 148.4}, {"schedule": "persistent+linear"}) is None
