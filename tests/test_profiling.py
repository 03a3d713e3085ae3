"""Nsight Compute output: the parser on real captures, derived columns, and counters attributed
to their point by NVTX tag (a stand-in ncu drops, reorders and untags kernels)."""
import gzip
import json
import sys
from pathlib import Path

import pytest

from wavefront.measure.profiling import (
    KernelRecord,
    ProfilerError,
    attribute,
    check_ncu_output,
    combine_kernel_metrics,
    csv_command,
    ncu_command,
    parse_ncu_csv,
    profile_tasks,
)
from wavefront.measure.runner import SubprocessRunner
from wavefront.model.counting import launch_counts
from wavefront.results.measurement import METRICS, derive
from wavefront.results.store import load_results, read_manifest
from wavefront.results.sweep import parse_spec, run_sweep
from wavefront.schedules import AttentionProblem

FIXTURES = Path(__file__).parent / "fixtures"
FAKES = Path(__file__).parent / "fakes"
FAKE_WORKER = [sys.executable, str(FAKES / "fake_worker.py")]
FAKE_NCU = str(FAKES / "fake_ncu.py")


def _fixture(name: str) -> str:
    """A raw ncu CSV export, kept gzip-compressed: its text."""
    return gzip.decompress((FIXTURES / name).read_bytes()).decode()


H200 = _fixture("ncu_raw_h200_s131072_d64.csv.gz")
H100 = _fixture("ncu_raw_h100_s131072_d64_tiled.csv.gz")


def test_parses_real_capture():
    rows = parse_ncu_csv(H200)
    # persistent+linear then persistent+sawtooth, H=1, S=131072, D=64, 64x64 tiles
    assert len(rows) == 2
    for row in rows:
        assert row.kernel_name.startswith("flash_attention_fwd") and row.tag is None
        assert set(METRICS.values()) - {"l1_global_load_sectors",
                                        "l1_global_load_hit_sectors"} <= set(row.metrics)
    linear = rows[0].metrics
    assert linear["l2_tex_read_sectors"] == 2_044_576_288  # thousands separators removed
    assert linear["dram_read_bytes"] == 267_304_192
    assert linear["ncu_duration_ns"] == 12_355_392


def test_derived_columns_on_real_captures():
    p = AttentionProblem(1, 1, 1, 131072, 131072, 64, tile_m=64, tile_n=64)
    counts = launch_counts(p)
    for row in parse_ncu_csv(H200):
        d = derive(row.metrics, counts.read_sectors, counts.compulsory_read_bytes)
        assert d["dram_read_sectors"] == row.metrics["dram_read_bytes"] / 32
        # On this capture the L2-side count agrees with DRAM reads (it does not everywhere).
        assert d["l2_read_miss_sectors"] == pytest.approx(d["dram_read_sectors"], rel=0.05)
        assert 0.9 < d["read_sectors_ratio"] < 1.0
    linear, sawtooth = (derive(r.metrics, None, None) for r in parse_ncu_csv(H200))
    assert sawtooth["dram_read_sectors"] < 0.5 * linear["dram_read_sectors"]


def test_two_kernel_point_on_the_h100_capture():
    """H100, S=131072 D=64 64x64: persistent linear, sawtooth, tiled (attention + combine)."""
    rows = parse_ncu_csv(H100)
    assert [r.kernel_name.split("_Kt")[0] for r in rows] == [
        "flash_attention_fwd", "flash_attention_fwd", "flash_attention_fwd", "combine_partials"]
    tiled = combine_kernel_metrics([rows[2].metrics, rows[3].metrics])
    for column in ("l2_tex_read_sectors", "dram_read_bytes", "ncu_duration_ns"):
        assert tiled[column] == rows[2].metrics[column] + rows[3].metrics[column]
    lo, hi = sorted((rows[2].metrics["sm_throughput_pct"], rows[3].metrics["sm_throughput_pct"]))
    assert lo <= tiled["sm_throughput_pct"] <= hi


