"""What limits D=128: the tuned kernel and cuDNN on the same launch, under Nsight Compute.

    ncu --profile-from-start off --clock-control none --metrics <METRICS> \
        python scripts/d128_limits.py [--causal]

Each contender is warmed up unprofiled, then launched once between profiler start and stop
(B1 H32 S8k D128 bf16, fresh random inputs). `METRICS` below are the tensor-pipe activity,
issue activity and the warp stall reasons per issued instruction; print them with
`python scripts/d128_limits.py --metrics`.
"""
import sys

STALLS = ("long_scoreboard", "short_scoreboard", "barrier", "math_pipe_throttle",
          "mio_throttle", "wait", "dispatch_stall", "not_selected", "selected", "lg_throttle",
          "membar", "branch_resolving", "no_instruction", "sleeping", "misc")
METRICS = ",".join([
    "gpu__time_duration.sum",
    "sm__inst_executed_pipe_tensor_op_gmma.avg.pct_of_peak_sustained_active",
    "sm__pipe_tensor_op_gmma_cycles_active.avg.pct_of_peak_sustained_active",
    "smsp__issue_active.avg.pct_of_peak_sustained_active",
    "sm__warps_active.avg.pct_of_peak_sustained_active",
    "launch__registers_per_thread", "launch__block_size", "launch__grid_size",
    *(f"smsp__average_warps_issue_stalled_{s}_per_issue_active.ratio" for s in STALLS)])

if __name__ == "__main__":
    if "--metrics" in sys.argv:
        print(METRICS)
        sys.exit(0)
    import torch
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.nn.functional import scaled_dot_product_attention

    import wavefront
    causal = "--causal" in sys.argv
    g = torch.Generator(device="cuda").manual_seed(3)
    q, k, v = (torch.randn(1, 32, 8192, 128, device="cuda", dtype=torch.bfloat16, generator=g)
               for _ in range(3))

    def cudnn():
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            return scaled_dot_product_attention(q, k, v, is_causal=causal)
    ours = lambda: wavefront.attention(q, k, v, causal=causal)  # noqa: E731
    for run in (ours, cudnn, ours, cudnn):
        run()
    torch.cuda.synchronize()
    err = float((ours().float() - cudnn().float()).norm() / cudnn().float().norm())
    assert err < 2e-2, err
    torch.cuda.cudart().cudaProfilerStart()
    ours()
    cudnn()
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStop()
    print(f"profiled: wavefront tuned and cuDNN, causal={causal}, rel. difference {err:.2e}")
