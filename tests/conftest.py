"""GPU tests skip cleanly where there is no GPU, and fail loudly where a GPU is present but the
CUDA stack is broken (a driver/runtime mismatch must not read as 'skipped')."""
import pytest


def pytest_collection_modifyitems(config, items):
    from wavefront.device import BrokenGpuStack, gpu_status
    try:
        device, why = gpu_status()
    except BrokenGpuStack as exc:
        for item in items:
            if "gpu" in item.keywords:
                item.add_marker(pytest.mark.usefixtures("_broken_gpu_stack"))
        config._wavefront_broken = str(exc)
        return
    if device is not None:
        return
    skip = pytest.mark.skip(reason=why or "no CUDA GPU visible")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def _broken_gpu_stack(request):
    pytest.fail(f"GPU present but unusable: {request.config._wavefront_broken}")


@pytest.fixture
def on_two_streams_at_once():
    """-> a function of (call, input sets, rounds=8): `call` on each input set alone, then
    `rounds` times on two torch side streams queued at once (each stream its own inputs);
    -> (the lone outputs, each stream's outputs)."""
    import torch

    def run(call, input_sets, rounds=8):
        alone = [call(*inputs) for inputs in input_sets]
        torch.cuda.synchronize()
        streams = [torch.cuda.Stream() for _ in input_sets]
        together = [[] for _ in input_sets]
        for _ in range(rounds):
            for stream, inputs, outs in zip(streams, input_sets, together):
                with torch.cuda.stream(stream):
                    outs.append(call(*inputs))
        torch.cuda.synchronize()
        return alone, together
    return run


@pytest.fixture
def run_each():
    """-> a function of ([argv, ...], **subprocess.run options) -> [CompletedProcess, ...] in
    argv order, the processes run side by side, one per CPU core: a test that starts one
    process per experiment would otherwise leave CI's second core idle for minutes."""
    import os
    import subprocess
    from concurrent.futures import ThreadPoolExecutor

    def run(commands, **options):
        cores = (len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity")
                 else os.cpu_count() or 1)
        with ThreadPoolExecutor(max_workers=max(1, cores)) as pool:
            return list(pool.map(lambda argv: subprocess.run(argv, **options), commands))
    return run
