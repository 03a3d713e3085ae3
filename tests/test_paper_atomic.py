"""`wavefront paper` replaces the paper only when the whole build succeeded (no GPU, no data:
the build itself is stood in for, the swap around it is the real one)."""
import pytest

from wavefront.report import paper


def _committed(tmp_path):
    target = tmp_path / "paper"
    (target / "figures").mkdir(parents=True)
    (target / "draft.md").write_text("the committed draft\n")
    (target / "figures" / "knee.png").write_bytes(b"old figure")
    (target / "notes.txt").write_text("not written by the build\n")
    return target


def _snapshot(directory):
    return {p.relative_to(directory): p.read_bytes()
            for p in sorted(directory.rglob("*")) if p.is_file()}


def test_a_failed_build_leaves_the_committed_paper_untouched(tmp_path, monkeypatch):
    target = _committed(tmp_path)
    before = _snapshot(target)

    def half_then_fail(data_dir, into, experiments_dir, log):
        (into / "figures" / "knee.png").write_bytes(b"new figure")
        (into / "draft.md").write_text("half a new draft")
        raise ValueError("data/headline: results.csv does not load")
    monkeypatch.setattr(paper, "_build_into", half_then_fail)
    with pytest.raises(ValueError, match="headline"):
        paper.build(tmp_path / "data", target, tmp_path / "experiments", log=lambda m: None)
    assert _snapshot(target) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["paper"]  # no scratch left behind


def test_a_whole_build_replaces_what_it_writes_and_keeps_the_rest(tmp_path, monkeypatch):
    target = _committed(tmp_path)

    def whole(data_dir, into, experiments_dir, log):
        (into / "figures" / "knee.png").write_bytes(b"new figure")
        (into / "draft.md").write_text("the new draft\n")
        return {"seconds": 0.0}
    monkeypatch.setattr(paper, "_build_into", whole)
    paper.build(tmp_path / "data", target, tmp_path / "experiments", log=lambda m: None)
    assert _snapshot(target) == {
        target.joinpath("draft.md").relative_to(target): b"the new draft\n",
        target.joinpath("figures", "knee.png").relative_to(target): b"new figure",
        target.joinpath("notes.txt").relative_to(target): b"not written by the build\n"}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["paper"]


def test_a_first_build_creates_the_paper(tmp_path, monkeypatch):
    def whole(data_dir, into, experiments_dir, log):
        (into / "draft.md").write_text("first\n")
        return {"seconds": 0.0}
    monkeypatch.setattr(paper, "_build_into", whole)
    paper.build(tmp_path / "data", tmp_path / "paper", tmp_path / "x", log=lambda m: None)
    assert (tmp_path / "paper" / "draft.md").read_text() == "first\n"
