source scripts/setup_gpu_host.sh >/dev/null 2>&1; export PYTHONUNBUFFERED=1
GPU=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1); echo "GPU: $GPU"
case "$GPU" in *H200*) ;; *) echo "not an H200: stop"; exit 3;; esac
for d in 128 64; do
  timeout 150 python3 -m wavefront.cli bench --batch 8 --heads 16 --seqlen 2048 --head-dim $d --schedule persistent+linear --tuned --api --out $OUT/h200_s2k_d$d 2>&1 | tail -12
done
timeout 200 python3 -m pytest -q -p no:cacheprovider -m gpu -n 8 tests 2>&1 | tail -3
