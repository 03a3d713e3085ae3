"""The GPU bundle (scripts/build_gpu_bundle.sh) carries what a host without package access
needs: the compiler's three wheels at one CUDA version, cuda-tile, and Dask for `--gpus N`
with every requirement of it that the hosts' image lacks; setup_gpu_host.sh installs what it
carries. Read from the scripts themselves (nothing is downloaded here)."""
import importlib.metadata
import re
import shlex
from pathlib import Path

import pytest
from packaging.requirements import Requirement

SCRIPTS = Path(__file__).parents[1] / "scripts"
BUILD = (SCRIPTS / "build_gpu_bundle.sh").read_text()
SETUP = (SCRIPTS / "setup_gpu_host.sh").read_text()
HOST_PYTHON = {"python_version": "3.12", "python_full_version": "3.12.0", "sys_platform": "linux",
               "platform_system": "Linux", "platform_machine": "x86_64", "extra": ""}


def _array(name: str) -> list[str]:
    """A bash array assigned in the build script (`NAME=(a b c)`, lines may continue)."""
    match = re.search(rf"^{name}=\(([^)]*)\)", BUILD, re.M)
    assert match, f"build_gpu_bundle.sh assigns no {name}=(...)"
    return shlex.split(match.group(1), comments=True)


def _canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def test_the_bundle_carries_the_compiler_cuda_tile_and_dask():
    assert _array("COMPILER_WHEELS") == ["nvidia-cuda-tileiras", "nvidia-cuda-nvcc",
                                         "nvidia-nvvm"]
    assert '"${COMPILER_WHEELS[@]/%/==${TK}.*}"' in BUILD  # one major.minor for the three
    assert re.search(r'-d bundle "cuda-tile==\$\{CUDA_TILE_VERSION\}"', BUILD)
    assert {"dask", "distributed"} <= set(_array("DASK_WHEELS"))
    assert '"${dask_specs[@]}"' in BUILD and "-d bundle/wheels" in BUILD
    # The host is Python 3.12 on x86-64: every download asks for its wheels, binary only.
    assert BUILD.count('"${for_host[@]}"') == 3
    assert "--python-version 3.12" in BUILD and "--only-binary=:all:" in BUILD


def test_dasks_requirements_are_bundled_or_on_the_host():
    """Every requirement of the installed dask and distributed (for Python 3.12, no extras)
    is a wheel the bundle carries or a package the hosts' image has."""
    try:
        requires = [r for name in ("dask", "distributed")
                    for r in importlib.metadata.requires(name) or ()]
    except importlib.metadata.PackageNotFoundError:
        pytest.skip("Dask is not installed here")
    bundled = {_canonical(n) for n in _array("DASK_WHEELS")}
    host = {_canonical(n) for n in _array("HOST_HAS")}
    needed = {_canonical(req.name) for req in map(Requirement, requires)
              if req.marker is None or req.marker.evaluate(HOST_PYTHON)}
    assert needed, requires
    assert needed - bundled - host == set(), "neither bundled nor on the host"
    assert not bundled & host, "bundled although the host has it"


def test_the_host_setup_installs_what_the_bundle_carries():
    assert "pip install -q --no-deps --no-index \"$_wf_root\"/bundle/cuda_tile-*.whl" in SETUP
    assert "pip install -q --no-deps --no-index \"$_wf_root\"/bundle/wheels/*.whl" in SETUP
    assert "bundle/tileiras-*.tar.xz" in SETUP and "unset CUDA_HOME CUDA_PATH" in SETUP
    # A tarball built without ptxas or libnvvm falls back on the host toolkit's.
    assert 'PATH="$PATH:/usr/local/cuda/bin"' in SETUP
    assert "/usr/local/cuda/nvvm/lib64" in SETUP
    for option in ("WAVEFRONT_HOST_PTXAS", "WAVEFRONT_HOST_NVVM"):
        assert f'"${{{option}:-0}}" != 1' in BUILD


def test_the_build_refuses_a_bundle_over_the_cap():
    assert "CAP_BYTES=$((64 * 1024 * 1024))" in BUILD
    assert re.search(r'-gt "\$CAP_BYTES" \]; then\n.*\n\s+exit 1', BUILD)
