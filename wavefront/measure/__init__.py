"""Measuring on a GPU: correctness, CUDA-event timing, Nsight Compute counters, NVML conditions,
worker processes."""
