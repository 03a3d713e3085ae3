"""Sweeps on Dask with fake GPU workers (CPU): every point once, a worker killed mid-sweep loses
and duplicates nothing, a killed client resumes."""
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

distributed = pytest.importorskip("distributed", reason="the distributed extra")

from wavefront.measure.distributed import DaskRunner, local_gpu_cluster  # noqa: E402
from wavefront.results.store import load_results  # noqa: E402
from wavefront.results.sweep import expand, parse_spec, run_sweep  # noqa: E402

FAKES = Path(__file__).parent / "fakes"
FAKE_WORKER = [sys.executable, str(FAKES / "fake_worker.py")]
GPU = dict(gpu="FakeGPU", sms=132, l2_bytes=50 << 20)
# The spec the killed-client test's driver runs: one copy.
sys.path.insert(0, str(FAKES))
from dask_driver import SPEC  # noqa: E402


@pytest.fixture(scope="module")
def client():
    with local_gpu_cluster(2) as cluster, distributed.Client(cluster) as c:
        yield c


def _rows(path):
    df = load_results(path / "results.csv", strict=True)
    return df, set(zip(df["point"], df["measurement"], df["repeat"].astype(int)))


def test_every_point_measured_once_on_pinned_workers(client, tmp_path):
    pins = client.run(lambda: os.environ["CUDA_VISIBLE_DEVICES"])
    assert sorted(pins.values()) == ["0", "1"]
    tmps = client.run(lambda: os.environ["TMPDIR"])
    assert len(set(tmps.values())) == 2  # an ncu lock file of its own per GPU
    spec = parse_spec(SPEC)
    summary = run_sweep(spec, tmp_path, runner=DaskRunner(client, worker_cmd=FAKE_WORKER),
                        progress=False, **GPU)
    df, stored = _rows(tmp_path)
    assert summary["ok"] == len(expand(spec, **GPU)) == len(df) == len(stored) == 32


def test_a_worker_killed_mid_sweep_loses_and_duplicates_nothing(client, tmp_path):
    spec = parse_spec(SPEC)
    runner = DaskRunner(client, worker_cmd=[*FAKE_WORKER, "--delay", "0.3"])
    victim = sorted(client.scheduler_info()["workers"])[0]

    def kill_later():
        time.sleep(2.0)
        try:
            client.run(lambda: os.kill(os.getpid(), signal.SIGKILL), workers=[victim])
        except Exception:
            pass  # the worker died answering: that is the point
    import threading
    threading.Thread(target=kill_later, daemon=True).start()
    summary = run_sweep(spec, tmp_path, runner=runner, progress=False, **GPU)
    df, stored = _rows(tmp_path)
    assert len(df) == len(stored) == 32 and summary["ok"] + summary["failed"] == 32
    assert summary["ok"] == 32  # the lost batch ran again on a worker that lives
    assert victim not in client.scheduler_info()["workers"]  # it really died (and restarted)


def test_a_killed_client_resumes(tmp_path):
    env = {**os.environ, "FAKE_WORKER_DELAY": "0.3",
           "PYTHONPATH": str(Path(__file__).parent.parent)}
    proc = subprocess.Popen([sys.executable, str(FAKES / "dask_driver.py"), str(tmp_path)],
                            env=env, stderr=subprocess.DEVNULL)
    for _ in range(300):
        if (tmp_path / "results.csv").exists() and len(
                (tmp_path / "results.csv").read_text().splitlines()) > 6:
            break
        time.sleep(0.1)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    before, _ = _rows(tmp_path)
    assert 0 < len(before) < 32
    res = subprocess.run([sys.executable, str(FAKES / "dask_driver.py"), str(tmp_path)],
                         env={**env, "FAKE_WORKER_DELAY": "0"}, capture_output=True, timeout=300)
    assert res.returncode == 0, res.stderr[-500:]
    df, stored = _rows(tmp_path)
    assert len(df) == len(stored) == 32