def test_units_and_blank_values():
    text = ('"ID","Kernel Name","dram__bytes_read.sum","gpu__time_duration.sum"\n'
            '"","","Mbyte","usecond"\n'
            '"0","wf:7 flash","1,234.5","n/a"\n')
    (row,) = parse_ncu_csv(text)
    assert row.metrics["dram_read_bytes"] == pytest.approx(1234.5e6)
    assert row.metrics["ncu_duration_ns"] is None and row.tag == "wf:7"
    assert parse_ncu_csv("==PROF== nothing profiled\n") == []


def test_attribution_by_tag_not_by_position():
    recs = [KernelRecord("flash_attention_fwd_a", "wf:2", {"dram_read_bytes": 2.0}),
            KernelRecord("flash_attention_fwd_a", "wf:0", {"dram_read_bytes": 0.0}),
            KernelRecord("flash_attention_fwd_b", "wf:3", {"dram_read_bytes": 3.0}),
            KernelRecord("combine_partials_b", "wf:3", {"dram_read_bytes": 0.5})]
    out = attribute(recs, {"wf:0": 1, "wf:1": 1, "wf:2": 1, "wf:3": 2})
    assert out["wf:0"]["dram_read_bytes"] == 0.0 and out["wf:2"]["dram_read_bytes"] == 2.0
    assert out["wf:3"]["dram_read_bytes"] == 3.5
    assert "0 kernels under NVTX range wf:1" in out["wf:1"]
    bad = attribute([KernelRecord("some_other_kernel", "wf:0", {})], {"wf:0": 1})
    assert "unexpected kernel" in bad["wf:0"]


SPEC = """
measure = ["counters"]
batch_points = 5
[grid]
seqlen = [1000, 2000, 3000, 4000, 5000]
head_dim = [64]
schedule = ["persistent+linear"]
"""


def _profile_sweep(tmp_path, monkeypatch, mode, spec=SPEC):
    monkeypatch.setenv("FAKE_NCU_MODE", mode)
    runner = SubprocessRunner(worker_cmd=FAKE_WORKER, ncu=FAKE_NCU,
                              report_dir=str(tmp_path / "ncu-reports"))
    summary = run_sweep(parse_spec(spec), tmp_path, gpu="FakeGPU", sms=132, l2_bytes=50 << 20,
                        runner=runner, progress=False)
    return summary, load_results(tmp_path / "results.csv")


@pytest.mark.parametrize("mode", ["ok", "reorder"])
def test_every_point_gets_its_own_counters(tmp_path, monkeypatch, mode):
    summary, df = _profile_sweep(tmp_path, monkeypatch, mode)
    assert summary["ok"] == 5 and summary["failed"] == 0
    assert (df["dram_read_bytes"] == df["seqlen"] * 1000.0).all()
    assert (df["dram_read_sectors"] == df["dram_read_bytes"] / 32).all()
    # The raw report is kept and named in the manifest with its hash.
    (run,) = read_manifest(tmp_path).values()
    (report,) = run["raw_reports"]
    assert (tmp_path / "ncu-reports" / report["file"]).exists()
    assert len(report["sha256"]) == 64 and report["read_with"] == "csv"
    assert sorted(p for p, _ in report["tags"].values()) == sorted(df["point"])


def test_a_dropped_kernel_fails_its_point_and_shifts_nothing(tmp_path, monkeypatch):
    summary, df = _profile_sweep(tmp_path, monkeypatch, "drop-middle")
    assert summary["ok"] == 4 and summary["failed"] == 1
    failed = df[df["status"] == "failed"]
    assert list(failed["seqlen"]) == [3000]
    assert failed["error"].iloc[0].startswith("ncu reported 0 kernels under NVTX range")
    ok = df[df["status"] == "ok"]
    assert (ok["dram_read_bytes"] == ok["seqlen"] * 1000.0).all()


def test_untagged_kernels_are_never_attributed(tmp_path, monkeypatch):
    summary, df = _profile_sweep(tmp_path, monkeypatch, "untagged")
    assert summary["failed"] == 5 and df["error"].str.contains("carried no tag").all()


