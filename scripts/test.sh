#!/usr/bin/env bash
# Set up (a virtual environment with the package, its gpu and test extras) and run the checks:
# the import-layer contract, then the test suite. GPU tests run where a GPU is visible and skip
# cleanly elsewhere (they fail where a GPU is present but the CUDA stack is broken); CPU tests
# still compile every kernel specialisation ahead of time. `-m "not slow"` skips the minutes-long
# ones (full compilation, the paper build) while developing; CI runs everything.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/venv.sh
"$VENV/bin/lint-imports"
"$VENV/bin/python" -m pytest -q -p no:cacheprovider "$@"
# The simulator's speed on this machine, for the log (a benchmark, not a test): the paper's
# launch as the paper ran it, GB10 preset, B=8 H=1 S=131072 D=64, 64x64 tiles, 48 persistent
# CTAs, linear and sawtooth, with the clock (the default model).
"$VENV/bin/wavefront" simulate --gpu gb10 --batch 8 --heads 1 --seqlen 131072 --head-dim 64 \
    --tile 64x64 --occupancy 1 --ctas 48 --schedule persistent+linear,persistent+sawtooth \
    2>/dev/null | tail -1
