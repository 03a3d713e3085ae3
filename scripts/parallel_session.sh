#!/usr/bin/env bash
# One device call on a machine of several GPUs: each argument is one lane of steps run in order
# on its own GPU (lane i on GPU i), all lanes at once; every lane's output goes under
# $OUT/lane<i>/ and everything measured is packed into $OUT/results.tgz (a call brings back a
# bounded number of files).
#   WAVEFRONT_GIT_COMMIT=<hash> bash scripts/parallel_session.sh \
#       "tests" "bench_decode shared_prefix generate"
# (<hash>: the checkout's HEAD, written out on this side. The device's copy of .git need not be
# at that commit, so `$(git rev-parse HEAD)` evaluated there stamps a stale commit.)
# Steps: tests (the whole GPU suite), bench_decode, decode_sweep (splits x CTAs per SM at B1/B8), shared_prefix, generate, short_prompts,
# crash (scripts/gpu_crash_campaign.py), advisor (experiments/advisor_picks.py, the first
# shape; advisor:2,4 its 2nd and 4th),
# backward (scripts/backward_bench.py), gpu_checks (the GPU tests of the bad-input audit and the
# cache call), backward_dram (the backward schedules' DRAM bytes and time), tune_short (a lever
# search at B16 H32 S768 D128 unless TUNE_ARGS names another shape, written into the tuned table, which $d/tuned.json brings back),
# bwd_variants (every named backward config against cuDNN and FA2), item_clocks (per-item
# GPU clocks of the timed model's two worst launches, and their GPU test), profile_call (where the cache
# call's host time goes: scripts/profile_cache_call.py, PROFILE_MODES).
set -uo pipefail
: "${WAVEFRONT_GIT_COMMIT:?set WAVEFRONT_GIT_COMMIT=\$(git rev-parse HEAD)}"
source scripts/setup_gpu_host.sh
export PYTHONUNBUFFERED=1
OUT="${OUT:-/tmp/wavefront-out}"; mkdir -p "$OUT"
LANE_SECONDS="${LANE_SECONDS:-540}"
nvidia-smi --query-gpu=index,name --format=csv,noheader
step() {  # step NAME DIR
    local d="$2"; mkdir -p "$d"
    case "$1" in
    tests) python3 -m pytest -m gpu -n 14 -q -p no:cacheprovider --tb=short tests \
               > "$d/gpu_tests.log" 2>&1; grep -E "^(FAILED|ERROR)|passed|failed" "$d/gpu_tests.log" | tail -30 ;;
    bench_decode) python3 -m wavefront.cli bench-decode --rounds 8 --per-round 5 --out "$d/decode_bench" \
               > "$d/bench_decode.log" 2>&1; tail -40 "$d/bench_decode.log" ;;
    decode_sweep) python3 -m wavefront.cli bench-decode --batch "${DECODE_SWEEP_BATCH:-1,8}" --rounds 8 --per-round 5 \
               --sweep-splits "${SWEEP_SPLITS:-auto,8,16,32,64,128}" --sweep-ctas-per-sm 2,3 \
               --out "$d/decode_sweep" > "$d/decode_sweep.log" 2>&1; tail -150 "$d/decode_sweep.log" ;;
    shared_prefix|generate) OUT="$d" bash scripts/serving_session.sh "$1" | tail -40 ;;
    short_prompts) OUT="$d" bash scripts/serving_session.sh short_prompts | tail -60 ;;
    crash) python3 scripts/gpu_crash_campaign.py "$d/crash" --budget-s "${CRASH_SECONDS:-120}" \
               > "$d/crash.log" 2>&1; tail -3 "$d/crash.log" ;;
    advisor|advisor:*) shapes="${1#advisor}"; shapes="${shapes#:}"
               WAVEFRONT_ADVISOR_SHAPES="${shapes:-1}" python3 -m wavefront.cli experiment run \
               advisor_picks --data "$d" > "$d/advisor.log" 2>&1; tail -20 "$d/advisor.log" ;;
    backward) python3 scripts/backward_bench.py --rounds 8 --json "$d/backward.jsonl" \
               > "$d/backward.log" 2>&1; tail -40 "$d/backward.log" ;;
    bwd_tests) python3 -m pytest -m gpu -n 4 -q -p no:cacheprovider --tb=short \
               tests/test_gpu_backward.py tests/test_gpu_backward_bottom_right.py \
               > "$d/bwd_tests.log" 2>&1
               grep -E "^(FAILED|ERROR)|passed|failed" "$d/bwd_tests.log" | tail -30 ;;
    gpu_checks) python3 -m pytest -m gpu -n 8 -q -p no:cacheprovider --tb=short \
               tests/test_gpu_unfriendly_new.py tests/test_gpu_kvcache_views.py \
               tests/test_gpu_kvcache.py tests/test_gpu_kvcache_prepared.py tests/test_gpu_serving.py \
               > "$d/gpu_checks.log" 2>&1
               grep -E "^(FAILED|ERROR|XPASS)|passed|failed" "$d/gpu_checks.log" | tail -30 ;;
    backward_dram) python3 scripts/backward_bench.py --dram --shapes "B1 H32 S8k,B2 H8 S32k" \
               --head-dims 128 --json "$d/backward_dram.jsonl" > "$d/backward_dram.log" 2>&1
               python3 scripts/backward_bench.py --schedules --shapes "B1 H32 S8k,B2 H8 S32k" \
               --head-dims 128 --rounds 6 --json "$d/backward_schedules.jsonl" \
               > "$d/backward_schedules.log" 2>&1; tail -30 "$d/backward_schedules.log" ;;
    bwd_variants) python3 scripts/backward_bench.py --variants "${BWD_VARIANTS:-all}" --rounds "${BWD_ROUNDS:-6}" \
               --json "$d/backward_variants.jsonl" > "$d/backward_variants.log" 2>&1
               tail -60 "$d/backward_variants.log" ;;
    profile_call) for m in ${PROFILE_MODES:-fixed growing generate}; do
               python3 scripts/profile_cache_call.py --mode "$m" > "$d/profile_$m.log" 2>&1
               tail -4 "$d/profile_$m.log"; done ;;
    tune_short) timeout "${TUNE_SECONDS:-300}" python3 -m wavefront.cli tune \
               ${TUNE_ARGS:---batch 16 --heads 32 --seqlen 768 --head-dim 128 --no-softmax-levers} \
               --rounds 6 --write --out "$d/tune_short" > "$d/tune_short.log" 2>&1
               tail -25 "$d/tune_short.log"
               cp wavefront/kernel/tuned.json "$d/tuned.json" ;;
    item_clocks) python3 -m wavefront.cli experiment run item_clocks --data "$d" \
               > "$d/item_clocks.log" 2>&1; tail -20 "$d/item_clocks.log"
               python3 -m pytest -m gpu -q -p no:cacheprovider --tb=short \
               tests/test_gpu_item_clocks.py > "$d/item_clocks_tests.log" 2>&1
               tail -15 "$d/item_clocks_tests.log" ;;
    *) echo "unknown step $1" ;;
    esac
}
export -f step
lane=0
for steps in "$@"; do
    d="$OUT/lane$lane"; mkdir -p "$d"
    # timeout kills the lane's whole process group (its Python and ncu children too)
    CUDA_VISIBLE_DEVICES=$lane timeout "$LANE_SECONDS" bash -c '
        for s in $1; do echo "[lane $2: $s at $SECONDS s]"; step "$s" "$3"; done' \
        lane "$steps" "$lane" "$d" > "$d/lane.log" 2>&1 &
    lane=$((lane + 1))
done
wait
for d in "$OUT"/lane*; do echo "=== $d"; cat "$d/lane.log"; done
find "$OUT" -name .lock -prune -exec rm -rf {} + 2>/dev/null
tar -C "$OUT" --exclude=results.tgz -czf "$OUT/results.tgz" $(cd "$OUT" && ls -d lane*)
