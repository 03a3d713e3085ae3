"""wavefront: how the order in which CTAs take work, and in which each CTA scans K/V, changes
L2 reuse, DRAM traffic and throughput of FlashAttention on NVIDIA GPUs.

Importing the package loads no GPU library: `attention` and `reference_attention` load cuTile
and CuPy on first use, so the model and the report run on any machine.
"""
from wavefront.api import Plan, plan
from wavefront.point import Point
from wavefront.schedules import CTA_SCHEDULES, KV_SCHEDULES, AttentionProblem, Launch

__all__ = ["attention", "attention_backward", "attention_backward_varlen", "attention_varlen",
           "attention_with_kvcache",
           "plan", "Plan", "reference_attention", "Point", "AttentionProblem", "Launch",
           "CTA_SCHEDULES", "KV_SCHEDULES"]
__version__ = "0.2.0"

_LAZY = {"attention": "wavefront.api", "attention_backward": "wavefront.api",
         "attention_backward_varlen": "wavefront.api", "attention_varlen": "wavefront.api",
         "attention_with_kvcache": "wavefront.api",
         "reference_attention": "wavefront.measure.reference"}


def __getattr__(name):
    if name in _LAZY:
        import importlib
        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value  # found once: `wavefront.attention` is on users' hot path
        return value
    raise AttributeError(f"module 'wavefront' has no attribute {name!r}")
