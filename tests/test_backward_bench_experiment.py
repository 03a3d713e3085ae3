"""experiments/backward_bench.py on the committed data (CPU): the ratios it computes are the
bench's own (today's run and the first cut's), its section's claims hold, and made-up runs
where wavefront beats cuDNN, or reaches it in rounds where cuDNN ran steadily, fail the claim
they would contradict."""
import gzip
import json
import shutil
from pathlib import Path

import pytest

from wavefront.report.analysis import Study
from wavefront.report.experiments import discover

ROOT = Path(__file__).parent.parent


@pytest.fixture(scope="module")
def experiment():
    return discover(ROOT / "experiments")["backward_bench"].module


@pytest.mark.parametrize("run", ["RUN", "FIRST_CUT"])
def test_the_paired_ratios_are_the_ones_the_bench_recorded(experiment, run):
    """The experiment pairs rounds itself; the bench printed and recorded the same ratios (in
    today's run and in the first cut's)."""
    name = getattr(experiment, run)
    rows = [json.loads(line) for line in gzip.open(ROOT / "data/backward_bench" / f"{name}.gz")]
    recorded = {(f"{r['shape']} D{r['head_dim']} {'causal' if r['causal'] else 'full'}",
                 r["name"]): r["x_cudnn"] for r in rows if "x_cudnn" in r}
    t = experiment.ratios(Study(ROOT / "data"), name)
    mine = t[t["contender"] != "cudnn"]
    assert len(mine) == len(recorded) == 36
    for _, r in mine.iterrows():
        want = recorded[(r["config"], r["contender"])]
        assert [r["x cudnn"], r["x cudnn lo"], r["x cudnn hi"]] == pytest.approx(want)
    tidy = experiment.load(Study(ROOT / "data"), name)
    (rounds,) = {len(r["samples_ms"]) for r in rows}
    assert rounds == {"RUN": 8, "FIRST_CUT": 10}[run]
    assert len(tidy) == 48 * rounds and set(tidy["contender"]) == set(experiment.CONTENDERS)
    assert (tidy[tidy["contender"] == "cudnn"]["x_cudnn"] == 1).all()


def _rewritten_run(experiment, tmp_path, change) -> Study:
    """A copy of the data whose paper run's records `change(rows)` has edited."""
    data = tmp_path / "data" / "backward_bench"
    shutil.copytree(ROOT / "data/backward_bench", data)
    rows = [json.loads(line) for line in gzip.open(data / f"{experiment.RUN}.gz")]
    change(rows)
    (data / f"{experiment.RUN}.gz").unlink()
    (data / experiment.RUN).write_text("".join(json.dumps(r) + "\n" for r in rows))
    return Study(tmp_path / "data")


def _peer(rows, r, name):
    return next(c for c in rows if c["name"] == name and c["shape"] == r["shape"]
                and c["head_dim"] == r["head_dim"] and c["causal"] == r["causal"])


def test_the_section_holds_on_the_committed_data(experiment):
    section = experiment.section(Study(ROOT / "data"))
    failed = [c.text[:80] for c in section.claims if not c.holds]
    assert not failed, failed
    assert "predicted, then measured" in section.text
    assert "none tested by a control" in section.text


def test_a_run_faster_than_cudnn_fails_the_claim_it_would_contradict(experiment, tmp_path):
    def faster(rows):  # the deterministic mode made 3x faster than cuDNN in every round
        for r in rows:
            if r["name"] == "wavefront_det":
                r["samples_ms"] = [ms / 3 for ms in _peer(rows, r, "cudnn")["samples_ms"]]
    section = experiment.section(_rewritten_run(experiment, tmp_path, faster))
    assert section.claims[0].text.startswith(f"On the H200 at commit {experiment.RUN_COMMIT}")
    assert not section.claims[0].holds


def test_an_interval_reaching_cudnn_with_steady_cudnn_rounds_fails_the_claim(experiment,
                                                                           tmp_path):
    """The claim excuses an interval that reaches 1 only where cuDNN's own rounds spread; one
    reached by wavefront's rounds (two rounds of the deterministic mode as fast as cuDNN's at a
    configuration where cuDNN ran steadily) fails it; the committed run, with no interval
    reaching 1, names no exception."""
    committed = experiment.section(Study(ROOT / "data")).claims[0]
    assert committed.holds and "every 95% interval below 1;" in committed.text

    def level(rows):
        r = next(r for r in rows if r["name"] == "wavefront_det" and r["head_dim"] == 128
                 and r["shape"] == "B1 H32 S8k" and r["causal"])
        cudnn = _peer(rows, r, "cudnn")["samples_ms"]
        r["samples_ms"] = [cudnn[i] if i < 2 else ms for i, ms in enumerate(r["samples_ms"])]
    claim = experiment.section(_rewritten_run(experiment, tmp_path, level)).claims[0]
    assert "B1 H32 S8k D128 causal's reaches" in claim.text and not claim.holds


def test_the_bench_keeps_each_record_as_it_is_made(tmp_path):
    """A bench cut short by a device call's limit keeps what it measured: every record reaches
    the --json file when it is made, not when the run ends."""
    import importlib.util
    spec = importlib.util.spec_from_file_location("backward_bench_script",
                                                  ROOT / "scripts" / "backward_bench.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    path = tmp_path / "records.jsonl"
    records = script.RecordLog(str(path))
    records.append({"name": "cudnn", "median_ms": 1.5})
    assert [json.loads(line) for line in path.read_text().splitlines()] == [
        {"name": "cudnn", "median_ms": 1.5}]
    records.append({"name": "fa2", "median_ms": 2.5})
    assert len(path.read_text().splitlines()) == 2 and len(records) == 2
    assert script.RecordLog(None).append({"x": 1}) is None  # no file: kept in memory only


def test_the_variant_logs_parse_and_a_faster_than_cudnn_line_fails_its_claim(experiment,
                                                                            tmp_path):
    """The variant runs' console logs (their record) parse into every contender line of every
    configuration; the default config's claim (below cuDNN everywhere) fails on a log where
    it beat cuDNN."""
    v = experiment.variant_rows(Study(ROOT / "data"))
    latest = v[v["run"] == experiment.LATEST_VARIANTS]
    assert latest.groupby(["shape", "D", "mask"]).ngroups == 8
    assert set(latest["contender"]) >= {"det[two_warpgroups]", "det[sass_pick]", "cudnn",
                                        "fa2", "wavefront_det"}
    data = tmp_path / "data" / "backward_bench"
    shutil.copytree(ROOT / "data/backward_bench", data)
    log = data / f"{experiment.LATEST_VARIANTS}.log.gz"
    text = gzip.open(log, "rt").read()
    lines = text.splitlines()
    i = next(k for k, line in enumerate(lines) if line.startswith("  det[two_warpgroups]"))
    lines[i] = lines[i].replace("x cuDNN 0.70 [0.69, 0.71]", "x cuDNN 1.05 [1.02, 1.07]")
    assert lines[i] != text.splitlines()[i]
    with gzip.open(log, "wt") as f:
        f.write("\n".join(lines) + "\n")
    section = experiment.section(Study(tmp_path / "data"))
    claim = [c for c in section.claims if c.text.startswith("Today's default config")]
    assert len(claim) == 1 and not claim[0].holds
