"""Is the starvation experiment's stream reading DRAM? Its own byte count against Nsight
Compute's DRAM bytes for one stream launch on every SM (run under ncu, application replay).

    ncu --replay-mode application --clock-control none \
        --metrics dram__bytes_read.sum,gpu__time_duration.sum,lts__t_sector_hit_rate.pct \
        python scripts/stream_check.py
"""
from wavefront.device import current_device
from wavefront.measure.starvation import Streamer

dev = current_device()
streamer = Streamer()
streamer.start(dev.sms, 0.3)
gbps = streamer.finish()
print(f"stream on {dev.sms} CTAs: {float(streamer.counter.get()[0]) / 1e9:.1f} GB counted, "
      f"{gbps:.0f} GB/s by its own count")
