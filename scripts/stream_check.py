"""Is the starvation experiment's stream reading DRAM, and at what rate? Its own byte count
and durations (CUDA events, the GPU's %globaltimer, the host clock) for one stream launch on
every SM; under ncu (application replay) against Nsight Compute's DRAM bytes and duration.

    python scripts/stream_check.py
    ncu --replay-mode application --clock-control none --kernel-name stream_reads \
        --metrics dram__bytes_read.sum,gpu__time_duration.sum,lts__t_sector_hit_rate.pct \
        python scripts/stream_check.py
"""
import time

import cupy

from wavefront.device import current_device
from wavefront.measure.starvation import Streamer

dev = current_device()
streamer = Streamer()
for seconds in (0.3, 1.0):
    gpu_before = streamer.gpu_now_ns()
    host_before = time.perf_counter()
    streamer.start(dev.sms, seconds)
    gbps = streamer.finish()
    host_s = time.perf_counter() - host_before
    gpu_s = (streamer.gpu_now_ns() - gpu_before) / 1e9
    event_s = cupy.cuda.get_elapsed_time(streamer.began, streamer.ended) / 1e3
    counted = float(streamer.counter.get()[0])
    print(f"deadline {seconds} s on {dev.sms} CTAs: {counted / 1e9:.1f} GB counted; events "
          f"{event_s:.3f} s, globaltimer {gpu_s:.3f} s, host {host_s:.3f} s; "
          f"{gbps:.0f} GB/s by events, {counted / host_s / 1e9:.0f} GB/s by the host clock")
