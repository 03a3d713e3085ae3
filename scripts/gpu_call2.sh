#!/usr/bin/env bash
# Device call 2: tile/occupancy exploration, a profile (ncu fixture), the issue-3 sweep.
set -uo pipefail
source scripts/setup_gpu_host.sh
export PYTHONUNBUFFERED=1
OUT="${OUT:-/tmp/wavefront-out}"; mkdir -p "$OUT"
wf() { python3 -m wavefront.cli "$@"; }
start=$SECONDS
for cfg in "128x128 1" "128x128 2" "128x64 1"; do
  set -- $cfg
  wf bench --heads 32 --seqlen 8192 --head-dim 128 --causal no --no-peers --tile $1 \
     --occupancy $2 --schedule grid+linear,persistent+linear,persistent+sawtooth \
     --out "$OUT/explore.jsonl" 2>/dev/null | tail -4
done
echo "explore done at $((SECONDS-start)) s"
WAVEFRONT_KEEP_NCU_LOG="$OUT/ncu_raw_h200.csv" wf profile --heads 1 --seqlen 131072 \
   --head-dim 64 --tile 64x64 --schedule persistent+linear,persistent+sawtooth \
   --out "$OUT/profile" 2>&1 | tail -5
echo "profile done at $((SECONDS-start)) s"
timeout $((560 - (SECONDS-start))) python3 -m wavefront.cli sweep \
   experiments/specs/schedules_vs_seqlen.toml --out "$OUT/sweep" 2>&1 | tail -3
echo "sweep stopped at $((SECONDS-start)) s"
python3 - <<'PY'
import os
from wavefront.records import load_results
df = load_results(os.environ.get("OUT", "/tmp/wavefront-out") + "/sweep/results.csv")
print(df.groupby(["measurement", "status"]).size())
PY
