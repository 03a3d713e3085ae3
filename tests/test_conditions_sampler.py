"""The NVML sampler without a GPU: a fake NVML. A bench samples only when asked (between its
timed stretches), and NVML is set up once per process, not per sampler."""
import sys
import threading

import pytest

from wavefront.measure import conditions
from wavefront.measure import rounds as rounds_module


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


class _FakeCupy:
    """What run_rounds asks of CuPy: events whose elapsed time is the host's, a stream."""

    class _Event:
        def record(self, stream=None):
            import time
            self.at = time.perf_counter()

        def synchronize(self):
            pass

    class _Stream:
        def synchronize(self):
            pass

    def __init__(self):
        import types
        self.cuda = types.SimpleNamespace(
            Event=self._Event, get_current_stream=self._Stream,
            get_elapsed_time=lambda start, stop: (stop.at - start.at) * 1e3)


def test_rounds_time_every_launch_once_and_keep_the_first_calls_host_time(monkeypatch):
    """A contender whose first call of a round is slow (what a host-bound call right after
    another's burst is) shows it in host_first_us, not spread thin over host_us alone; every
    launch gets its own rotating index."""
    import time

    from wavefront.measure.rounds import Contender, run_rounds
    monkeypatch.setitem(sys.modules, "cupy", _FakeCupy())
    monkeypatch.setattr(conditions, "_nvml", lambda: None)
    seen = {"slow_first": [], "even": []}
    last = {"who": None}

    def runner(name, first_s, rest_s):
        def run(i):
            seen[name].append(i)
            # slow when another contender ran last (a round's first call), as the host is
            time.sleep(first_s if last["who"] != name else rest_s)
            last["who"] = name
        return run

    contenders = [Contender("slow_first", runner("slow_first", 0.004, 0.0005), 1.0),
                  Contender("even", runner("even", 0.001, 0.001), 1.0)]
    results = {r.name: r for r in run_rounds(contenders, rounds=6, per_round=4, warmup=2)}
    for name in seen:  # 2 warm-up calls, then 6 rounds x 4, each index once, in order
        assert seen[name] == list(range(2 + 6 * 4))
    slow, even = results["slow_first"], results["even"]
    assert slow.host_first_us > 3500 and slow.host_us < 0.6 * slow.host_first_us
    assert 900 < even.host_first_us < 2500 and 900 < even.host_us < 2500
    assert len(slow.samples_ms) == 6 and slow.samples_ms[0] > 0 and slow.per_round == 4
    # one host probe a round, shared by the round's contenders
    assert len(slow.host_probe_us) == 6 and slow.host_probe_us == even.host_probe_us
    assert all(0 < p < 1000 for p in slow.host_probe_us)
    # and the host's stolen and whole CPU time over each round, where /proc/stat is readable
    if rounds_module.cpu_jiffies() is not None:
        assert len(slow.host_cpu_jiffies) == 6 and slow.host_cpu_jiffies == even.host_cpu_jiffies
        assert all(0 <= stolen <= total for stolen, total in slow.host_cpu_jiffies)


def test_the_hosts_stolen_cpu_time_is_read_from_proc_stat(tmp_path):
    """The steal field and the sum of the first eight of /proc/stat's "cpu" line (guest time
    is inside user and nice already); None for a file that is not one."""
    from wavefront.results.records import steal_share as _steal_share
    stat = tmp_path / "stat"
    stat.write_text("cpu  855284 0 95402 1247609 4171 0 674 350 7 0\n"
                    "cpu0 231052 0 23350 844613 1181 0 126 151 0 0\n")
    assert rounds_module.cpu_jiffies(str(stat)) == (350, 855284 + 95402 + 1247609 + 4171 + 674
                                                     + 350)
    for text in ("cpu0 1 2 3 4 5 6 7 8\n", "cpu 1 2 3\n", "cpu a b c d e f g h\n", ""):
        stat.write_text(text)
        assert rounds_module.cpu_jiffies(str(stat)) is None, text
    assert rounds_module.cpu_jiffies(str(tmp_path / "absent")) is None
    assert _steal_share([[1, 100], [3, 100]]) == "2.0"
    assert _steal_share([]) == "" and _steal_share(None) == "" and _steal_share([[0, 0]]) == ""


def test_the_host_probe_times_its_task_and_keeps_the_fastest_batch(monkeypatch):
    """The probe is the task's time per run (a host slowed 1.5x reads 1.5x), and a batch
    slowed by one interrupt does not count (on a clock the task advances)."""
    import types

    from wavefront.measure import rounds
    clock = {"now": 0.0, "runs": 0}
    monkeypatch.setattr(rounds, "time", types.SimpleNamespace(perf_counter=lambda: clock["now"]))

    def task(seconds):
        def run(table, keys):
            clock["runs"] += 1
            # one run of the third batch is interrupted for 5 ms
            clock["now"] += seconds + (0.005 if clock["runs"] == 50 else 0.0)
        return run

    monkeypatch.setattr(rounds, "_probe_task", task(2e-6))
    assert rounds.host_probe_us(batches=5, calls=20) == pytest.approx(2.0)
    assert clock["runs"] == 100
    monkeypatch.setattr(rounds, "_probe_task", task(3e-6))
    assert rounds.host_probe_us(batches=5, calls=20) == pytest.approx(3.0)
    # every batch interrupted: the probe says so
    clock["runs"] = 0
    monkeypatch.setattr(rounds, "_probe_task",
                        lambda table, keys: clock.update(now=clock["now"] + 2e-6 + 1e-4))
    assert rounds.host_probe_us(batches=2, calls=5) == pytest.approx(102.0)
