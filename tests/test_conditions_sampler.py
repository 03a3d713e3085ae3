"""The NVML sampler without a GPU: a fake NVML. A bench samples only when asked (between its
timed stretches), and NVML is set up once per process, not per sampler."""
import sys
import threading

import pytest

from wavefront.measure import conditions


class FakeNvml:
    NVML_CLOCK_SM, NVML_CLOCK_MEM = 0, 1

    def __init__(self, sm=1980, reasons=0):
        self.sm, self.reasons, self.handles = sm, reasons, 0

    def nvmlDeviceGetHandleByIndex(self, index):
        self.handles += 1
        return ("handle", index)

    def nvmlDeviceGetMaxClockInfo(self, handle, clock):
        return 1980

    def nvmlDeviceGetClockInfo(self, handle, clock):
        return self.sm if clock == self.NVML_CLOCK_SM else 2619

    def nvmlDeviceGetCurrentClocksEventReasons(self, handle):
        return self.reasons

    def nvmlDeviceGetUUID(self, handle):
        return "GPU-fake"


@pytest.fixture(autouse=True)
def _fresh_caches():
    """What a test's fake NVML answered must not stay cached for the tests after it."""
    yield
    for cached in (conditions._nvml, conditions._handle_and_max_sm, conditions.gpu_uuid):
        cached.cache_clear()


def _with_fake(monkeypatch, nvml):
    monkeypatch.setattr(conditions, "_nvml", lambda: nvml)
    monkeypatch.setattr(conditions, "_handle_and_max_sm",
                        conditions._handle_and_max_sm.__wrapped__)
    monkeypatch.setattr(conditions, "gpu_uuid", conditions.gpu_uuid.__wrapped__)


def test_a_sampler_without_a_period_samples_only_when_asked(monkeypatch):
    nvml = FakeNvml(sm=1500, reasons=0x4)  # power cap, well below the maximum clock
    _with_fake(monkeypatch, nvml)
    threads = threading.active_count()
    with conditions.ConditionsSampler(period_s=None) as sampler:
        assert threading.active_count() == threads and sampler.sm == []
        sampler.sample()
        sampler.sample()
    assert sampler.sm == [1500, 1500] and sampler.mem == [2619, 2619]
    cond = sampler.conditions()
    assert cond.sm_clock_mhz == 1500 and cond.throttled is True
    assert "sw_power_cap" in cond.throttle_reasons


def test_a_clock_at_its_maximum_is_not_throttled_whatever_the_reason(monkeypatch):
    _with_fake(monkeypatch, FakeNvml(sm=1980, reasons=0x4))
    with conditions.ConditionsSampler(period_s=None) as sampler:
        sampler.sample()
    assert sampler.conditions().throttled is False


def test_without_nvml_a_sample_is_nothing(monkeypatch):
    monkeypatch.setattr(conditions, "_nvml", lambda: None)
    with conditions.ConditionsSampler(period_s=None) as sampler:
        sampler.sample()
    assert sampler.sm == [] and sampler.conditions().throttled is None


def test_nvml_is_initialised_once_per_process(monkeypatch):
    calls = []

    class Pynvml(FakeNvml):
        def nvmlInit(self):
            calls.append(1)

    monkeypatch.setitem(sys.modules, "pynvml", Pynvml())
    conditions._nvml.cache_clear()
    for _ in range(3):
        conditions.ConditionsSampler(period_s=None)
    assert len(calls) == 1
