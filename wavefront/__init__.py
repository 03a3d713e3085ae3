"""wavefront: how the order in which CTAs take work, and in which each CTA scans K/V, changes
L2 reuse, DRAM traffic and throughput of FlashAttention on NVIDIA GPUs."""
from wavefront.api import attention, plan, reference_attention
from wavefront.schedules import CTA_SCHEDULES, KV_SCHEDULES, AttentionProblem, Launch

__all__ = ["attention", "plan", "reference_attention", "AttentionProblem", "Launch",
           "CTA_SCHEDULES", "KV_SCHEDULES"]
__version__ = "0.1.0"
