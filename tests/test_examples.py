"""The numbered examples run as a user runs them: each in a fresh process from the
repository root, to the end, printing what it says it prints. The CPU ones run here; the
GPU ones (marked gpu) on a GPU host."""
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[1]
EXAMPLES = sorted((ROOT / "examples").glob("[0-9][0-9]_*.py"))
GPU = {"01_attention.py", "02_torch.py", "03_varlen.py", "04_sweep.py"}


def _run(example: Path, *args) -> str:
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    done = subprocess.run([sys.executable, str(example), *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, f"{example.name}:\n{done.stdout}\n{done.stderr}"
    return done.stdout


def test_the_examples_are_numbered_and_each_says_what_it_needs():
    names = [p.name for p in EXAMPLES]
    assert names[:6] == ["01_attention.py", "02_torch.py", "03_varlen.py", "04_sweep.py",
                         "05_read_results.py", "06_simulate_advise.py"]
    for path in EXAMPLES:
        doc = path.read_text().split('"""')[1]
        assert f"python examples/{path.name}" in doc, path.name
        assert ("(GPU" in doc) == (path.name in GPU), f"{path.name}: GPU or CPU, said once"


def test_reading_results_prints_each_schedules_dram_reads():
    out = _run(ROOT / "examples" / "05_read_results.py")
    assert "persistent+linear" in out and "persistent+sawtooth" in out
    assert "median" in out and "16384" in out


def test_the_model_predicts_every_byte_read_at_least_once_for_both_scan_orders():
    out = _run(ROOT / "examples" / "06_simulate_advise.py")
    lines = {line.split()[0]: line for line in out.splitlines() if "DRAM reads" in line}
    assert set(lines) == {"persistent+linear", "persistent+sawtooth"}, out
    for line in lines.values():
        reads = float(line.split("DRAM reads")[1].split("MB")[0])
        once = float(line.split("each byte once:")[1].split("MB")[0])
        assert once > 0 and reads >= once, line
        assert float(line.split("kernel")[1].split("ms")[0]) > 0, line


@pytest.mark.gpu
@pytest.mark.parametrize("name", sorted(GPU - {"04_sweep.py"}))
def test_a_gpu_example_runs_and_checks_its_output(name):
    out = _run(ROOT / "examples" / name)
    assert "error" in out or "difference" in out, out


@pytest.mark.gpu
def test_the_sweep_example_measures_and_reads_back(tmp_path):
    out = _run(ROOT / "examples" / "04_sweep.py", str(tmp_path / "sweep"))
    assert "median" in out and (tmp_path / "sweep" / "results.csv").exists()
