#!/usr/bin/env bash
# One device call of the serving experiments (issue 51, items 4-6), each step under its own
# time limit, full results under $OUT/<experiment>/ and a short table printed per step:
#   WAVEFRONT_GIT_COMMIT=$(git rev-parse HEAD) bash scripts/serving_session.sh [STEP ...]
# STEP: gpu_tests, shared_prefix, short_prompts, generate (default: all four, in that order;
# a device command may run 10 minutes: two calls, "gpu_tests shared_prefix" then the other two).
# Afterwards copy $OUT/<experiment>/ to data/<experiment>/ to commit it.
set -uo pipefail
: "${WAVEFRONT_GIT_COMMIT:?set WAVEFRONT_GIT_COMMIT=\$(git rev-parse HEAD)}"
source scripts/setup_gpu_host.sh
export PYTHONUNBUFFERED=1
OUT="${OUT:-/tmp/wavefront-out}"; mkdir -p "$OUT"
steps=("$@"); [ ${#steps[@]} -eq 0 ] && steps=(gpu_tests shared_prefix short_prompts generate)
nvidia-smi --query-gpu=name --format=csv,noheader | head -1
for step in "${steps[@]}"; do
    echo "[$step at $SECONDS s]"
    case "$step" in
    gpu_tests)
        timeout 150 python3 -m pytest -m gpu -q -p no:cacheprovider tests/test_gpu_serving.py \
            > "$OUT/gpu_tests.log" 2>&1; tail -3 "$OUT/gpu_tests.log" ;;
    shared_prefix | generate)
        timeout 240 python3 -c "import experiments.$step as e; print('failed rows:', e.measure('$OUT/$step'))" \
            > "$OUT/$step.log" 2>&1; tail -25 "$OUT/$step.log" ;;
    short_prompts)
        timeout 240 python3 -m wavefront.cli experiment run short_prompts --data "$OUT" \
            > "$OUT/short_prompts.log" 2>&1
        python3 -c "import experiments.short_prompts as e; e.summary('$OUT')" 2>&1 | tail -40 ;;
    *) echo "unknown step $step" ;;
    esac
done
rm -rf "$OUT"/*/.lock
echo "[done at $SECONDS s]"
