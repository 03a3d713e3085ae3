#!/usr/bin/env bash
# The main job. On a GPU: measure (the foundation bench, then every experiment file's own
# sweeps and bench runs: `python experiments/<name>.py run`). On a CPU-only machine: run the
# cache model on the H100 preset, then regenerate the paper (paper/draft.md, its appendices,
# figures) from data/; the job's last lines are the paper's finding, the timed model's held-out
# scores and where the paper and its figures were written.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/venv.sh
WF="$VENV/bin/wavefront"
if "$VENV/bin/python" -c "from wavefront.device import has_gpu; raise SystemExit(not has_gpu())"; then
    "$WF" info
    "$WF" bench --batch 1 --heads 32 --seqlen 8192 --head-dim 128,64
    for experiment in experiments/*.py; do
        "$VENV/bin/python" "$experiment" run || echo "$experiment: some points failed"
    done
else
    "$WF" info
    "$WF" simulate --gpu h100 --seqlen 131072 --head-dim 64 --tile 64x64 \
        --schedule persistent+linear,persistent+sawtooth
    "$WF" paper
fi
