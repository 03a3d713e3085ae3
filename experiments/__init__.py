"""The experiments, one module each (see `wavefront.report.experiments` for what a module
defines).

`DRAFT` is the paper (`paper/draft.md`): the experiments whose sections make its results and its
model, in order, between the paper's front matter (abstract, introduction, related work, method)
and its closing parts (what would make the scan pay, threats to validity, conclusion). A name in
`PARTS` opens a new part of the paper before its section. `APPENDICES` are the rest, each rendered
the same way into `paper/appendix_<name>.md`; an experiment with a figure and no section joins
the appendix of full tables with its figure and table."""

DRAFT = (
    "paper_launch",
    "causal_gqa",
    "exposure_latency",
    "warp_states",
    "exposure_corunners",
    "exposure_small_l2",
    "production_bytes",
    "regimes",
    "shared_prefix",
    "phase_diagram",
)

# the part of the paper a section opens (its heading, before that section)
PARTS = {
    "paper_launch": "Results",
    "exposure_latency": "Where a miss costs time",
    "phase_diagram": "The model",
}

APPENDICES = {
    "kernel": ("schedule_cost", "lever_search", "d128_limits", "carry_over"),
    "call": ("public_call", "untuned_shapes", "varlen_batches", "decode_bench", "short_prompts",
             "generate"),
    "first_kernel": ("foundation", "bench_rounds", "scaling"),
    "counters": ("counter_variance", "kernel_drift", "throughput_vs_misses"),
    "tables": ("knee", "headline", "tiled_fit", "predictions"),
    "regimes": ("ablation", "starved_launch", "dram_bound", "ctas_in_flight", "tiled",
                "cta_convoy", "binary_spills"),
    "model": ("timed_model", "item_clocks", "advisor_picks"),
    "backward": ("backward_bench",),
}


def appendix_of(name: str) -> str:
    """'Appendix F': the appendix an experiment's section is rendered into (the letters follow
    APPENDICES' order, as the draft assigns them)."""
    from wavefront.report.experiments import appendix_letters
    letters = appendix_letters(APPENDICES)
    for appendix, names in APPENDICES.items():
        if name in names:
            return f"Appendix {letters[appendix]}"
    raise ValueError(f"{name!r}: in no appendix of APPENDICES")
