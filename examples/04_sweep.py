"""A sweep (GPU): a small timing spec written here, measured point by point into a results
directory that a second run resumes, then read back.

    python examples/04_sweep.py [OUT [--gpus 2]]   # default OUT: a new temporary directory

The same from the shell: `wavefront sweep SPEC.toml --out OUT` (add `--gpus 2` to spread the
points over two GPUs of this host with Dask). `--dry-run` lists the points, no GPU needed.
"""
import subprocess
import sys
import tempfile
from pathlib import Path

from wavefront.results.store import load_results, results_path

SPEC = """
name = "example"
measure = ["timing"]
repeats = 2
batch_points = 1  # one point per Dask task: with --gpus 2 the points spread over both GPUs

[grid]
batch = [1]
heads = [8]
seqlen = [4096, 16384]
head_dim = [64]
schedule = ["persistent+linear", "persistent+sawtooth"]
"""

out = Path(sys.argv[1] if len(sys.argv) > 1 else tempfile.mkdtemp(prefix="wavefront-sweep-"))
spec = out / "example.toml"
out.mkdir(parents=True, exist_ok=True)
spec.write_text(SPEC)
subprocess.run([sys.executable, "-m", "wavefront.cli", "sweep", str(spec), "--dry-run"],
               check=True)
subprocess.run([sys.executable, "-m", "wavefront.cli", "sweep", str(spec), "--out", str(out),
                *sys.argv[2:]], check=True)  # e.g. --gpus 2: one Dask worker per GPU
rows = load_results(results_path(out))
print(rows.groupby(["kv_schedule", "seqlen"])["tflops"].agg(["median", "min", "max"]))
