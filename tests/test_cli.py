"""The CLI through click's test runner (CPU only)."""
import json

import pytest
from click.testing import CliRunner

from wavefront.cli import main
from wavefront.device import has_gpu

no_gpu = pytest.mark.skipif(has_gpu(), reason="checks the CPU-only messages")


@no_gpu
def test_info_on_cpu_only_machine():
    result = CliRunner().invoke(main, ["info"])
    assert result.exit_code == 0
    assert "GPU: none visible" in result.output
    assert "cuda_tile: 1.7" in result.output
    data = json.loads(CliRunner().invoke(main, ["info", "--json"]).output)
    assert data["gpu"] is None and data["cuda_tile"].startswith("1.7")


@pytest.mark.compile
def test_compile_one_variant():
    result = CliRunner().invoke(main, ["compile", "--arch", "sm_90", "--filter",
                                       "d64_128x64_causal_persistent+sawtooth", "-j", "1"])
    assert result.exit_code == 0, result.output
    line = [ln for ln in result.output.splitlines() if "persistent+sawtooth" in ln][0]
    assert "regs" in line and "FAILED" not in line
    assert "1 compiled, 0 failed" in result.output


def test_compile_filter_matching_nothing():
    result = CliRunner().invoke(main, ["compile", "--filter", "no-such-variant"])
    assert result.exit_code == 2
    assert "--filter" in result.output


@no_gpu
@pytest.mark.parametrize("cmd", [["run"], ["bench", "--no-peers"], ["profile"]])
def test_measuring_commands_explain_missing_gpu(cmd):
    result = CliRunner().invoke(main, cmd)
    assert result.exit_code == 1
    assert "no CUDA GPU is visible" in result.output


@pytest.mark.parametrize("args,hint", [
    (["bench", "--schedule", "persistent+diagonal"], "--schedule"),
    (["bench", "--seqlen", "0"], "--seqlen"),
    (["run", "--tile", "32x32"], "tiles"),
    (["run", "--head-dim", "96"], "--head-dim"),
])
def test_bad_arguments_are_named(args, hint):
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 2
    assert hint in result.output
