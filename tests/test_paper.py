"""`wavefront paper` regenerates every figure and the draft from the committed data (CPU), each
experiment's `plot` draws the same bytes, and the draft refuses claims the data contradicts."""
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from wavefront.report import draft, paper
from wavefront.report.analysis import Study
from wavefront.report.experiments import discover, readme_table
from wavefront.results.store import read_results_bytes

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
    experiments = discover(EXPERIMENTS)
    for name, exp in experiments.items():
        path = paper.figure_dir(out, name, experiments) / f"{name}.png"
        assert path.exists() == exp.has_figure, path
        assert not exp.has_figure or path.stat().st_size > 5000, path
    assert sum(e.has_figure for e in experiments.values()) >= 15


def test_draft_numbers_come_from_data(built):
    out, summary = built
    text = "\n".join(p.read_text() for p in [out / "draft.md",
                                            *sorted(out.glob("appendix_*.md"))])
    assert "nan" not in text.lower().replace("nanos", "")
    assert "{" not in text.replace("{:", "")  # every template field filled
    # the out-of-sample scores the draft shows are the ones fits.json carries
    for e in summary["out_of_sample"]["capacity"]:
        if e["held out"].startswith("all"):
            assert f"| {e['GPU']} | {e['held out']} | {e['model']} | {e['n']} | " \
                   f"{e['mape']:.0%} |" in text
    refs = re.findall(r"\((figures/[a-z0-9_/]+\.png)\)", text)
    assert refs and all((out / ref).exists() for ref in refs)
    assert all(c["holds"] for c in summary["claims"])


def test_plot_writes_the_same_bytes_as_the_paper(built, tmp_path, run_each):
    """Every experiment's `plot --out DIR` (a separate process, as a user runs it) draws the
    paper's figure byte for byte, and leaves the repository untouched."""
    out, _ = built
    before = subprocess.run(["git", "-C", str(ROOT), "status", "--porcelain"],
                            capture_output=True, text=True).stdout
    experiments = discover(EXPERIMENTS)
    done = run_each([[sys.executable, str(EXPERIMENTS / f"{name}.py"), "plot", "--out",
                      str(tmp_path / name)] for name in experiments],
                    capture_output=True, text=True, timeout=600)
    for (name, exp), res in zip(experiments.items(), done):
        target = tmp_path / name
        assert res.returncode == 0, res.stderr
        if not exp.has_figure:
            assert "has no figure" in res.stderr and not list(target.glob("*.png")), name
            continue
        assert (target / f"{name}.png").read_bytes() == (
            paper.figure_dir(out, name, experiments) / f"{name}.png").read_bytes(), name
    after = subprocess.run(["git", "-C", str(ROOT), "status", "--porcelain"],
                           capture_output=True, text=True).stdout
    assert after == before


def test_model_meets_its_targets_on_the_committed_data(built):
    """Out of sample, the unfitted partition model beats the fitted capacity over all held-out
    points on every GPU; in sample the fit is within 15%."""
    _, summary = built
    overall = {(e["GPU"], e["model"]): e["mape"] for e in summary["out_of_sample"]["capacity"]
               if e["held out"].startswith("all")}
    assert overall
    for gpu in {g for g, _ in overall}:
        assert overall[gpu, "partitions"] < overall[gpu, "fitted LRU"], gpu
    for gpu, e in summary["in_sample"]["capacity_fits"].items():
        assert e["mape"] < 0.15, gpu


@pytest.mark.xfail(strict=True, reason=(
    "missed since the knee was re-measured with today's kernel (d126e9c): its long-S launches "
    "read more DRAM than any LRU capacity predicts (20-36% MAPE beyond the fit; the first "
    "kernel's knee gave 8-14%), the drift of experiments/kernel_drift.py; a model with a clock "
    "(issue 21) is the open fix. Strict: passing again fails, so the mark goes when it does."))
