#!/usr/bin/env bash
# One device call of the exposure experiments: measures what this GPU's data still lacks
# (resuming from data/), then packs the data sets into $OUT/data.tgz.
#   WAVEFRONT_GIT_COMMIT=$(git rev-parse HEAD) bash scripts/exposure_session.sh
set -uo pipefail
: "${WAVEFRONT_GIT_COMMIT:?set WAVEFRONT_GIT_COMMIT=\$(git rev-parse HEAD)}"
source scripts/setup_gpu_host.sh
export PYTHONUNBUFFERED=1
OUT="${OUT:-/tmp/wavefront-out}"; mkdir -p "$OUT"
W=/tmp/wavefront-data; rm -rf "$W"; mkdir -p "$W"
for ds in exposure_corunners exposure_small_l2 exposure_latency warp_states production_bytes \
          causal_gqa; do
    mkdir -p "$W/$ds"; cp data/$ds/* "$W/$ds/" 2>/dev/null
done
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
echo "GPU: $gpu"
step() {  # step SECONDS NAME PYTHON-EXPRESSION
    echo "[$2 at $SECONDS s]"
    timeout "$1" python3 -c "import experiments.$2 as e; print('$2 failures:', $3)" \
        > "$OUT/$2.log" 2>&1; tail -2 "$OUT/$2.log"
}
if [[ "$gpu" == *H100* ]]; then
    step 200 exposure_latency "e.measure('$W/exposure_latency')"
    timeout 150 python3 -m wavefront.cli experiment run causal_gqa --data "$W" > "$OUT/causal_gqa.log" 2>&1
    tail -1 "$OUT/causal_gqa.log"
    step 150 exposure_corunners "e.measure_check('$W/exposure_corunners') or e._rounds('$W/exposure_corunners', e.append_levels())"
    step 80 exposure_small_l2 "e.measure_probe('$W/exposure_small_l2')"
else
    step 330 exposure_corunners "e.measure('$W/exposure_corunners')"
    step 150 exposure_small_l2 "e.measure('$W/exposure_small_l2')"
    step 60 warp_states "e.measure('$W/warp_states')"
fi
rm -rf "$W"/*/ncu-reports "$W"/*/.lock
tar -C "$W" -czf "$OUT/data.tgz" .
echo "[done at $SECONDS s]"
