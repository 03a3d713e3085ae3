"""The cache and throughput model (CPU only): GPU presets, closed-form counts, access traces,
reuse distances, the L2 simulator, fits."""
