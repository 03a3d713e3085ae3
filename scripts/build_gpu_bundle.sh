#!/usr/bin/env bash
# Build, on a machine with package access, the bundle a GPU host without it needs:
#   bundle/cuda_tile-<ver>-cp312-*.whl        the cuda-tile wheel for the host's Python 3.12
#   bundle/tileiras-<TK>.tar.xz               tileiras + ptxas + libnvvm, CUDA <TK> (one
#                                             major.minor: a 13.0 ptxas or libnvvm beside a
#                                             13.4 tileiras fails, see below)
#   bundle/tilegym-<ver>.tar.xz               TileGym's package (a bench peer), unpacked files
#   bundle/wheels/*.whl                       Dask (`--gpus N`) and what it needs that the
#                                             host's image lacks
# The bundle is git-ignored; carry it to the host (device `carry: ["bundle"]`) and run
# `source scripts/setup_gpu_host.sh` there. Bundle and repository travel together under 64 MiB:
# the script fails if they do not fit.
#
# WAVEFRONT_HOST_PTXAS=1 leaves ptxas out of the tarball, WAVEFRONT_HOST_NVVM=1 libnvvm
# (setup_gpu_host.sh then takes the host toolkit's, /usr/local/cuda). Tried on a CPU machine
# with CUDA 13.0's ptxas (13.0.88) and libnvvm (nvidia-nvvm 13.0.88) beside tileiras 13.4.92:
# either one from 13.0 makes tileiras fail ("failed to compile Tile IR program", return code 5;
# all three from 13.4 compile the kernel), so both are off by default; docs/measuring.md says
# how to try them on a GPU host.
set -euo pipefail
cd "$(dirname "$0")/.."
CUDA_TILE_VERSION="${CUDA_TILE_VERSION:-1.7.0}"
TK="${TK:-13.4}"
TILEGYM_VERSION="${TILEGYM_VERSION:-1.5.1}"
DASK_VERSION="${DASK_VERSION:-2026.8.0}"
PY="${PYTHON:-python3}"
CAP_BYTES=$((64 * 1024 * 1024))

# The compiler's three wheels (one CUDA major.minor), unpacked into the tarball.
COMPILER_WHEELS=(nvidia-cuda-tileiras nvidia-cuda-nvcc nvidia-nvvm)
# Dask's wheels: `dask[distributed]` and its requirements that the GPU hosts' image does not
# hold (tests/test_bundle.py checks this list against the requirements of the Dask installed
# beside it and HOST_HAS).
DASK_WHEELS=(dask distributed partd locket tblib zict tornado)
# What Dask needs that the hosts' image has (device KINDS.md, "Python packages already there").
HOST_HAS=(click cloudpickle fsspec jinja2 msgpack packaging psutil pyyaml sortedcontainers toolz
          urllib3)

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
rm -rf bundle && mkdir -p bundle/wheels
for_host=(--only-binary=:all: --python-version 3.12 --implementation cp
          --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64
          --platform manylinux_2_27_x86_64 --platform manylinux_2_28_x86_64)

"$PY" -m pip download -q --no-deps "${for_host[@]}" -d bundle "cuda-tile==${CUDA_TILE_VERSION}"
"$PY" -m pip download -q --no-deps "${for_host[@]}" -d "$work/wheels" \
    "${COMPILER_WHEELS[@]/%/==${TK}.*}"

# Dask at one version for both packages (distributed pins dask to its own release).
dask_specs=()
for name in "${DASK_WHEELS[@]}"; do
    case "$name" in
    dask|distributed) dask_specs+=("$name==${DASK_VERSION}") ;;
    tblib) dask_specs+=("tblib!=3.2.0,!=3.2.1") ;;  # distributed's own exclusion
    *) dask_specs+=("$name") ;;
    esac
done
"$PY" -m pip download -q --no-deps "${for_host[@]}" -d bundle/wheels "${dask_specs[@]}"

# TileGym (NVIDIA's cuTile kernels, the bench's same-language peer), its package as one xz
# tarball: the wheel's own files, smaller than the wheel (the transfer cap is tight).
"$PY" -m pip download -q --no-deps --only-binary=:all: -d "$work/tilegym" \
    "tilegym==${TILEGYM_VERSION}"
"$PY" -m zipfile -e "$work"/tilegym/tilegym-*.whl "$work/tilegym/site"
tar -C "$work/tilegym/site" -cf - tilegym | xz -T0 -9 > "bundle/tilegym-${TILEGYM_VERSION}.tar.xz"

for whl in "$work"/wheels/*.whl; do
    "$PY" -m zipfile -e "$whl" "$work/unz"
done
# Keep the pip layout (cu13/bin, cu13/lib): tileiras finds libnvvm relative to itself there
# and runs the ptxas on its PATH. No libdevice: tileiras carries its own
# (`_mlir_embedded_libdevice`; it compiles the kernels without nvvm/libdevice beside it).
root="$work/unz/nvidia/cu13"
mkdir -p "$work/tk/cu13/bin" "$work/tk/cu13/lib"
cp "$root/bin/tileiras" "$work/tk/cu13/bin/"
if [ "${WAVEFRONT_HOST_PTXAS:-0}" != 1 ]; then
    cp "$root/bin/ptxas" "$work/tk/cu13/bin/"
fi
if [ "${WAVEFRONT_HOST_NVVM:-0}" != 1 ]; then
    cp -P "$root"/lib/libnvvm.so* "$work/tk/cu13/lib/"
fi
chmod +x "$work/tk/cu13/bin/"*
# One solid xz stream with the x86 branch filter (the three are x86-64 executables and a
# library) and a dictionary larger than tileiras (103 MB): 54.9 MB against plain `xz -9`'s 59.7.
tar -C "$work/tk" -cf - cu13 \
    | xz -T1 --x86 --lzma2=preset=9e,dict=192MiB > "bundle/tileiras-${TK}.tar.xz"

ls -la bundle bundle/wheels
bundle_bytes=$(du -sb bundle | cut -f1)
repo_bytes=$(git ls-files -z | du --files0-from=- -cb | tail -1 | cut -f1)
echo "bundle ${bundle_bytes} + repository ${repo_bytes} bytes of ${CAP_BYTES}"
if [ $((bundle_bytes + repo_bytes)) -gt "$CAP_BYTES" ]; then
    echo "the bundle and the repository do not fit the 64 MiB a device call carries" >&2
    exit 1
fi
