"""The import contract (`lint-imports`, run by scripts/test.sh) sees the experiments: an
experiment that imports the CLI, or a wavefront module that imports an experiment, breaks it."""
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).parent.parent
LINT = Path(sys.executable).parent / "lint-imports"


def _copy(tmp_path) -> Path:
    tree = tmp_path / "tree"
    tree.mkdir()
    shutil.copy(ROOT / "pyproject.toml", tree)
    for package in ("wavefront", "experiments"):
        shutil.copytree(ROOT / package, tree / package,
                        ignore=shutil.ignore_patterns("__pycache__"))
    return tree


def _lint(tree: Path) -> subprocess.CompletedProcess:
    return subprocess.run([str(LINT), "--no-cache"], cwd=tree, capture_output=True, text=True,
                          timeout=300, env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(tree)})


@pytest.mark.skipif(not LINT.exists(), reason="import-linter is not installed (the test extra)")
@pytest.mark.parametrize("path, line", [
    ("experiments/tiled.py", "from wavefront.cli import main\n"),
    ("wavefront/report/draft.py", "import experiments.knee\n"),
])
def test_an_import_across_the_contract_breaks_it(tmp_path, path, line):
    tree = _copy(tmp_path)
    assert _lint(tree).returncode == 0  # the copy as it is keeps the contract
    with open(tree / path, "a") as f:
        f.write(line)
    res = _lint(tree)
    assert res.returncode != 0 and "BROKEN" in res.stdout, res.stdout[-2000:]