def test_capacity_models_extrapolate_the_knee_within_15_percent(built):
    """Every capacity model extrapolates the knee sweep past its fitted lengths within 15% MAPE
    per GPU (above the knee)."""
    _, summary = built
    beyond = [e for e in summary["out_of_sample"]["capacity"] if "beyond" in e["held out"]]
    assert beyond and all(e["mape"] < 0.15 for e in beyond)


def test_a_claim_the_data_contradicts_stops_the_build(tmp_path):
    """Two corruptions in a copy of the data, each caught by the claim it contradicts. (They
    touch no input of the model cache, so the copy builds from the cached simulations.)"""
    data = tmp_path / "data"
    shutil.copytree(ROOT / "data", data)
    packed = data / "bench_rounds" / "run2.jsonl.gz"
    lines = read_results_bytes(packed).decode().splitlines()
    first = json.loads(lines[0])
    first["median_ms"] *= 1.10  # the second run of the bench no longer agrees with the first
    packed.unlink()  # the plain file in its place (the study reads either)
    (data / "bench_rounds" / "run2.jsonl").write_text(
        "\n".join([json.dumps(first), *lines[1:]]) + "\n")
    numbers = draft.compute(Study(data), discover(EXPERIMENTS))
    with pytest.raises(draft.ClaimFailed, match="interleaved bench repeats"):
        draft.render(numbers)


def test_the_experiments_page_lists_exactly_the_experiments():
    page = (ROOT / "docs" / "experiments.md").read_text()
    assert readme_table(discover(EXPERIMENTS)) in page, (
        "docs/experiments.md's table is stale: replace it with "
        "wavefront.report.experiments.readme_table(discover(Path('experiments')))")
    assert "docs/experiments.md" in (ROOT / "README.md").read_text()


def test_the_draft_is_the_experiments_sections_in_order(built):
    """Every section of the draft comes from the experiment DRAFT lists, in DRAFT's order."""
    out, _ = built
    text = (out / "draft.md").read_text()
    experiments = discover(EXPERIMENTS)
    study = Study(ROOT / "data")
    starts = [text.index(experiments[name].section(study).text.strip().splitlines()[0])
              for name in experiments.draft]
    assert starts == sorted(starts) and len(set(starts)) == len(starts)
    assert len(experiments.draft) >= 8
    for appendix, names in experiments.appendices.items():
        body = (out / f"appendix_{appendix}.md").read_text()
        starts = [body.index(experiments[name].section(study).text.strip().splitlines()[0])
                  for name in names]
        assert starts == sorted(starts), appendix


def _reads_data(name) -> bool:
    """Whether an experiment reads measured data (the phase diagram is the model's alone)."""
    exp = discover(EXPERIMENTS)[name]
    return bool(exp.datasets or exp.records)


@pytest.mark.parametrize("name", [n for n in (*discover(EXPERIMENTS).draft, *(
    n for names in discover(EXPERIMENTS).appendices.values() for n in names))
    if _reads_data(n)])
def test_a_section_without_its_data_fails_naming_it(tmp_path, name):
    """A missing data set fails the build with its name; it never empties a section."""
    from wavefront.results.store import SchemaError
    empty = tmp_path / "data"
    empty.mkdir()
    with pytest.raises((SchemaError, ValueError, KeyError, OSError)) as info:
        discover(EXPERIMENTS)[name].section(Study(empty))
    assert str(empty) in str(info.value), (name, info.value)


def test_first_kernel_commits_match_git_ancestry():
    """Every commit named in a committed manifest is labelled first kernel exactly when it is
    not a descendant of the table-driven kernel's commit (skipped without git history)."""
    import glob

    from wavefront.results.store import read_results_bytes

    from wavefront.report.draft import FIRST_KERNEL_COMMITS, TABLE_KERNEL_COMMIT
    root = Path(__file__).resolve().parents[1]
    probe = subprocess.run(["git", "-C", str(root), "cat-file", "-e", TABLE_KERNEL_COMMIT],
                           capture_output=True)
    if probe.returncode != 0:
        pytest.skip("no git history here")
    commits = set()
    for path in glob.glob(str(root / "data" / "**" / "manifest.json*"), recursive=True):
        for run in json.loads(read_results_bytes(path)).values():
            if isinstance(run, dict) and run.get("git_commit"):
                commits.add(str(run["git_commit"])[:7])
    checked = 0
    for commit in sorted(commits):
        rc = subprocess.run(["git", "-C", str(root), "merge-base", "--is-ancestor",
                             TABLE_KERNEL_COMMIT, commit], capture_output=True).returncode
        if rc not in (0, 1):
            continue  # a commit this clone does not have
        checked += 1
        assert (rc == 1) == (commit in FIRST_KERNEL_COMMITS), commit
    assert checked >= len(FIRST_KERNEL_COMMITS)


