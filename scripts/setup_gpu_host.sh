#!/usr/bin/env bash
# Install the bundle (scripts/build_gpu_bundle.sh) on a GPU host without package access
# (source this script):
#   source scripts/setup_gpu_host.sh
# Installs the cuda-tile wheel and Dask's wheels (bundle/wheels: `--gpus N`) with
# pip --no-index --no-deps, unpacks tileiras/ptxas/libnvvm 13.4 under $WAVEFRONT_TK (default
# /tmp/wavefront-tk), puts them on PATH / LD_LIBRARY_PATH and unsets CUDA_HOME and CUDA_PATH
# (an older toolkit there makes tileiras fail with "Return code 5"). A tarball built with
# WAVEFRONT_HOST_PTXAS=1 or WAVEFRONT_HOST_NVVM=1 lacks ptxas or libnvvm: the host toolkit's
# (/usr/local/cuda) serve instead.
_wf_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
WAVEFRONT_TK="${WAVEFRONT_TK:-/tmp/wavefront-tk}"
_wf_py="${PYTHON:-python3}"
if ! "$_wf_py" -c "import cuda.tile" 2>/dev/null; then
    "$_wf_py" -m pip install -q --no-deps --no-index "$_wf_root"/bundle/cuda_tile-*.whl
fi
if ls "$_wf_root"/bundle/wheels/*.whl >/dev/null 2>&1 \
        && ! "$_wf_py" -c "import dask, distributed" 2>/dev/null; then
    "$_wf_py" -m pip install -q --no-deps --no-index "$_wf_root"/bundle/wheels/*.whl
fi
if [ ! -x "$WAVEFRONT_TK/cu13/bin/tileiras" ]; then
    mkdir -p "$WAVEFRONT_TK"
    tar -C "$WAVEFRONT_TK" -xJf "$_wf_root"/bundle/tileiras-*.tar.xz
fi
# TileGym (optional: the bench's same-language peer) on the path, where the bundle has it.
if ls "$_wf_root"/bundle/tilegym-*.tar.xz >/dev/null 2>&1 && [ ! -d "$WAVEFRONT_TK/site/tilegym" ]; then
    mkdir -p "$WAVEFRONT_TK/site"
    tar -C "$WAVEFRONT_TK/site" -xJf "$_wf_root"/bundle/tilegym-*.tar.xz
fi
export PATH="$WAVEFRONT_TK/cu13/bin:$PATH"
export LD_LIBRARY_PATH="$WAVEFRONT_TK/cu13/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
# ncu; and ptxas where the tarball has none (it is found after the bundle's own).
export PATH="$PATH:/usr/local/cuda/bin"
if ! ls "$WAVEFRONT_TK"/cu13/lib/libnvvm.so* >/dev/null 2>&1; then
    export LD_LIBRARY_PATH="$LD_LIBRARY_PATH:/usr/local/cuda/nvvm/lib64"
fi
unset CUDA_HOME CUDA_PATH
export PYTHONPATH="$_wf_root${PYTHONPATH:+:$PYTHONPATH}:$WAVEFRONT_TK/site"
export CUDA_TILE_CACHE_DIR="${CUDA_TILE_CACHE_DIR:-/tmp/wavefront-cutile-cache}"
unset _wf_root _wf_py
