"""What does the lock-step model predict for the paper's launch on GPUs we have not measured (B200)?

The paper's launch on each preset, from the model alone: DRAM reads from the lock-step
simulator with the partition capacity model (the half-L2 model beside it), TFLOP/s from the
H100's fitted throughput model carried over by efficiency. Written to `paper/predictions.csv`
by `wavefront paper`; nothing to measure here. No figure: the draft prints the table.
"""
import pandas as pd

from wavefront.model.fits import PAPER_LAUNCH
from wavefront.model.presets import PRESETS
from wavefront.report.draft import Section, bullet, md_table, wrap
from wavefront.report.experiments import run_as_script

DATASETS = ()


def table(study) -> pd.DataFrame:
    return study.predictions


def section(study) -> Section:
    s = Section()
    # GB10 has one prediction in the draft: the timed model's, calibrated on the paper's own
    # linear baseline (experiments/timed_model.py); this table keeps the other presets
    p = study.predictions[study.predictions["preset"] != "gb10"].reset_index(drop=True)
    shown = pd.DataFrame({
        "GPU (preset)": p["gpu"], "causal": p["causal"], "schedule": p["schedule"],
        "CTAs": p["ctas"], "DRAM reads (GB)": p["dram_read_gb"].map(lambda x: f"{x:.2f}"),
        "x compulsory": p["x_compulsory"].map(lambda x: f"{x:.1f}"),
        "half-L2 model (GB)": p["dram_read_gb_half_l2"].map(lambda x: f"{x:.2f}"),
        "FLOP per DRAM byte": p["flop_per_dram_byte"].map(lambda x: f"{x:.0f}"),
        "balance": p["balance_flop_per_byte"].map(lambda x: f"{x:.0f}"),
        "DRAM-bound": p["dram_bound"], "TFLOP/s": p["tflops"].map(lambda x: f"{x:.0f}")})
    sources = "\n".join(
        bullet(f"{PRESETS[k].name}: " + "; ".join(f"{f}: {src}" for f, src in PRESETS[k].sources))
        for k in ("gb10", "b200", "h100", "h200"))
    cfg = ", ".join(f"{k}={v}" for k, v in PAPER_LAUNCH.items())
    text = wrap(
        f"The paper's launch ({cfg}, persistent, one CTA per SM) on each preset: DRAM reads "
        "from the lock-step simulator with the partition capacity model (the half-L2 model "
        "beside it), and TFLOP/s from the H100's fitted throughput model carried over by "
        "efficiency (the fitted compute and DRAM rates as fractions of the H100's nominal "
        "figures, applied to each preset's; schedule-neutral code; an assumption, not a "
        "measurement). Written to `paper/predictions.csv` before any B200 run. GB10's one "
        "prediction is the timed model's, calibrated on the paper's own linear throughput "
        "(the timed model's section).")
    pairs = p.pivot_table(index=["preset", "causal"], columns="schedule",
                          values="dram_read_gb")
    s.claim("In every preset shown, the lock-step model predicts sawtooth reads no more DRAM "
            "than linear at the paper's launch",
            bool((pairs["persistent+sawtooth"] <= pairs["persistent+linear"] + 1e-9).all()),
            pairs.round(3).reset_index().to_dict("records"))
    s.text = f"""## Predictions before measurements: the lock-step model on B200 (and Hopper)

{text}

{md_table(shown)}

Preset sources (a "guess" has no source we could check):

{sources}"""
    return s


if __name__ == "__main__":  # the same as `wavefront experiment ACTION NAME`
    run_as_script(__file__)
