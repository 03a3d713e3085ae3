"""The ncu CSV parser on a real capture (H200, ncu 2025.3.1), and the derived columns."""
from pathlib import Path

import pytest

from wavefront.counting import launch_counts
from wavefront.profiling import (
    METRICS,
    combine_kernel_rows,
    ProfilerError,
    check_ncu_output,
    derive,
    ncu_command,
    parse_ncu_csv,
    profile_points,
)
from wavefront.schedules import AttentionProblem

FIXTURE = Path(__file__).parent / "fixtures" / "ncu_raw_h200_s131072_d64.csv"


def test_parses_real_capture():
    rows = parse_ncu_csv(FIXTURE.read_text())
    # persistent+linear then persistent+sawtooth, H=1, S=131072, D=64, 64x64 tiles
    assert len(rows) == 2
    for row in rows:
        assert row["kernel_name"].startswith("flash_attention_fwd")
        assert set(METRICS.values()) - {"l1_global_load_sectors",
                                        "l1_global_load_hit_sectors"} <= set(row)
    linear = rows[0]
    assert linear["l2_tex_read_sectors"] == 2_044_576_288  # thousands separators removed
    assert linear["dram_read_bytes"] == 267_304_192
    assert linear["ncu_duration_ns"] == 12_355_392


def test_derived_misses_agree_with_dram_reads():
    """Reads that left L2 (from L2 counters) and DRAM read sectors are independent counters of
    the same traffic; on the real capture they agree within 5%."""
    p = AttentionProblem(1, 1, 1, 131072, 131072, 64, tile_m=64, tile_n=64)
    counts = launch_counts(p)
    for row in parse_ncu_csv(FIXTURE.read_text()):
        d = derive(row, counts.read_sectors, counts.compulsory_read_bytes)
        assert d["l2_read_miss_sectors"] == pytest.approx(d["dram_read_sectors"], rel=0.05)
        assert 0.9 < d["read_sectors_ratio"] < 1.0
        assert 0.99 < d["sm_hit_rate"] <= 1.0
    linear, sawtooth = (derive(r, None, None) for r in parse_ncu_csv(FIXTURE.read_text()))
    assert sawtooth["l2_read_miss_sectors"] < 0.5 * linear["l2_read_miss_sectors"]


def test_units_and_blank_values():
    text = ('"ID","Kernel Name","dram__bytes_read.sum","gpu__time_duration.sum"\n'
            '"","","Mbyte","usecond"\n'
            '"0","k","1,234.5","n/a"\n')
    (row,) = parse_ncu_csv(text)
    assert row["dram_read_bytes"] == pytest.approx(1234.5e6)
    assert row["ncu_duration_ns"] is None
    assert parse_ncu_csv("==PROF== nothing profiled\n") == []


def test_counter_permission_error_is_explained():
    with pytest.raises(ProfilerError, match="ERR_NVGPUCTRPERM"):
        check_ncu_output("==ERROR== ERR_NVGPUCTRPERM - The user does not have permission", "")
    check_ncu_output("fine", "")


def test_missing_ncu_is_explained(monkeypatch):
    monkeypatch.setattr("wavefront.profiling.find_ncu", lambda: None)
    with pytest.raises(ProfilerError, match="ncu"):
        profile_points([{"key": "x"}], timeout_s=1)


def test_ncu_command_profiles_only_the_measured_launch():
    cmd = ncu_command("ncu", "/tmp/log.csv", ["python", "-m", "wavefront.worker"])
    joined = " ".join(cmd)
    assert "--profile-from-start off" in joined
    assert "--cache-control all" in joined and "--replay-mode kernel" in joined
    assert "--clock-control none" in joined
    assert "--kernel-name regex:flash_attention_fwd" in joined
    assert "--log-file /tmp/log.csv" in joined


H100_FIXTURE = Path(__file__).parent / "fixtures" / "ncu_raw_h100_s131072_d64_tiled.csv"


def test_parses_real_h100_capture_with_a_two_kernel_point():
    """H100, S=131072 D=64 64x64: persistent linear, sawtooth, tiled (attention + combine)."""
    rows = parse_ncu_csv(H100_FIXTURE.read_text())
    assert [r["kernel_name"].split("_Kt")[0] for r in rows] == [
        "flash_attention_fwd", "flash_attention_fwd", "flash_attention_fwd", "combine_partials"]
    tiled = combine_kernel_rows(rows[2:4])
    for column in ("l2_tex_read_sectors", "dram_read_bytes", "ncu_duration_ns"):
        assert tiled[column] == rows[2][column] + rows[3][column]
    lo, hi = sorted((rows[2]["sm_throughput_pct"], rows[3]["sm_throughput_pct"]))
    assert lo <= tiled["sm_throughput_pct"] <= hi
    for row in (rows[0], rows[1], tiled):
        d = derive(row, None, None)
        assert d["l2_read_miss_sectors"] == pytest.approx(d["dram_read_sectors"], rel=0.05)
    # Sawtooth leaves L2 less often than linear on the H100 too.
    assert derive(rows[1], None, None)["l2_read_miss_sectors"] < 0.6 * derive(
        rows[0], None, None)["l2_read_miss_sectors"]