def test_a_silent_ncu_is_retried_a_bounded_number_of_times(tmp_path, monkeypatch):
    calls = []
    import wavefront.measure.runner as runner_mod
    real = runner_mod.profile_tasks

    def counting(*a, **k):
        calls.append(1)
        return real(*a, **k)
    monkeypatch.setattr(runner_mod, "profile_tasks", counting)
    summary, df = _profile_sweep(tmp_path, monkeypatch, "silent")
    assert summary["failed"] == 5 and len(calls) == 5  # one ncu start per point, no more
    assert df["error"].str.contains("no result").all()


def test_tiled_points_need_both_kernels(tmp_path, monkeypatch):
    spec = SPEC.replace('"persistent+linear"', '"persistent+tiled"')
    summary, df = _profile_sweep(tmp_path, monkeypatch, "ok", spec)
    assert summary["ok"] == 5
    assert (df["dram_read_bytes"] == 2 * df["seqlen"] * 1000.0).all()  # attention + combine


def test_counter_permission_error_is_explained():
    with pytest.raises(ProfilerError, match="ERR_NVGPUCTRPERM"):
        check_ncu_output("==ERROR== ERR_NVGPUCTRPERM - The user does not have permission")
    check_ncu_output("fine")


def test_missing_ncu_is_explained(monkeypatch):
    monkeypatch.setattr("wavefront.measure.profiling.find_ncu", lambda: None)
    with pytest.raises(ProfilerError, match="ncu"):
        profile_tasks([{"point": "x"}], timeout_s=1)


def test_ncu_command_profiles_only_the_measured_launch_and_keeps_the_report():
    joined = " ".join(ncu_command("ncu", "/tmp/r.ncu-rep", ["python", "-m", "w"]))
    assert "--profile-from-start off" in joined and "--nvtx" in joined
    assert "--cache-control all" in joined and "--replay-mode kernel" in joined
    assert "--clock-control none" in joined and "--export /tmp/r.ncu-rep" in joined
    assert "--kernel-name regex:flash_attention_fwd" in joined
    csv_cmd = " ".join(csv_command("ncu", "/tmp/r.ncu-rep"))
    assert "--import /tmp/r.ncu-rep" in csv_cmd and "--print-units base" in csv_cmd


def test_the_stall_summary_groups_instructions_by_how_often_they_ran(tmp_path):
    """`wavefront stalls` (data/d128_limits/sass/): an ncu source-page export of two kernels,
    grouped per kernel by execution count, with its named barriers apart from the MMA waits
    and the most-sampled instruction first."""
    from wavefront.measure import stalls as limits
    header = ('"Address","Source","Warp Stall Sampling (All Samples)","Instructions Executed",'
              '"stall_barrier","stall_long_sb","stall_long_sb (Not Issued)"\n')
    text = ('"Kernel Name","ours"\n' + header
            + '"0x0","  HGMMA.64x128x16.F32.BF16 R88","10","800","0","0","0"\n'
            + '"0x10","  WARPGROUP.DEPBAR.LE gsb0, 0x0","60","800","60","0","0"\n'
            + '"0x20","  @!P0  BRA 0x40","30","16","0","30","30"\n'
            + '"0x30","  BAR.SYNC.DEFER_BLOCKING 0x1, 0x120","0","16","0","0","0"\n'
            + '"Kernel Name","peer"\n' + header
            + '"0x0","  @P1   BAR.SYNC.DEFER_BLOCKING 0x5, 0x100","5","800","5","0","0"\n'
            + '"0x10","  EXIT","0","0","0","0","0"\n')
    path = tmp_path / "sass_full.csv.gz"
    with gzip.open(path, "wt") as f:
        f.write(text)
    ours, peer = limits.summarise(path)
    assert ours["kernel"] == "ours" and ours["samples"] == 100 and ours["instructions"] == 4
    loop, item = ours["groups"]
    assert (loop["executed"], loop["instructions"], loop["samples_pct"]) == (800, 2, 70.0)
    assert loop["reasons_pct"] == {"barrier": 60.0}
    assert (item["executed"], item["samples_pct"], item["reasons_pct"]) == (16, 30.0,
                                                                        {"long_sb": 30.0})
    assert [t["index"] for t in ours["top"]] == [1, 2, 0, 3]
    assert [b["index"] for b in ours["named_barriers"]] == [3]  # not the DEPBAR
    assert [b["executed"] for b in peer["named_barriers"]] == [800]
    from click.testing import CliRunner

    from wavefront.cli import main
    out = CliRunner().invoke(main, ["stalls", str(path), "--json", str(tmp_path / "s.json")])
    assert out.exit_code == 0, out.output
    assert "== full" in out.output and "ours: 100 samples, 4 instructions" in out.output
    assert json.loads((tmp_path / "s.json").read_text())["full"] == [ours, peer]


