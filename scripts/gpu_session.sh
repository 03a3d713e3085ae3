#!/usr/bin/env bash
# One device call that fits the lease: set up the host, then do the listed steps in order
# within DEADLINE seconds and pack what was measured into $OUT/data.tar.
#   bash scripts/gpu_session.sh DEADLINE [--tests] [--bench] [EXPERIMENT ...]
# EXPERIMENT names an experiment file that owns a sweep; it resumes from data/<EXPERIMENT>/ (the
# committed results travel with the checkout), so a sweep cut by the deadline goes on next call.
set -uo pipefail
# The host's copy of .git may be stale (seen: it reported the session's first commit), so the
# caller names the commit being measured; every manifest records it.
: "${WAVEFRONT_GIT_COMMIT:?set WAVEFRONT_GIT_COMMIT=\$(git rev-parse HEAD) on your machine and pass it}"
source scripts/setup_gpu_host.sh
export PYTHONUNBUFFERED=1
OUT="${OUT:-/tmp/wavefront-out}"; mkdir -p "$OUT"
deadline="$1"; shift
start=$SECONDS
work=/tmp/wavefront-data; rm -rf "$work"; mkdir -p "$work"
left() { echo $((deadline - (SECONDS - start))); }
python3 -m wavefront.cli info | tee "$OUT/info.txt"
for step in "$@"; do
    if [ "$(left)" -lt 40 ]; then echo "deadline: skipping $step"; continue; fi
    case "$step" in
    --tests)
        timeout "$(left)" python3 -m pytest -m gpu -n 8 -q -p no:cacheprovider tests \
            2>&1 | tee "$OUT/gpu_tests.txt" | tail -3 ;;
    --bench)
        timeout "$(left)" python3 -m wavefront.cli bench --batch 1 --heads 32 --seqlen 8192 \
            --head-dim 128,64 --out "$work/bench" 2>/dev/null | tee "$OUT/bench.txt" ;;
    *)
        # Every data set the experiment owns resumes from its committed results.
        for ds in $(python3 -c "from wavefront.report.experiments import load_experiment as l
print(' '.join(l('experiments/$step.py').datasets))"); do
            mkdir -p "$work/$ds"
            cp data/$ds/results.csv* data/$ds/manifest.json* "$work/$ds/" 2>/dev/null
            cp -r "data/$ds/orders" "$work/$ds/" 2>/dev/null
        done
        timeout "$(( $(left) - 15 ))" python3 "experiments/$step.py" run --data "$work" 2>&1 \
            | tee "$OUT/$step.log" | tail -3 ;;
    esac
    echo "[$step done at $((SECONDS - start)) s]"
done
tar -C "$work" --exclude=ncu-reports -czf "$OUT/data.tgz" .
