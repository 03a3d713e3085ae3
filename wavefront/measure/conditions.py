"""The GPU's conditions while a point is measured, from NVML (`nvidia-ml-py`): clocks, why they
were held down, the GPU's UUID and the host. Read only: nothing here changes a clock or setting."""
from __future__ import annotations

import functools
import socket
import statistics
import threading
import time

from wavefront.results.measurement import Conditions

# NVML clock-event reasons for a GPU slower than it could run (power, heat), not idle or
# held by application clocks.
_THROTTLE_REASONS = {
    0x4: "sw_power_cap", 0x8: "hw_slowdown", 0x20: "sw_thermal", 0x40: "hw_thermal",
    0x80: "hw_power_brake", 0x100: "display_clocks",
}
_BENIGN_REASONS = {0x1: "gpu_idle", 0x2: "applications_clocks", 0x10: "sync_boost"}


@functools.lru_cache(maxsize=None)
def _nvml():
    """pynvml, initialised once per process (None without NVML), not once per sampler: a
    bench makes a sampler every round (data/public_call/RUNS.md#90b37ae)."""
    try:
        import pynvml
        pynvml.nvmlInit()
        return pynvml
    except Exception:  # no NVML (CPU machine, no nvidia-ml-py): conditions stay unknown
        return None


def _visible_index(device: int) -> int:
    """NVML numbers every GPU of the host; CUDA numbers the visible ones. Map through
    CUDA_VISIBLE_DEVICES where it lists plain indices."""
    import os
    visible = os.environ.get("CUDA_VISIBLE_DEVICES", "")
    ids = [v.strip() for v in visible.split(",") if v.strip()]
    if ids and all(v.isdigit() for v in ids) and device < len(ids):
        return int(ids[device])
    return device


@functools.lru_cache(maxsize=None)
def gpu_uuid(device: int = 0) -> str | None:
    nvml = _nvml()
    if nvml is None:
        return None
    try:
        uuid = nvml.nvmlDeviceGetUUID(nvml.nvmlDeviceGetHandleByIndex(_visible_index(device)))
        return uuid.decode() if isinstance(uuid, bytes) else uuid
    except Exception:
        return None


@functools.lru_cache(maxsize=None)
def _handle_and_max_sm(device: int):
    """NVML's handle of `device` and its maximum SM clock, asked once per process."""
    nvml = _nvml()
    handle = nvml.nvmlDeviceGetHandleByIndex(_visible_index(device))
    return handle, nvml.nvmlDeviceGetMaxClockInfo(handle, nvml.NVML_CLOCK_SM)


class ConditionsSampler:
    """Samples SM/memory clocks and clock-event reasons every `period_s` while in a `with`
    (`period_s=None`: only when `sample` is called)."""

    def __init__(self, device: int = 0, period_s: float | None = 0.05):
        self.device = device
        self.period_s = period_s
        self.sm, self.mem, self.reasons, self.max_sm = [], [], 0, None
        self._stop = threading.Event()
        self._nvml = _nvml()
        self._thread = None

    def _sample(self, handle):
        nvml = self._nvml
        self.sm.append(nvml.nvmlDeviceGetClockInfo(handle, nvml.NVML_CLOCK_SM))
        self.mem.append(nvml.nvmlDeviceGetClockInfo(handle, nvml.NVML_CLOCK_MEM))
        self.reasons |= int(nvml.nvmlDeviceGetCurrentClocksEventReasons(handle))

    def sample(self) -> None:
        """One sample now, on the caller's thread: for a `period_s=None` sampler, which
        samples only when asked, so that timing code can keep NVML out of what it times
        (`wavefront.measure.rounds.run_rounds`; data/public_call/RUNS.md#90b37ae)."""
        if self._nvml is None:
            return
        try:
            handle, self.max_sm = _handle_and_max_sm(self.device)
            self._sample(handle)
        except Exception:
            pass

    def _run(self):
        try:
            handle, self.max_sm = _handle_and_max_sm(self.device)
            while not self._stop.is_set():
                self._sample(handle)
                time.sleep(self.period_s)
            self._sample(handle)
        except Exception:
            pass

    def __enter__(self):
        if self._nvml is not None and self.period_s is not None:
            self._thread = threading.Thread(target=self._run, daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=2)

    def conditions(self) -> Conditions:
        names = [n for bit, n in {**_THROTTLE_REASONS, **_BENIGN_REASONS}.items()
                 if self.reasons & bit]
        measured = self._nvml is not None and bool(self.sm)
        sm = float(statistics.median(self.sm)) if self.sm else None
        # Throttled: a power/thermal reason was seen AND the clock really sat below its maximum
        # (the power-cap reason is reported at full boost clock too on these parts).
        slowed = bool(self.reasons & sum(_THROTTLE_REASONS))
        below = sm is not None and self.max_sm and sm < 0.97 * self.max_sm
        return Conditions(
            host=socket.gethostname(), gpu_uuid=gpu_uuid(self.device),
            sm_clock_mhz=sm,
            mem_clock_mhz=float(statistics.median(self.mem)) if self.mem else None,
            throttle_reasons="|".join(names) if measured else None,
            throttled=bool(slowed and below) if measured else None)
