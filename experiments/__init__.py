"""The experiments, one module each (see `wavefront.report.experiments` for what a module
defines). `DRAFT` is the paper draft: the experiments whose sections it prints, in order,
between the report's front matter (question, method) and its closing lists."""

DRAFT = (
    "foundation",
    "bench_rounds",
    "schedule_cost",
    "lever_search",
    "untuned_shapes",
    "d128_limits",
    "headline",
    "ablation",
    "paper_launch",
    "starved_launch",
    "counter_variance",
    "knee",
    "tiled",
    "tiled_fit",
    "kernel_drift",
    "throughput_vs_misses",
    "dram_bound",
    "ctas_in_flight",
    "causal_gqa",
    "regimes",
    "timed_model",
    "predictions",
    "scaling",
)
