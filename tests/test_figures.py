"""Figures stay readable in print: `figures.save` refuses text under MIN_FONT_PT (CPU, fast)."""
import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402

from wavefront.report import figures  # noqa: E402


def test_small_text_is_raised_to_the_minimum_before_saving(tmp_path):
    with figures.style():
        fig, ax = plt.subplots()
        ax.plot([1, 2], [1, 2], label="a series")
        legend = ax.legend(fontsize=7)
        assert figures.small_text(fig)
        figures.save(fig, "small", tmp_path)
    assert min(t.get_fontsize() for t in legend.get_texts()) == pytest.approx(9.0)
    assert (tmp_path / "small.png").exists()


def test_the_theme_writes_nothing_under_the_minimum(tmp_path):
    with figures.style():
        fig, ax = plt.subplots()
        ax.plot([1, 2], [1, 2], label="a series")
        ax.set(xlabel="x (units)", ylabel="y (units)", title="a title")
        ax.legend()
        assert figures.small_text(fig) == []
        (path,) = figures.save(fig, "readable", tmp_path)
    assert path.stat().st_size > 1000