def test_the_paper_regenerates_byte_for_byte(built, tmp_path):
    """The committed paper (the draft, fits.json) is what the committed data builds, and a
    build in a fresh process (another interpreter, its own hash seed) writes the same bytes:
    those and every figure."""
    out, _ = built
    fresh = tmp_path / "fresh"
    subprocess.run([sys.executable, "-m", "wavefront.cli", "paper", "--data", str(ROOT / "data"),
                    "--experiments", str(EXPERIMENTS), "--out", str(fresh)], check=True,
                   cwd=tmp_path, capture_output=True, env={**os.environ,
                                                           "PYTHONHASHSEED": "12345"})
    names = (["draft.md", "fits.json"] + [p.name for p in sorted(out.glob("appendix_*.md"))]
             + [str(p.relative_to(out)) for p in sorted((out / "figures").rglob("*.png"))])
    committed_pngs = {p.name for p in (ROOT / "paper" / "figures").glob("*.png")}
    assert committed_pngs == {p.name for p in (out / "figures").glob("*.png")}, \
        "paper/figures/ holds exactly the paper's figures (appendix figures are not committed)"
    for name in names:
        built_bytes = (out / name).read_bytes()
        assert (fresh / name).read_bytes() == built_bytes, f"{name}: a fresh process differs"
        if name.startswith("figures/"):
            continue  # not committed (the repository's size): derived from data/ each build
        committed = (ROOT / "paper" / name).read_bytes()
        if name == "fits.json":
            # The fits' optimisers end a few ulps apart on another CPU's BLAS (relative 1e-9
            # to 2e-6 between two x86 machines): the same numbers, not the same last digits.
            _assert_same_numbers(json.loads(committed), json.loads(built_bytes), name)
            continue
        assert committed == built_bytes, \
            f"paper/{name}: the committed file is not what the committed data builds"


def _assert_same_numbers(committed, built, where: str, rel: float = 1e-4) -> None:
    """Equal JSON, floats within `rel` of each other (everything else exactly)."""
    if isinstance(committed, dict) and isinstance(built, dict):
        assert committed.keys() == built.keys(), f"{where}: keys differ"
        for key in committed:
            _assert_same_numbers(committed[key], built[key], f"{where}/{key}", rel)
    elif isinstance(committed, list) and isinstance(built, list):
        assert len(committed) == len(built), f"{where}: lengths differ"
        for i, (a, b) in enumerate(zip(committed, built)):
            _assert_same_numbers(a, b, f"{where}[{i}]", rel)
    elif isinstance(committed, float) and isinstance(built, float):
        assert committed == pytest.approx(built, rel=rel, abs=1e-12, nan_ok=True), \
            f"paper/{where}: {committed} committed, {built} built"
    else:
        assert committed == built, f"paper/{where}: the committed file is not what the data builds"


def test_the_committed_fits_are_compared_number_by_number():
    """The tolerance of the fits' comparison is for last digits, not for a changed fit."""
    _assert_same_numbers({"a": [1.0, {"b": 0.26210260096825927}]},
                         {"a": [1.0, {"b": 0.26210260181279454}]}, "fits.json")
    for built in ({"a": [1.001, {"b": 0.2621026}]}, {"a": [1.0, {"c": 0.2621026}]},
                  {"a": [1.0]}, {"a": [1.0, {"b": "0.2621026"}]}):
        with pytest.raises(AssertionError):
            _assert_same_numbers({"a": [1.0, {"b": 0.2621026}]}, built, "fits.json")


