"""The cache model (CPU, no GPU needed): one launch's DRAM reads and kernel time predicted for
an H100 by the timed model (calibrated on measured step times, paper/fits.json), for two K/V
scan orders, beside the bytes any order must read once: what `wavefront simulate` prints, and
what `wavefront advise` ranks configurations by.

    python examples/06_simulate_advise.py
"""
from pathlib import Path

from wavefront.model.calibration import calibration_for, read_calibrations
from wavefront.model.counting import launch_counts
from wavefront.model.presets import gpu_preset
from wavefront.model.timed import memory_timing, simulate_timed
from wavefront.point import plan

h100 = gpu_preset("h100")
fits = Path(__file__).resolve().parents[1] / "paper" / "fits.json"
compute_of = calibration_for("h100", h100, read_calibrations(fits))
for schedule in ("persistent+linear", "persistent+sawtooth"):  # B1 H1 S128k D64, not causal
    launch = plan((1, 1, 131072, 64), (1, 1, 131072, 64), sms=h100.sms,
                  l2_bytes=h100.l2_bytes, schedule=schedule)
    prediction = simulate_timed(launch, memory_timing(h100), compute_of(launch),
                                l2_bytes=h100.l2_bytes, partitions=h100.l2_partitions)
    once = launch_counts(launch.problem, launch.n_chunks, launch.partial_row_bytes)
    print(f"{schedule:20s} DRAM reads {prediction.dram_read_bytes / 1e6:7.1f} MB "
          f"(each byte once: {once.compulsory_read_bytes / 1e6:.1f} MB), "
          f"kernel {prediction.kernel_ns * 1e-6:.3f} ms (predicted)")
