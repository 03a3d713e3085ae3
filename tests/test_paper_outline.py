"""The experiments package names where each section goes: DRAFT (the paper, with PARTS opening
its numbered parts) or one of APPENDICES; a section listed twice, nowhere, or a part opened by a
section the paper does not print, is refused with the package's file named (CPU, fast)."""
import pytest

from wavefront.report.experiments import discover

SECTION = ("from wavefront.report.draft import Section\n\n"
           "def section(study):\n    return Section('## {name}')\n")


def _package(tmp_path, init: str, names=("a", "b", "c")):
    pkg = tmp_path / f"exp_{abs(hash(init)) % 10**8}"
    pkg.mkdir()
    (pkg / "__init__.py").write_text(init)
    for name in names:
        (pkg / f"{name}.py").write_text(f'"""Question {name}?"""\n' + SECTION.format(name=name))
    return pkg


def test_the_paper_and_its_appendices_are_read_from_the_package(tmp_path):
    pkg = _package(tmp_path, 'DRAFT = ("b", "a")\nPARTS = {"b": "Results"}\n'
                             'APPENDICES = {"extra": ("c",)}\n')
    found = discover(pkg)
    assert found.draft == ("b", "a") and found.parts == {"b": "Results"}
    assert found.appendices == {"extra": ("c",)} and found.in_appendix == {"c": "extra"}


@pytest.mark.parametrize("init, message", [
    ('DRAFT = ("a", "b")\nAPPENDICES = {"x": ("b", "c")}\n', "listed more than once"),
    ('DRAFT = ("a", "b")\n', "neither DRAFT nor APPENDICES lists them"),
    ('DRAFT = ("a", "b", "c")\nPARTS = {"z": "Results"}\n', "PARTS names"),
    ('DRAFT = ("a", "b")\nAPPENDICES = {"x": ("c", "d")}\n', "not experiment files"),
])
def test_a_section_placed_twice_or_nowhere_is_refused(tmp_path, init, message):
    pkg = _package(tmp_path, init)
    with pytest.raises(ValueError, match=message) as info:
        discover(pkg)
    assert "__init__.py" in str(info.value)
