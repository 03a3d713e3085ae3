import pytest


def _gpu_available() -> bool:
    try:
        from wavefront.device import current_device
        return current_device() is not None
    except Exception:
        return False


def pytest_collection_modifyitems(config, items):
    if _gpu_available():
        return
    skip = pytest.mark.skip(reason="no CUDA GPU visible")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
