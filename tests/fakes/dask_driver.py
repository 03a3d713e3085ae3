"""A Dask sweep's client, for the test that kills it: two fake GPU workers, a slow fake
measurement. `python dask_driver.py OUT_DIR`"""
import sys
from pathlib import Path

from distributed import Client

from wavefront.measure.distributed import DaskRunner, local_gpu_cluster
from wavefront.results.sweep import parse_spec, run_sweep

FAKE_WORKER = [sys.executable, str(Path(__file__).parent / "fake_worker.py")]
SPEC = """
batch_points = 2
timeout_s = 30
[grid]
seqlen = [128, 256, 384, 512, 640, 768, 896, 1024]
head_dim = [64, 128]
schedule = ["persistent+linear", "persistent+sawtooth"]
"""

if __name__ == "__main__":
    with local_gpu_cluster(2) as cluster, Client(cluster) as client:
        run_sweep(parse_spec(SPEC), sys.argv[1], gpu="FakeGPU", sms=132, l2_bytes=50 << 20,
                  runner=DaskRunner(client, worker_cmd=FAKE_WORKER), progress=False)