def test_the_profile_command_profiles_a_grid_and_refuses_what_it_cannot_pass(tmp_path):
    """`profile_command` (the experiments' counter step): one `wavefront profile` call for a
    grid of lengths x schedules, parsed by the CLI as written; points that are no grid, or that
    set a field it does not pass, are refused by name."""
    import click

    from wavefront.cli import main
    from wavefront.measure.profiling import profile_command
    from wavefront.point import Point
    grid = [Point(batch=1, heads=1, seqlen=s, head_dim=128, tiles="128x64", occupancy=2,
                  schedule=f"{o}+linear") for s in (65536, 131072) for o in ("persistent",
                                                                           "dynamic")]
    cmd = profile_command(grid, repeats=3, out_dir=tmp_path, record_order=True)
    assert cmd[cmd.index("--seqlen") + 1] == "65536,131072"
    assert cmd[cmd.index("--schedule") + 1] == "persistent+linear,dynamic+linear"
    assert "--record-order=shared" in cmd and "--no-causal" in cmd
    command = main.get_command(click.Context(main), "profile")
    params = command.make_context("profile", cmd[cmd.index("profile") + 1:]).params
    assert params["seqlen"] == [65536, 131072] and params["head_dim"] == [128]
    assert params["schedule"] == ["persistent+linear", "dynamic+linear"]
    assert (params["tiles"], params["occupancy"], params["causal"]) == ("128x64", 2, False)
    assert params["record_order"] == "shared" and params["repeats"] == 3
    per_cta = profile_command(grid, repeats=1, out_dir=tmp_path, record_order="per_cta")
    assert command.make_context("profile", per_cta[per_cta.index("profile") + 1:]).params[
        "record_order"] == "per_cta"
    free = profile_command(grid, repeats=1, out_dir=tmp_path, free_shapes=True)
    assert command.make_context("profile", free[free.index("profile") + 1:]).params[
        "free_shapes"] is True
    # the flag alone, as a user types it, is the shared counter
    assert command.make_context("profile", ["--record-order"]).params["record_order"] == "shared"
    with pytest.raises(ValueError, match="points: expected one grid"):
        profile_command(grid[:3], repeats=1, out_dir=tmp_path)
    with pytest.raises(ValueError, match="points: only batch"):
        profile_command([grid[0].replace(kv_heads=1)], repeats=1, out_dir=tmp_path)


def test_profile_records_writes_each_row_and_a_failed_profile_once(monkeypatch):
    """`profile_records`: each results row becomes `base` + the row's fields + its counters; a
    profile that fails is one record with its error, counted as a failure."""
    from wavefront.measure import profiling
    rows = [{"seqlen": 1024, "status": "ok", "dram_read_bytes": 5.0, "ncu_duration_ns": 7.0,
             "compulsory_read_bytes": 4.0, "other": 1}]
    monkeypatch.setattr(profiling, "profile_in_process", lambda points, **kw: rows)
    written = []
    assert profiling.profile_records(written.append, [], {"kind": "ncu"}, repeats=1,
                                     row_fields=lambda r: {"n": r["seqlen"]}) == 0
    assert written == [{"kind": "ncu", "n": 1024, "status": "ok", "dram_read_bytes": 5.0,
                        "compulsory_read_bytes": 4.0, "ncu_duration_ns": 7.0}]

    def fails(points, **kw):
        raise profiling.ProfilerError("ncu died")
    monkeypatch.setattr(profiling, "profile_in_process", fails)
    written.clear()
    assert profiling.profile_records(written.append, [], {"kind": "ncu", "repeat": 2},
                                     repeats=1) == 1
    assert written == [{"kind": "ncu", "repeat": 2, "error": "ncu died"}]
