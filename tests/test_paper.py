"""`wavefront paper` regenerates every figure and the draft from the committed data (CPU), each
experiment's `plot` draws the same bytes, and the draft refuses claims the data contradicts."""
import csv
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from wavefront.report import draft, paper
from wavefront.report.analysis import Study
from wavefront.report.experiments import discover, readme_table

ROOT = Path(__file__).parent.parent
EXPERIMENTS = ROOT / "experiments"
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    out = tmp_path_factory.mktemp("paper")
    summary = paper.build(ROOT / "data", out, EXPERIMENTS, log=lambda m: None)
    return out, summary


def test_every_experiment_figure_is_written(built):
    out, _ = built
    for name in discover(EXPERIMENTS):
        for ext in ("png", "pdf"):
            path = out / "figures" / f"{name}.{ext}"
            assert path.exists() and path.stat().st_size > 5000, path


def test_draft_numbers_come_from_data(built):
    out, summary = built
    text = (out / "draft.md").read_text()
    assert "nan" not in text.lower().replace("nanos", "")
    assert "{" not in text.replace("{:", "")  # every template field filled
    for gpu, e in summary["capacity_fits"].items():
        assert f"{e['capacity_mib']:.1f}" in text
    for ref in re.findall(r"\(figures/([a-z_]+)\.png\)", text):
        assert (out / "figures" / f"{ref}.png").exists()
    assert all(c["holds"] for c in summary["claims"])


def test_plot_writes_the_same_bytes_as_the_paper(built, tmp_path):
    """Every experiment's `plot --out DIR` (a separate process, as a user runs it) draws the
    paper's figure byte for byte, and leaves the repository untouched."""
    out, _ = built
    before = subprocess.run(["git", "-C", str(ROOT), "status", "--porcelain"],
                            capture_output=True, text=True).stdout
    for name in discover(EXPERIMENTS):
        target = tmp_path / name
        res = subprocess.run([sys.executable, str(EXPERIMENTS / f"{name}.py"), "plot",
                              "--out", str(target)], capture_output=True, text=True,
                             timeout=600)
        assert res.returncode == 0, res.stderr
        assert (target / f"{name}.png").read_bytes() == (out / "figures" / f"{name}.png"
                                                          ).read_bytes(), name
    after = subprocess.run(["git", "-C", str(ROOT), "status", "--porcelain"],
                           capture_output=True, text=True).stdout
    assert after == before


def test_model_meets_its_targets_on_the_committed_data(built):
    """The knee sweep: read-miss MAPE under 15% per GPU, and the model fitted on one GPU
    predicting the other within 15% (in-sample for the GPU fitted)."""
    _, summary = built
    for gpu, e in summary["capacity_fits"].items():
        assert e["mape"] < 0.15, gpu
        for other, cross in e["cross_gpu"].items():
            assert cross["mape"] < 0.15, (gpu, other)


def test_a_claim_the_data_contradicts_stops_the_build(tmp_path):
    data = tmp_path / "data"
    shutil.copytree(ROOT / "data", data)
    path = data / "schedules_vs_seqlen" / "results.csv"
    with open(path, newline="") as f:
        rows = list(csv.reader(f))
    col = rows[0].index("read_sectors_ratio")
    row = next(r for r in rows[1:] if r[col])
    row[col] = "1.5"  # the closed form is no longer an upper bound
    with open(path, "w", newline="") as f:
        csv.writer(f, lineterminator="\n").writerows(rows)
    study = Study(data)
    numbers = draft.compute(study, discover(EXPERIMENTS))
    with pytest.raises(draft.ClaimFailed, match="upper bound"):
        draft.render(numbers)


def test_readme_lists_exactly_the_experiments():
    readme = (ROOT / "README.md").read_text()
    assert readme_table(discover(EXPERIMENTS)) in readme