def test_current_fits_and_scores_use_only_todays_kernel():
    """The throughput model and the capacity scores are fitted and scored on data measured
    with the table-driven kernel only: no first-kernel run in any of their data sets."""
    from wavefront.report.analysis import TIMED_EXPERIMENTS, VALIDATION_FAMILIES
    from wavefront.report.draft import kernel_generation
    study = Study(ROOT / "data")
    for name in sorted(set(TIMED_EXPERIMENTS) | set(VALIDATION_FAMILIES)):
        runs = study.manifest(name)
        assert runs, name
        first = [r for r, run in runs.items() if kernel_generation(run) == "first"]
        assert not first, f"{name}: runs {first} used the first kernel"


def test_each_prediction_lies_in_its_nudged_spread():
    """The timed model's predictions for unmeasured GPUs carry the range of the simulations
    with the calibration nudged (the draft prints it where a printed digit moves): the point
    prediction is one of those simulations, so it lies inside, at both compute rates."""
    from wavefront.report import timed
    pred = timed.predictions(Study(ROOT / "data"))
    assert len(pred) == 4  # B200, both masks, both compute rates (GB10: its own postdiction)
    for column in ("dram_read_gb", "dram_read_gb_fast", "tflops", "tflops_fast"):
        assert (pred[f"{column}_min"] <= pred[column]).all(), column
        assert (pred[column] <= pred[f"{column}_max"]).all(), column


def test_fits_json_keeps_the_start_of_a_long_evidence():
    """A claim's evidence is kept whole up to EVIDENCE_KEPT characters, longer ones cut there
    with how much was left out; the committed fits.json holds none longer."""
    from wavefront.report.paper import EVIDENCE_KEPT, kept_evidence
    short = "x" * EVIDENCE_KEPT
    assert kept_evidence(short) == short
    cut = kept_evidence("y" * (EVIDENCE_KEPT + 7))
    assert cut.startswith("y" * EVIDENCE_KEPT + " ... [7 more characters")
    committed = json.loads((ROOT / "paper" / "fits.json").read_text())["claims"]
    assert all(len(c["evidence"]) <= len(kept_evidence("z" * (EVIDENCE_KEPT + 99999)))
               for c in committed)


MAIN_PARTS = ("Abstract", "Introduction", "Background and related work", "Method", "Results",
              "Where a miss costs time", "The model", "What is still missing",
              "Threats to validity", "Conclusion", "References")


def test_the_paper_has_its_outline_and_length(built):
    """The paper reads as a paper: its parts in order, Table 1 first, 40-56 KB of markdown (about
    10-12 printed pages), the appendices beside it; numbered figures with captions."""
    out, _ = built
    text = (out / "draft.md").read_text()
    heads = [re.search(rf"^## (\d+\. )?{re.escape(part)}$", text, re.MULTILINE)
             for part in MAIN_PARTS]
    assert all(heads), [p for p, h in zip(MAIN_PARTS, heads) if not h]
    starts = [h.start() for h in heads]
    assert starts == sorted(starts)
    numbers = [int(h.group(1)[:-2]) for h in heads if h.group(1)]
    assert numbers == list(range(1, len(numbers) + 1))
    assert 40_000 <= len(text.encode()) <= 56_000, len(text.encode())
    assert text.index("*Table 1.") < text.index("## 2. Background")
    experiments = discover(EXPERIMENTS)
    assert sorted(p.name for p in out.glob("appendix_*.md")) == sorted(
        f"appendix_{a}.md" for a in experiments.appendices)
    figures = re.findall(r"!\[Figure (\d+)\]\(figures/[a-z0-9_]+\.png\)\n\n\*Figure (\d+)\. ",
                         text)
    assert figures and [int(a) for a, _ in figures] == list(range(1, len(figures) + 1))
    assert all(a == b for a, b in figures)


TRACKER_WORDS = re.compile(r"\bissue #?\d+|\bissues #\d+|the issue's|this issue\b",
                           re.IGNORECASE)


