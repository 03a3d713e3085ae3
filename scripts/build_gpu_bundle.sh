#!/usr/bin/env bash
# Build, on a machine with package access, the bundle a GPU host without it needs:
#   bundle/cuda_tile-<ver>-cp312-*.whl        the cuda-tile wheel for the host's Python 3.12
#   bundle/tileiras-13.4.tar.xz               tileiras + ptxas + libnvvm + libdevice, CUDA 13.4
#   bundle/tilegym-<ver>.tar.xz               TileGym's package (a bench peer), unpacked files
# The bundle is git-ignored; carry it to the host (device `carry: ["bundle"]`) and run
# scripts/setup_gpu_host.sh there. Everything that travels must stay under 64 MiB.
set -euo pipefail
cd "$(dirname "$0")/.."
CUDA_TILE_VERSION="${CUDA_TILE_VERSION:-1.7.0}"
TK="${TK:-13.4}"
PY="${PYTHON:-python3}"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
rm -rf bundle && mkdir -p bundle

"$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
    --implementation cp --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 \
    -d bundle "cuda-tile==${CUDA_TILE_VERSION}"
"$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
    --implementation cp --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux_2_27_x86_64 --platform manylinux_2_28_x86_64 \
    -d "$work/wheels" "nvidia-cuda-tileiras==${TK}.*" "nvidia-cuda-nvcc==${TK}.*" \
    "nvidia-nvvm==${TK}.*"

# TileGym (NVIDIA's cuTile kernels, the bench's same-language peer), its package as one xz
# tarball: the wheel's own files, smaller than the wheel (the transfer cap is tight).
TILEGYM_VERSION="${TILEGYM_VERSION:-1.5.1}"
"$PY" -m pip download -q --no-deps --only-binary=:all: -d "$work/tilegym" \
    "tilegym==${TILEGYM_VERSION}"
"$PY" -m zipfile -e "$work"/tilegym/tilegym-*.whl "$work/tilegym/site"
tar -C "$work/tilegym/site" -cf - tilegym | xz -T0 -9 > "bundle/tilegym-${TILEGYM_VERSION}.tar.xz"

mkdir -p "$work/tk"
for whl in "$work"/wheels/*.whl; do
    "$PY" -m zipfile -e "$whl" "$work/unz"
done
# Keep the pip layout (cu13/bin, cu13/lib, cu13/nvvm/libdevice): tileiras finds its
# libraries relative to itself there.
root="$work/unz/nvidia/cu13"
mkdir -p "$work/tk/cu13/bin" "$work/tk/cu13/lib" "$work/tk/cu13/nvvm"
cp "$root/bin/tileiras" "$root/bin/ptxas" "$work/tk/cu13/bin/"
cp -P "$root"/lib/libnvvm.so* "$work/tk/cu13/lib/"
cp -r "$root/nvvm/libdevice" "$work/tk/cu13/nvvm/"
chmod +x "$work/tk/cu13/bin/"*
tar -C "$work/tk" -cf - cu13 | xz -T0 -9 > "bundle/tileiras-${TK}.tar.xz"
ls -la bundle
du -sh bundle
