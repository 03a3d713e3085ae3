#!/usr/bin/env bash
# One device call: set up the host, run the GPU test suite, then the foundation bench table.
# Usage (on the GPU host, from the repo root): bash scripts/gpu_check.sh [pytest args...]
set -uo pipefail
source scripts/setup_gpu_host.sh
export PYTHONUNBUFFERED=1
OUT="${OUT:-/tmp/wavefront-out}"; mkdir -p "$OUT"
python3 -m wavefront.cli info | tee "$OUT/info.txt"
python3 -m pytest -m gpu -n 8 -q -p no:cacheprovider tests "$@" 2>&1 | tee "$OUT/gpu_tests.txt" | tail -25
python3 -m wavefront.cli bench --batch 1 --heads 32 --seqlen 8192 --head-dim 128,64 \
    --out "$OUT/bench.jsonl" 2>/dev/null | tee "$OUT/bench.txt"
