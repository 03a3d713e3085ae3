"""Sweeps on Dask: from the GPUs of one host to a cluster, with the same crash-safe store.

The client alone writes the results: each Dask task measures a batch of consecutive tasks of
one kind (`batch_points` of the spec; 1 = one point per Dask task) in its own worker
subprocess, exactly as the single-GPU runner does, and returns the rows; the client appends
them as futures complete. A worker lost mid-batch: Dask runs the batch again elsewhere (rows are
written only when a batch completes, and `run_sweep` drops any row it already wrote in this run,
so nothing is duplicated); a batch that keeps failing is recorded failed, never dropped.

Workers are pinned one per GPU through CUDA_VISIBLE_DEVICES (dask-cuda's LocalCUDACluster where
installed, else one Nanny per GPU with that variable set), and each gets its own TMPDIR:
Nsight Compute keeps a lock file in the temp directory (`nsight-compute-lock`), which would
otherwise serialise profiling on every GPU of the host behind one lock.

Dask is optional (the `distributed` extra) and imported only here.
"""
from __future__ import annotations

import os
import socket
import tempfile
from dataclasses import asdict

from wavefront.results.sweep import SweepSpec


def _require_distributed():
    try:
        import distributed  # noqa: F401
    except ImportError:
        raise RuntimeError("sweeps on several GPUs need Dask: pip install "
                           "'wavefront[distributed]'") from None


def visible_gpu_count() -> int:
    """GPUs on this host, from NVML (0 without NVML or GPUs)."""
    try:
        import pynvml
        pynvml.nvmlInit()
        return int(pynvml.nvmlDeviceGetCount())
    except Exception:
        return 0


def local_gpu_cluster(n_gpus: int, *, tmp_root: str | None = None):
    """A Dask cluster on this host with one single-threaded worker per GPU."""
    _require_distributed()
    if n_gpus < 1:
        raise ValueError(f"--gpus must be at least 1, got {n_gpus}")
    tmp_root = tmp_root or tempfile.mkdtemp(prefix="wavefront-dask-")
    env = {k: v for k, v in os.environ.items()
           if k.startswith(("NCCL_", "TORCH_", "NVSHMEM_", "CUDA_TILE", "PATH", "LD_LIBRARY",
                            "PYTHONPATH"))}
    from distributed import Nanny, Scheduler, SpecCluster
    workers = {}
    for i in range(n_gpus):
        tmp = os.path.join(tmp_root, f"gpu{i}")
        os.makedirs(tmp, exist_ok=True)
        workers[f"gpu{i}"] = {"cls": Nanny, "options": {
            "nthreads": 1, "name": f"gpu{i}",
            "env": {**env, "CUDA_VISIBLE_DEVICES": str(i), "TMPDIR": tmp}}}
    return SpecCluster(workers=workers,
                       scheduler={"cls": Scheduler, "options": {"dashboard_address": None}},
                       silence_logs=40)


def describe_worker_gpu() -> dict:
    """Runs on a worker: the GPU it is pinned to."""
    from wavefront.device import current_device
    from wavefront.measure.conditions import gpu_uuid
    dev = current_device()
    return {"device": dev.as_dict() if dev else None, "uuid": gpu_uuid(),
            "host": socket.gethostname(),
            "visible": os.environ.get("CUDA_VISIBLE_DEVICES", "")}


def cluster_gpu(client) -> dict:
    """The GPU model every worker has (a sweep measures one model): name, SMs, L2."""
    infos = client.run(describe_worker_gpu)
    devices = {w: i["device"] for w, i in infos.items()}
    if not devices or any(d is None for d in devices.values()):
        raise RuntimeError(f"every Dask worker needs a GPU; seen: {devices}")
    names = {(d["name"], d["sms"], d["l2_bytes"]) for d in devices.values()}
    if len(names) != 1:
        raise RuntimeError(f"workers have different GPUs {sorted(names)}: run one sweep per "
                           "GPU model")
    first = next(iter(devices.values()))
    return {**first, "workers": infos}


def measure_batch(tasks: list[dict], spec: dict, report_dir: str | None,
                  worker_cmd: list[str] | None = None,
                  order_dir: str | None = None) -> tuple[list, list, str]:
    """Runs on a worker: measure a batch in a worker subprocess. -> (rows, reports, where)."""
    from wavefront.measure.runner import SubprocessRunner
    rows, reports = [], []
    runner = SubprocessRunner(worker_cmd=worker_cmd, report_dir=report_dir, order_dir=order_dir)
    runner.run(tasks, SweepSpec(**spec), lambda t, r, e: rows.append((t, r, e)),
               reports.append)
    where = f"{socket.gethostname()}:gpu{os.environ.get('CUDA_VISIBLE_DEVICES', '?')}"
    return rows, reports, where


class DaskRunner:
    """Hands batches of tasks to a Dask cluster; results stream back to `on_result`."""

    def __init__(self, client, *, report_dir: str | None = None,
                 worker_cmd: list[str] | None = None, retries: int = 2,
                 order_dir: str | None = None):
        self.client = client
        self.report_dir = report_dir
        self.order_dir = order_dir
        self.worker_cmd = worker_cmd
        self.retries = retries

    def run(self, tasks: list[dict], spec: SweepSpec, on_result, on_artifact=None) -> None:
        from distributed import as_completed
        batches = []
        for task in tasks:
            if (batches and batches[-1][-1]["measurement"] == task["measurement"]
                    and len(batches[-1]) < spec.batch_points):
                batches[-1].append(task)
            else:
                batches.append([task])
        futures = {}
        for batch in batches:
            fut = self.client.submit(measure_batch, batch, asdict(spec), self.report_dir,
                                     self.worker_cmd, self.order_dir, pure=False,
                                     retries=self.retries)
            futures[fut] = batch
        try:
            for fut in as_completed(list(futures)):
                batch = futures.pop(fut)
                try:
                    rows, reports, where = fut.result()
                except Exception as exc:  # lost on every try: recorded, never dropped
                    for task in batch:
                        on_result(task, None, f"Dask task failed after {self.retries} retries: "
                                              f"{type(exc).__name__}: {exc}"[:500])
                    continue
                for report in reports:
                    if on_artifact:
                        on_artifact({**report, "where": where})
                for task, result, error in rows:
                    on_result({**task, "gpu_slot": where}, result, error)
        finally:
            for fut in futures:
                fut.cancel()
