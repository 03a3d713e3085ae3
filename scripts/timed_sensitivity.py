"""How far the timed model's predictions for the paper's launch move when its H100 calibration
moves by almost nothing (CPU only, about 3 s a simulation).

Rebuilding the model cache once moved the H100 calibration's `item_ns` in its 16th digit, and
the GB10 causal sawtooth prediction at FA2's rate from 3.18 to 3.11 GB: event times that tie
decide which CTA's request reaches the L2 first. The draft's "Predictions before measurements"
now prints each prediction's spread under item_ns x (1 + k x 1e-15), k = -2..2
(`wavefront.report.timed.CALIBRATION_NUDGES`); this script sweeps wider, scaling `item_ns` by
(1 + k x eps) for k = -steps..steps, to show how many digits of each prediction mean anything.

    python scripts/timed_sensitivity.py [--eps 1e-15] [--steps 8] [--rate fast|mid]
"""
import argparse
from pathlib import Path

from wavefront.model.presets import PRESETS
from wavefront.report import timed
from wavefront.report.analysis import Study


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--eps", type=float, default=1e-15, help="relative step of item_ns")
    parser.add_argument("--steps", type=int, default=8, help="k = -steps .. steps")
    parser.add_argument("--rate", choices=("fast", "mid"), default="fast",
                        help="fast: compute at FA2's fraction of peak; mid: the H100's own")
    parser.add_argument("--gpus", default=",".join(timed.PREDICTED_PRESETS))
    args = parser.parse_args()
    calibration = timed.h100_calibration(Study(Path(__file__).resolve().parents[1] / "data"))
    fraction = timed.FA2_FRACTION_OF_PEAK if args.rate == "fast" else None
    print(f"item_ns {calibration.item_ns!r} x (1 + k x {args.eps:g}), k = -{args.steps}.."
          f"{args.steps}; DRAM reads (GB) of the paper's launch at the {args.rate} rate")
    for key in args.gpus.split(","):
        gpu = PRESETS[key]
        for causal in (False, True):
            for schedule in timed.PREDICTED_SCHEDULES:
                launch = timed.paper_launch_on(gpu, causal, schedule)
                reads = [timed.nudged_prediction(calibration, gpu, launch, fraction, k,
                                                 args.eps)[0].dram_read_bytes / 1e9
                         for k in range(-args.steps, args.steps + 1)]
                print(f"  {key:5s} {'causal' if causal else 'full':6s} {schedule:20s} "
                      f"k=0: {reads[args.steps]:.3f}  range {min(reads):.3f}-{max(reads):.3f}",
                      flush=True)


if __name__ == "__main__":
    main()