def test_no_tracker_words_in_the_paper(built):
    """The paper and its appendices speak of the study, not of the tracker it was run from."""
    out, _ = built
    for path in [out / "draft.md", *sorted(out.glob("appendix_*.md"))]:
        found = TRACKER_WORDS.findall(path.read_text())
        assert not found, (path.name, found[:5])


def test_evidence_numbers_are_written_at_the_stated_precision():
    """fits.json's numbers, inside evidence strings too, carry at most PRECISION significant
    digits, so another machine's last-digit differences do not reach the file."""
    from wavefront.report.paper import PRECISION, rounded_numbers
    assert rounded_numbers("a 2731997494940.15 b -0.26210260096825927 c 12 d 1e-07") == \
        "a 2.732e+12 b -0.262103 c 12 d 1e-07"
    assert rounded_numbers("2731997495555.377") == rounded_numbers("2731997494940.15")
    committed = json.loads((ROOT / "paper" / "fits.json").read_text())
    for claim in committed["claims"]:
        for number in re.findall(r"(?<![\w.])-?\d+\.\d+(?:[eE][-+]?\d+)?", claim["evidence"]):
            digits = number.lstrip("-").split("e")[0].split("E")[0].replace(".", "").lstrip("0")
            assert len(digits) <= PRECISION, (claim["text"][:60], number)


def test_a_printed_bound_is_checked_at_its_printed_precision():
    """The front matter prints "within X" rounded away from the data (up for at most, down for
    at least) and its claim checks the data against X read back from the printed text."""
    from wavefront.report.markdown import bound
    assert bound(0.000209, 3) == ("0.021%", pytest.approx(0.00021, rel=1e-8))
    text, value = bound(0.0002101, 3)
    assert text == "0.022%" and value >= 0.0002101
    assert bound(0.5449, 2, percent=False)[0] == "0.55"
    text, value = bound(0.8841, 2, percent=False, up=False)
    assert text == "0.88" and 0.8841 >= value and value == pytest.approx(0.88)
    assert bound(0.54, 2, percent=False)[0] == "0.54"  # no step up from float fuzz
    text, value = bound(abs(0.99 - 1), 2)
    assert text == "1.00%" and abs(0.99 - 1) <= value and not 0.0101 <= value


def test_front_matter_claims_fail_where_their_data_contradict_the_sentence():
    """Two of the front matter's guards on made-up tables: the scan direction's cost above the
    printed bound's limit, and long-scoreboard stalls that do not fall in the hint's binary."""
    from types import SimpleNamespace
    import pandas as pd
    from wavefront.report import front_matter

    def experiments(name, **tables):
        return {name: SimpleNamespace(module=SimpleNamespace(**{
            k: (lambda study, t=t: t) for k, t in tables.items()}))}

    def holds(fn, exps):
        n = draft.DraftNumbers()
        fn(n, None, exps)
        return [c.holds for c in n.claims]

    rows = pd.DataFrame({"shape": ["B1 H32 S8k D64"] * 2,
                         "schedule": ["persistent+sawtooth", "grid+sawtooth"]})
    assert holds(front_matter._one_binary, experiments(
        "schedule_cost", study_rows=rows.assign(**{"vs linear": [1.004, 0.99]}))) == [True]
    assert holds(front_matter._one_binary, experiments(
        "schedule_cost", study_rows=rows.assign(**{"vs linear": [1.004, 0.95]}))) == [False]
    stalls = pd.DataFrame({"GPU": ["H200", "H200"], "reason": ["long_scoreboard"] * 2,
                           "setting": ["kv_latency=10, 0 MiB held", "default hint, 0 MiB held"],
                           "linear": [3.18, 1.73], "sawtooth": [2.14, 1.73]})
    stalls["sawtooth - linear"] = stalls["sawtooth"] - stalls["linear"]
    assert holds(front_matter._warp_states, experiments("warp_states", table=stalls)) == [True]
    flat = stalls.assign(sawtooth=[3.10, 1.73])
    assert holds(front_matter._warp_states, experiments("warp_states", table=flat)) == [False]
