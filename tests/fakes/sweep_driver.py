"""A sweep with an in-process fake runner, for the crash test: it is SIGKILLed at random
moments and restarted until it finishes. Short writes and 'disk full' errors are injected into
os.write. Every task the runner saw stored (on_result returned: the row is fsync'd) is logged.

    python sweep_driver.py OUT_DIR SEED FINISHED_LOG
"""
import json
import os
import random
import sys
import time

from wavefront.results.sweep import parse_spec, run_sweep

SPEC = """
name = "crash"
measure = ["timing", "counters"]
repeats = 2
[grid]
seqlen = [128, 256, 384, 512, 640, 768, 896, 1024, 1152, 1280]
head_dim = [64, 128]
causal = [false, true]
schedule = ["grid+linear", "persistent+linear", "persistent+sawtooth", "grouped+sawtooth",
            "persistent+tiled"]
"""
out_dir, seed, log = sys.argv[1], int(sys.argv[2]), sys.argv[3]
rng = random.Random(seed)
real_write = os.write


def flaky_write(fd, data):
    r = rng.random()
    if len(data) > 20 and r < 0.15:  # a short write; the rest follows after a pause
        n = real_write(fd, data[:len(data) // 2])
        time.sleep(0.005)
        return n
    if len(data) > 20 and r < 0.153:  # the disk fills up mid-row
        real_write(fd, data[:len(data) // 3])
        raise OSError(28, "No space left on device (injected)")
    return real_write(fd, data)


os.write = flaky_write


class Runner:
    def run(self, tasks, spec, on_result, on_artifact=None):
        for task in tasks:
            time.sleep(0.03)
            on_result(task, {"median_ms": 1.0, "rel_error": 1e-3, "reps": 3}
                      if task["measurement"] == "timing" else {"dram_read_bytes": 1.0}, None)
            with open(log, "a") as f:
                f.write(json.dumps([task["point"], task["measurement"], task["repeat"]]) + "\n")


run_sweep(parse_spec(SPEC), out_dir, gpu="FakeGPU", sms=132, l2_bytes=50 << 20,
          runner=Runner(), progress=False)
