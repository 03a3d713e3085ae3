"""Issue 55, item 6: new unfriendly cases (CPU) aimed at what the latest issues added: the
KV-cache call's arguments, the backward's, `causal_alignment`, the torch ops (on meta tensors,
where their fake implementations run), the Plan object, packed files, the tuned table,
calibrations and carry-over files. Each case is a call and the text its error must hold,
classified by `unfriendly_outcomes.outcome` (clear / unclear / traceback / silent / hang /
memory / damaged); every case must end "clear" (or "ok" for a hostile but valid call).
Array checks that need a GPU array are in `test_gpu_unfriendly_new.py`; here they run on
array descriptions (`_ArrayView`), which is what the call checks."""
from __future__ import annotations

import gzip
import json
import math
import os
from pathlib import Path

import numpy as np
import pytest
import torch

import wavefront
from unfriendly_outcomes import Case, count, outcome, wanted
from wavefront.kernel.arrays import _ArrayView
from wavefront.kernel.kvcache import _host_ints, check_arrays, check_host_lengths

ROOT = Path(__file__).parent.parent
WHERE: dict = {}  # the case's temporary folder (set by the test before the call)


def _dir() -> Path:
    return WHERE["dir"]


# --------------------------------------------------------------------------------------------
# KV-cache: the arrays, as the call describes them
# --------------------------------------------------------------------------------------------

def av(shape, dtype="bfloat16", *, device=0, library="torch", strides=None):
    if isinstance(shape, _ArrayView):
        return shape
    if strides is None:
        strides, step = [], 1
        for size in reversed(shape):
            strides.insert(0, step)
            step *= max(size, 1)
    return _ArrayView(library, tuple(shape), dtype, device, tuple(strides))


def kv(q=(2, 1, 8, 64), kc=(2, 256, 2, 64), vc=None, k=None, v=None, table=None, **views):
    """check_arrays of q, k_cache, v_cache (+ k, v, a block table's shape); `views`
    replaces any description whole."""
    d = {"q": av(q), "k_cache": av(kc), "v_cache": av(kc if vc is None else vc),
         "k": None if k is None else av(k), "v": None if v is None else av(v)}
    d.update(views)
    return lambda: check_arrays(d["q"], d["k_cache"], d["v_cache"], d["k"], d["v"], table)


PAGED = dict(kc=(8, 16, 2, 64), table=(2, 4))
ARRAY_CASES = [
    Case("kv q 3-D", kv(q=(2, 8, 64)), "q must be 4-D"),
    Case("kv q 5-D", kv(q=(2, 1, 8, 64, 1)), "q must be 4-D"),
    Case("kv k_cache 3-D", kv(kc=(2, 256, 64), vc=(2, 256, 2, 64)), "k_cache must be 4-D"),
    Case("kv v_cache 5-D", kv(vc=(2, 256, 2, 64, 1)), "v_cache must be 4-D"),
    Case("kv q float32", kv(q=av((2, 1, 8, 64), "float32")), "q dtype must be one of"),
    Case("kv q int8", kv(q=av((2, 1, 8, 64), "int8")), "q dtype must be one of"),
    Case("kv k_cache float16 beside bf16 q", kv(k_cache=av((2, 256, 2, 64), "float16")),
         "k_cache dtype must match q"),
    Case("kv v_cache float8", kv(v_cache=av((2, 256, 2, 64), "float8_e4m3fn")),
         "v_cache dtype must be one of"),
    Case("kv v_cache of another library", kv(v_cache=av((2, 256, 2, 64), library="cupy")),
         "v_cache must come from the same library as q"),
    Case("kv k_cache on another GPU", kv(k_cache=av((2, 256, 2, 64), device=1)),
         "k_cache must be on q's device"),
    Case("kv q strided head_dim", kv(q=av((2, 1, 8, 64), strides=(1024, 1024, 128, 2))),
         "q must be contiguous in its last"),
    Case("kv k_cache strided head_dim",
         kv(k_cache=av((2, 256, 2, 64), strides=(65536, 256, 128, 2))),
         "k_cache must be contiguous in its last"),
    Case("kv q batch 0", kv(q=(0, 1, 8, 64)), "q batch must be at least 1"),
    Case("kv q seqlen_q 0", kv(q=(2, 0, 8, 64)), "q seqlen_q must be at least 1"),
    Case("kv q heads 0", kv(q=(2, 1, 0, 64)), "q heads must be at least 1"),
    Case("kv head_dim 96", kv(q=(2, 1, 8, 96), kc=(2, 256, 2, 96)), "q head_dim must be one of"),
    Case("kv head_dim 256", kv(q=(2, 1, 8, 256), kc=(2, 256, 2, 256)),
         "q head_dim must be one of"),
    Case("kv head_dim 0", kv(q=(2, 1, 8, 0), kc=(2, 256, 2, 0)), "q head_dim must be one of"),
    Case("kv v_cache shorter", kv(vc=(2, 128, 2, 64)), "v_cache shape must equal k_cache"),
    Case("kv cache head_dim 128 for q 64", kv(kc=(2, 256, 2, 128)),
         "k_cache head_dim must equal q head_dim"),
    Case("kv kv_heads 0", kv(kc=(2, 256, 0, 64)), "must be a multiple of k_cache kv_heads"),
    Case("kv GQA 6 over 4", kv(q=(2, 1, 6, 64), kc=(2, 256, 4, 64)),
         "must be a multiple of k_cache kv_heads (4)"),
    Case("kv more kv_heads than heads", kv(q=(2, 1, 2, 64), kc=(2, 256, 4, 64)),
         "must be a multiple of k_cache kv_heads"),
    Case("kv contiguous cache of another batch", kv(kc=(3, 256, 2, 64)),
         "k_cache batch must equal q batch (2)"),
    Case("kv contiguous cache of 0 keys", kv(kc=(2, 0, 2, 64)),
         "k_cache must hold at least one key"),
    Case("kv page size 8", kv(kc=(8, 8, 2, 64), table=(2, 4)), "page_size"),
    Case("kv page size 48", kv(kc=(8, 48, 2, 64), table=(2, 4)), "page_size"),
    Case("kv page size 512", kv(kc=(8, 512, 2, 64), table=(2, 4)), "page_size"),
    Case("kv page size 1", kv(kc=(8, 1, 2, 64), table=(2, 4)), "page_size"),
    Case("kv page pool of 0 pages", kv(kc=(0, 16, 2, 64), table=(2, 4)),
         "k_cache must hold at least one page"),
    Case("kv block_table 1-D", kv(kc=(8, 16, 2, 64), table=(2,)), "block_table must be 2-D"),
    Case("kv block_table 3-D", kv(kc=(8, 16, 2, 64), table=(2, 4, 1)),
         "block_table must be 2-D"),
    Case("kv block_table of another batch", kv(kc=(8, 16, 2, 64), table=(3, 4)),
         "block_table must be 2-D (batch=2"),
    Case("kv block_table of 0 pages", kv(kc=(8, 16, 2, 64), table=(2, 0)),
         "block_table must have at least one page"),
    Case("kv k without v", kv(k=(2, 1, 2, 64)), "k and v must be given together"),
    Case("kv v without k", kv(v=(2, 1, 2, 64)), "k and v must be given together"),
    Case("kv k 3-D", kv(k=(2, 2, 64), v=(2, 2, 64)), "k must be 4-D"),
    Case("kv k of another batch", kv(k=(3, 1, 2, 64), v=(3, 1, 2, 64)),
         "k must be (batch=2"),
    Case("kv k of other kv_heads", kv(k=(2, 1, 4, 64), v=(2, 1, 4, 64)), "kv_heads=2"),
    Case("kv k of another head_dim", kv(k=(2, 1, 2, 128), v=(2, 1, 2, 128)), "head_dim=64"),
    Case("kv k of 0 new keys", kv(k=(2, 0, 2, 64), v=(2, 0, 2, 64)), "seqlen_new >= 1"),
    Case("kv v longer than k", kv(k=(2, 1, 2, 64), v=(2, 2, 2, 64)),
         "v shape must equal k shape"),
    Case("kv k float16 beside bf16 q",
         kv(k=av((2, 1, 2, 64), "float16"), v=av((2, 1, 2, 64), "float16")),
         "k dtype must match q"),
    Case("kv more new keys than the cache", kv(kc=(2, 4, 2, 64), k=(2, 5, 2, 64), v=(2, 5, 2, 64)),
         "more than the cache holds"),
    Case("kv more new keys than the pages", kv(k=(2, 65, 2, 64), v=(2, 65, 2, 64), **PAGED),
         "more than the cache holds per sequence (64)"),
]


# --------------------------------------------------------------------------------------------
# KV-cache: lengths and page ids given as host data
# --------------------------------------------------------------------------------------------

def lengths(value, table=None, *, k=None, **shape):
    """The host-length path of the call: the arrays' shape, then the lengths (and a host block
    table) read and checked as the call does."""
    def call():
        host_table = None if table is None else _host_ints("block_table", table, 2)
        cs = check_arrays(av(shape.get("q", (2, 1, 8, 64))),
                          av(shape.get("kc", (8, 16, 2, 64) if table is not None
                                       else (2, 256, 2, 64))),
                          av(shape.get("kc", (8, 16, 2, 64) if table is not None
                                       else (2, 256, 2, 64))),
                          None if k is None else av(k), None if k is None else av(k),
                          None if host_table is None else host_table.shape)
        if isinstance(value, (int, np.integer)) and not isinstance(value, bool):
            host = np.full(cs.batch, int(value), dtype=np.int64)  # (as the call reads an int)
        else:
            host = _host_ints("cache_seqlens", value, 1)
        check_host_lengths(cs, host, host_table)
    return call


TABLE = [[0, 1, 2, 3], [4, 5, 6, 7]]
LENGTH_CASES = [
    Case("len floats", lengths([1.5, 2.0]), "cache_seqlens must be integers"),
    Case("len strings", lengths(["1", "2"]), "cache_seqlens must be integers"),
    Case("len bools", lengths([True, False]), "cache_seqlens must be integers"),
    Case("len 2-D", lengths([[1, 2]]), "cache_seqlens must be 1-D"),
    Case("len one too many", lengths([1, 2, 3]), "one length per sequence (batch=2)"),
    Case("len one too few", lengths([1]), "one length per sequence (batch=2)"),
    Case("len empty list", lengths([]), "cache_seqlens must be"),
    Case("len negative", lengths([5, -1]), "cache_seqlens must be >= 0, got -1 for sequence 1"),
    Case("len past the cache", lengths([10, 257]), "cache_seqlens[1] = 257"),
    Case("len past the cache with new keys", lengths([250, 0], k=(2, 7, 2, 64)),
         "cache_seqlens[0] = 250 + 7 new keys exceeds"),
    Case("len int past the cache", lengths(300), "exceeds the cache's 256 keys"),
    Case("len numpy int -1", lengths(np.int64(-1)), "cache_seqlens must be >= 0"),
    Case("len uint64 past int64", lengths(np.array([2 ** 63 + 5, 0], dtype=np.uint64)),
         "cache_seqlens"),
    Case("len object array", lengths(np.array([object(), object()])),
         "cache_seqlens must be integers"),
    Case("len a dict", lengths({0: 1, 1: 2}), "cache_seqlens must be"),
    Case("len CPU float tensor", lengths(torch.tensor([1.0, 2.0])),
         "cache_seqlens must be integers"),
    Case("len CPU bool tensor", lengths(torch.tensor([True, True])),
         "cache_seqlens must be integers"),
    Case("len CPU int tensor too long", lengths(torch.tensor([1, 2, 3], dtype=torch.int32)),
         "one length per sequence"),
    Case("len past the pages", lengths([64, 65], TABLE), "block_table's 4 pages x page_size 16"),
    Case("table float", lengths([1, 1], [[0.0, 1.0, 2.0, 3.0], [4.0, 5, 6, 7]]),
         "block_table must be integers"),
    Case("table NaN", lengths([1, 1], [[math.nan, 1, 2, 3], [4, 5, 6, 7]]),
         "block_table must be integers"),
    Case("table 1-D", lengths([1, 1], [0, 1, 2, 3]), "block_table must be 2-D"),
    Case("table page id past the pool", lengths([17, 1], [[0, 8, 2, 3], [4, 5, 6, 7]]),
         "block_table[0, 1] = 8 is not a page of k_cache (0 to 7)"),
    Case("table negative page id", lengths([1, 1], [[0, 1, 2, 3], [-1, 5, 6, 7]]),
         "block_table[1, 0] = -1 is not a page"),
    Case("table page id 2**40", lengths([1, 1], [[2 ** 40, 1, 2, 3], [4, 5, 6, 7]]),
         "is not a page of k_cache"),
    Case("table strings", lengths([1, 1], [["0", "1", "2", "3"], ["4", "5", "6", "7"]]),
         "block_table must be integers"),
    Case("table ragged rows", lengths([1, 1], [[0, 1, 2, 3], [4, 5]]), "block_table must be"),
]


# --------------------------------------------------------------------------------------------
# KV-cache and backward: the options, through the public call (CPU tensors: the options are
# checked first, so the error names the option, not q's device)
# --------------------------------------------------------------------------------------------

def _t(*shape, dtype=torch.bfloat16):
    return torch.zeros(shape, dtype=dtype)


def kvcall(**options):
    q, kc = _t(2, 1, 8, 64), _t(2, 256, 2, 64)
    seqlens = options.pop("cache_seqlens", 3)
    return lambda: wavefront.attention_with_kvcache(q, kc, kc, seqlens, **options)


KV_OPTION_CASES = [
    Case("kv scale True", kvcall(scale=True), "scale must be"),
    Case("kv scale inf", kvcall(scale=math.inf), "scale must be"),
    Case("kv scale NaN", kvcall(scale=math.nan), "scale must be"),
    Case("kv scale -0.1", kvcall(scale=-0.1), "scale must be"),
    Case("kv scale string", kvcall(scale="0.125"), "scale must be"),
    Case("kv scale complex", kvcall(scale=0.1j), "scale must be"),
    Case("kv num_splits 0", kvcall(num_splits=0), "num_splits must be"),
    Case("kv num_splits -2", kvcall(num_splits=-2), "num_splits must be"),
    Case("kv num_splits 2.0", kvcall(num_splits=2.0), "num_splits must be"),
    Case("kv num_splits True", kvcall(num_splits=True), "num_splits must be"),
    Case("kv num_splits '4'", kvcall(num_splits="4"), "num_splits must be"),
    Case("kv num_splits 10**9", kvcall(num_splits=10 ** 9), "num_splits must be"),
    Case("kv cta_order upper case", kvcall(cta_order="BATCH_MAJOR"), "cta_order must be one of"),
    Case("kv cta_order empty", kvcall(cta_order=""), "cta_order must be one of"),
    Case("kv cta_order list", kvcall(cta_order=["batch_major"]), "cta_order must be one of"),
    Case("kv cta_order 0", kvcall(cta_order=0), "cta_order must be one of"),
    Case("kv causal 'yes'", kvcall(causal="yes"), "causal must be True or False"),
    Case("kv causal 1", kvcall(causal=1), "causal must be True or False"),
    Case("kv causal None", kvcall(causal=None), "causal must be True or False"),
    Case("kv return_lse 'no'", kvcall(return_lse="no"), "return_lse must be True or False"),
    Case("kv return_lse 1", kvcall(return_lse=1), "return_lse must be True or False"),
    Case("kv cache_seqlens None", kvcall(cache_seqlens=None), "cache_seqlens must be"),
    Case("kv cache_seqlens True", kvcall(cache_seqlens=True), "cache_seqlens must be"),
    Case("kv cache_seqlens 3.0", kvcall(cache_seqlens=3.0), "cache_seqlens must be"),
    Case("kv cache_seqlens '3'", kvcall(cache_seqlens="3"), "cache_seqlens must be"),
    Case("kv cache_seqlens 10**30", kvcall(cache_seqlens=10 ** 30), "cache_seqlens"),
    Case("kv cache_seqlens -1", kvcall(cache_seqlens=-1), "cache_seqlens must be"),
    Case("kv stream -1", kvcall(stream=-1), "stream must be"),
    Case("kv stream True", kvcall(stream=True), "stream must be"),
    Case("kv stream a float", kvcall(stream=0.0), "stream must be"),
    Case("kv q a NumPy array", lambda: wavefront.attention_with_kvcache(
        np.zeros((2, 1, 8, 64), np.float16), _t(2, 256, 2, 64), _t(2, 256, 2, 64), 3),
         "q must live in GPU memory"),
    Case("kv q a CPU tensor", kvcall(), "q must be on a CUDA device"),
    Case("kv q a list", lambda: wavefront.attention_with_kvcache(
        [[[[0.0]]]], _t(2, 256, 2, 64), _t(2, 256, 2, 64), 3), "q must be"),
]


def bwcall(**options):
    q = _t(1, 2, 64, 64)
    lse = torch.zeros((1, 2, 64))
    return lambda: wavefront.attention_backward(q, q, q, q, lse, q, **options)


BW_OPTION_CASES = [
    Case("bw causal 'True'", bwcall(causal="True"), "causal must be True or False"),
    Case("bw causal numpy bool", bwcall(causal=np.bool_(True)), "causal must be True or False"),
    Case("bw deterministic 1", bwcall(deterministic=1), "deterministic must be True or False"),
    Case("bw deterministic 'yes'", bwcall(deterministic="yes"),
         "deterministic must be True or False"),
    Case("bw deterministic None", bwcall(deterministic=None),
         "deterministic must be True or False"),
    Case("bw scale inf", bwcall(scale=math.inf), "scale must be"),
    Case("bw scale NaN", bwcall(scale=math.nan), "scale must be"),
    Case("bw scale 0", bwcall(scale=0), "scale must be"),
    Case("bw scale True", bwcall(scale=True), "scale must be"),
    Case("bw scale string", bwcall(scale="1"), "scale must be"),
    Case("bw schedule one name", bwcall(schedule="persistent"), "schedule must be"),
    Case("bw schedule three parts", bwcall(schedule="grid+linear+x"), "schedule must be"),
    Case("bw schedule upper case", bwcall(schedule="GRID+LINEAR"), "schedule"),
    Case("bw schedule a forward-only CTA order", bwcall(schedule="tiled+linear"), "schedule"),
    Case("bw schedule unknown scan", bwcall(schedule="grid+reverse"), "schedule"),
    Case("bw schedule an int", bwcall(schedule=5), "schedule must be"),
    Case("bw schedule empty", bwcall(schedule=""), "schedule must be"),
    Case("bw schedule spaces", bwcall(schedule=" grid + linear"), "schedule"),
    Case("bw tiles '64x'", bwcall(tiles="64x"), "tiles must be one of"),
    Case("bw tiles 'abc'", bwcall(tiles="abc"), "tiles must be one of"),
    Case("bw tiles an int", bwcall(tiles=64), "tiles must be one of"),
    Case("bw tiles a float", bwcall(tiles=64.0), "tiles must be one of"),
    Case("bw tiles one size", bwcall(tiles=(64,)), "tiles must be one of"),
    Case("bw tiles three sizes", bwcall(tiles=(64, 64, 64)), "tiles must be one of"),
    Case("bw tiles 256x256", bwcall(tiles="256x256"), "tiles must be one of"),
    Case("bw tiles negative", bwcall(tiles="-64x64"), "tiles must be one of"),
    Case("bw tiles strings in a tuple", bwcall(tiles=("64", "64")), "tiles must be one of"),
    Case("bw tiles bools", bwcall(tiles=(True, True)), "tiles must be one of"),
    Case("bw causal_alignment typo", bwcall(causal=True, causal_alignment="bottomright"),
         "causal_alignment must be one of"),
    Case("bw causal_alignment None", bwcall(causal_alignment=None),
         "causal_alignment must be one of"),
    Case("bw q a CPU tensor", bwcall(), "q must be on a CUDA device"),
]


def bwvarlen(**options):
    q = _t(20, 2, 64)
    lse = torch.zeros((2, 20))
    return lambda: wavefront.attention_backward_varlen(q, q, q, q, lse, q, [0, 10, 20],
                                                       [0, 10, 20], **options)


BW_VARLEN_CASES = [
    Case("bw varlen scale inf", bwvarlen(scale=math.inf), "scale must be"),
    Case("bw varlen tiles an int", bwvarlen(tiles=128), "tiles must be one of"),
    Case("bw varlen deterministic 'no'", bwvarlen(deterministic="no"),
         "deterministic must be True or False"),
    Case("bw varlen schedule typo", bwvarlen(schedule="persistant+linear"), "schedule must be"),
    Case("bw varlen causal None", bwvarlen(causal=None), "causal must be True or False"),
    Case("bw varlen causal_alignment upper case",
         bwvarlen(causal=True, causal_alignment="BOTTOM_RIGHT"), "causal_alignment"),
    Case("bw varlen q a CPU tensor", bwvarlen(), "q must be on a CUDA device"),
]


def bwshape(q=(1, 2, 64, 64), k=(1, 2, 64, 64), **kw):
    from wavefront.kernel.backward_call import backward_launch
    return lambda: backward_launch(q, k, **kw)


BW_SHAPE_CASES = [
    Case("bw shape q 3-D", bwshape(q=(2, 64, 64)), "q"),
    Case("bw shape k 5-D", bwshape(k=(1, 2, 64, 64, 1)), "k"),
    Case("bw shape head_dim 96", bwshape(q=(1, 2, 64, 96), k=(1, 2, 64, 96)), "head_dim"),
    Case("bw shape k head_dim differs", bwshape(k=(1, 2, 64, 128)), "head_dim"),
    Case("bw shape GQA 3 over 2", bwshape(q=(1, 3, 64, 64)), "multiple of kv_heads"),
    Case("bw shape k batch differs", bwshape(k=(2, 2, 64, 64)), "batch"),
    Case("bw shape seqlen 0", bwshape(q=(1, 2, 0, 64)), "seqlen"),
    Case("bw shape float seqlen", bwshape(q=(1, 2, 64.0, 64)), "seqlen"),
    Case("bw shape sms 0", bwshape(sms=0), "sms"),
    Case("bw shape ctas -1", bwshape(schedule="persistent+linear", ctas=-1), "ctas"),
    Case("bw shape l2 NaN", bwshape(l2_bytes=math.nan), "l2_bytes"),
    Case("bw shape causal_alignment 'top-left'",
         bwshape(causal=True, causal_alignment="top-left"), "causal_alignment must be one of"),
]


# --------------------------------------------------------------------------------------------
# The decode tables, from shapes (the model's side of the cache call)
# --------------------------------------------------------------------------------------------

def decode(problem=None, **kw):
    from wavefront.decode_schedules import DecodeProblem, plan_decode

    def call():
        p = DecodeProblem(**{"batch": 2, "heads": 8, "kv_heads": 2, "seqlen_q": 1,
                             "capacity": 256, "head_dim": 64, **(problem or {})})
        return plan_decode(p, **{"sms": 132, "ctas_per_sm": 2, **kw})
    return call


DECODE_CASES = [
    Case("decode group of 256 heads per K/V head",
         decode({"heads": 256, "kv_heads": 1, "seqlen_q": 1}), "heads / kv_heads must be at most"),
    Case("decode page size 24", decode({"page_size": 24}), "page_size must be one of"),
    Case("decode page size True", decode({"page_size": True}), "page_size must be one of"),
    Case("decode batch 0", decode({"batch": 0}), "batch"),
    Case("decode capacity float", decode({"capacity": 256.0}), "capacity"),
    Case("decode sharing too short", decode(cta_order="prefix_grouped", sharing=(0,)),
         "sharing must hold one key per sequence"),
    Case("decode cta order typo", decode(cta_order="kv-head-major"), "cta_order must be one of"),
    Case("decode splits 10**6", decode(num_splits=10 ** 6), "num_splits must be at most"),
    Case("decode sms negative", decode(sms=-1), "sms"),
    Case("decode seqlen_hint NaN", decode(seqlen_hint=math.nan), "seqlen_hint"),
]


# --------------------------------------------------------------------------------------------
# torch ops: fake implementations on meta tensors (what torch.compile traces) and the SDPA entry
# --------------------------------------------------------------------------------------------

def meta(*shape, dtype=torch.bfloat16):
    return torch.empty(shape, dtype=dtype, device="meta")


def bwd_op(dout=None, q=None, k=None, v=None, out=None, lse=None, *rest):
    import wavefront.torch  # noqa: F401  (registers the ops)
    qq = meta(1, 4, 64, 64)
    kk = meta(1, 2, 64, 64)
    args = [meta(1, 4, 64, 64) if dout is None else dout, qq if q is None else q,
            kk if k is None else k, kk if v is None else v, meta(1, 4, 64, 64) if out is None
            else out, meta(1, 4, 64, dtype=torch.float32) if lse is None else lse, *rest]
    return lambda: torch.ops.wavefront.attention_bwd(*args)


def fwd_op(q, k, v, *rest, op="attention_fwd_lse"):
    import wavefront.torch  # noqa: F401
    return lambda: getattr(torch.ops.wavefront, op)(q, k, v, *rest)


def varlen_op(q=(20, 4, 64), k=(20, 2, 64), v=None, out=None, cu=torch.int32, bwd=False,
              alignment="top_left"):
    import wavefront.torch  # noqa: F401
    cu_q = torch.empty(3, dtype=cu, device="meta")
    if bwd:
        return lambda: torch.ops.wavefront.attention_varlen_bwd(
            meta(*q), meta(*q), meta(*k), meta(*(v or k)), meta(*(out or q)), cu_q, cu_q)
    return lambda: torch.ops.wavefront.attention_varlen(
        meta(*q), meta(*k), meta(*(v or k)), cu_q, cu_q, 10, 10, True, None, None, None,
        alignment)


def sdpa(**kw):
    import wavefront.torch as wft
    q = torch.zeros((1, 2, 16, 64), dtype=torch.bfloat16)
    args = {"query": q, "key": q, "value": q, **kw}
    return lambda: wft.scaled_dot_product_attention(**args)


TORCH_CASES = [
    Case("op bwd lse of the wrong shape", bwd_op(lse=meta(1, 4, 32, dtype=torch.float32)), "lse"),
    Case("op bwd lse 4-D", bwd_op(lse=meta(1, 4, 64, 1, dtype=torch.float32)), "lse"),
    Case("op bwd lse bfloat16", bwd_op(lse=meta(1, 4, 64)), "lse"),
    Case("op bwd dout of k's shape", bwd_op(dout=meta(1, 2, 64, 64)), "dout"),
    Case("op bwd dout float32", bwd_op(dout=meta(1, 4, 64, 64, dtype=torch.float32)), "dout"),
    Case("op bwd out of another seqlen", bwd_op(out=meta(1, 4, 32, 64)), "out"),
    Case("op bwd v shorter than k", bwd_op(v=meta(1, 2, 32, 64)), "v"),
    Case("op bwd GQA 4 over 3", bwd_op(k=meta(1, 3, 64, 64), v=meta(1, 3, 64, 64)), "kv_heads"),
    Case("op bwd q 3-D", bwd_op(q=meta(4, 64, 64), dout=meta(4, 64, 64), out=meta(4, 64, 64),
                                lse=meta(4, 64, dtype=torch.float32)), "q"),
    Case("op bwd k float16", bwd_op(k=meta(1, 2, 64, 64, dtype=torch.float16),
                                    v=meta(1, 2, 64, 64, dtype=torch.float16)), "dtype"),
    Case("op fwd_lse q 3-D", fwd_op(meta(4, 64, 64), meta(4, 64, 64), meta(4, 64, 64)), "q"),
    Case("op fwd_lse head_dims differ", fwd_op(meta(1, 2, 64, 64), meta(1, 2, 64, 128),
                                               meta(1, 2, 64, 128)), "head_dim"),
    Case("op fwd_lse GQA 3 over 2", fwd_op(meta(1, 3, 64, 64), meta(1, 2, 64, 64),
                                           meta(1, 2, 64, 64)), "kv_heads"),
    Case("op attention k and v lengths differ", fwd_op(meta(1, 2, 64, 64), meta(1, 2, 64, 64),
                                                       meta(1, 2, 32, 64), op="attention"), "v"),
    Case("op attention alignment typo", fwd_op(meta(1, 2, 64, 64), meta(1, 2, 64, 64),
                                               meta(1, 2, 64, 64), True, None, None, None,
                                               "bottom-right", op="attention"),
         "causal_alignment must be one of"),
    Case("op attention float32", fwd_op(meta(1, 2, 64, 64, dtype=torch.float32),
                                        meta(1, 2, 64, 64, dtype=torch.float32),
                                        meta(1, 2, 64, 64, dtype=torch.float32),
                                        op="attention"), "dtype"),
    Case("op bwd on CPU tensors", lambda: torch.ops.wavefront.attention_bwd(
        *(torch.zeros(1, 1, 16, 64, dtype=torch.bfloat16),) * 5, torch.zeros(1, 1, 16)),
         "CPU", errors=(NotImplementedError,)),
    Case("op varlen q 4-D", varlen_op(q=(1, 20, 4, 64)), "q must be 3-D"),
    Case("op varlen GQA 4 over 3", varlen_op(k=(20, 3, 64)), "kv_heads"),
    Case("op varlen cu_seqlens float", varlen_op(cu=torch.float32), "cu_seqlens_q"),
    Case("op varlen alignment typo", varlen_op(alignment="bottom_rigth"),
         "causal_alignment must be one of"),
    Case("op varlen bwd out of k's heads", varlen_op(out=(20, 2, 64), bwd=True), "out"),
    Case("op varlen bwd v of another head_dim", varlen_op(v=(20, 2, 128), bwd=True), "v"),
    Case("sdpa scale a list", sdpa(scale=[0.1]), "scale"),
    Case("sdpa scale a string", sdpa(scale="0.1"), "scale"),
    Case("sdpa dropout NaN", sdpa(dropout_p=math.nan), "dropout_p must be 0.0"),
    Case("sdpa is_causal numpy bool", sdpa(is_causal=np.bool_(True)), "is_causal must be"),
    Case("sdpa a mask of ones", sdpa(attn_mask=torch.ones(16, 16, dtype=torch.bool)),
         "attn_mask must be None"),
    Case("sdpa GQA without enable_gqa", sdpa(key=torch.zeros((1, 1, 16, 64), dtype=torch.bfloat16),
                                             value=torch.zeros((1, 1, 16, 64),
                                                               dtype=torch.bfloat16)),
         "enable_gqa=True"),
    Case("sdpa key a NumPy array", sdpa(key=np.zeros((1, 2, 16, 64))), "key must be a torch"),
]


# --------------------------------------------------------------------------------------------
# causal_alignment and the Plan object
# --------------------------------------------------------------------------------------------

def wplan(q=(1, 2, 256, 64), k=(1, 2, 256, 64), v=None, **kw):
    return lambda: wavefront.plan(q, k, v, **{"gpu": "h100", **kw})


def varlen_plan(cq=(0, 10, 20), ck=(0, 20, 40), **kw):
    from wavefront.point import plan_varlen
    return lambda: plan_varlen((20, 2, 64), (40, 2, 64), cq, ck, sms=132, l2_bytes=50 << 20,
                               **{"causal": True, "causal_alignment": "bottom_right", **kw})


VARLEN_CASES = [
    Case("varlen queries without keys, bottom-right", varlen_plan(ck=[0, 0, 40]), "keys"),
    Case("varlen cu_seqlens_q a text", varlen_plan(cq="0,10,20"), "cu_seqlens_q must be"),
    Case("varlen cu_seqlens_k 2-D", varlen_plan(ck=[[0, 20, 40]]), "cu_seqlens_k must be"),
    Case("varlen cu_seqlens_q None", varlen_plan(cq=None), "cu_seqlens_q must be"),
    Case("varlen cu_seqlens_k of uint64 past int64",
         varlen_plan(ck=np.array([0, 20, 2 ** 63 + 1], dtype=np.uint64)), "cu_seqlens_k"),
    Case("varlen cu_seqlens_q of bools", varlen_plan(cq=[False, True, True]), "cu_seqlens_q"),
    Case("varlen cu_seqlens_q a CPU float tensor",
         varlen_plan(cq=torch.tensor([0.0, 10.5, 20.0])), "cu_seqlens_q must be"),
    Case("varlen cu_seqlens_k decreasing", varlen_plan(ck=[0, 30, 20, 40]), "must not decrease"),
    Case("varlen max_seqlen_q 1.5", varlen_plan(max_seqlen_q=1.5), "max_seqlen_q must be"),
    Case("varlen max_seqlen_k 'x'", varlen_plan(max_seqlen_k="40"), "max_seqlen_k must be"),
    Case("varlen max_seqlen_k True", varlen_plan(max_seqlen_k=True), "max_seqlen_k must be"),
    Case("varlen max_seqlen_q NaN", varlen_plan(max_seqlen_q=math.nan), "max_seqlen_q must be"),
]


PLAN_CASES = [
    Case("align trailing space", wplan(causal=True, causal_alignment="bottom_right "),
         "causal_alignment must be one of"),
    Case("align camel case", wplan(causal=True, causal_alignment="BottomRight"),
         "causal_alignment must be one of"),
    Case("align a list", wplan(causal=True, causal_alignment=["top_left"]),
         "causal_alignment must be one of"),
    Case("align bytes", wplan(causal=True, causal_alignment=b"top_left"),
         "causal_alignment must be one of"),
    Case("align varlen typo", varlen_plan(causal_alignment="bottomright"),
         "causal_alignment"),
    Case("align non-causal typo", wplan(causal=False, causal_alignment="diagonal"),
         "causal_alignment must be one of"),
    Case("align varlen max_seqlen_k too small",
         varlen_plan(max_seqlen_k=10),
         "max_seqlen_k"),
    Case("plan of shapes run", lambda: wavefront.plan((1, 2, 256, 64), (1, 2, 256, 64),
                                                      gpu="h100").run(None, None, None),
         "made from shapes", errors=(RuntimeError,)),
    Case("plan of shapes run with tensors", lambda: wavefront.plan(
        (1, 2, 256, 64), (1, 2, 256, 64), gpu="h100").run(_t(1, 2, 256, 64), _t(1, 2, 256, 64),
                                                          _t(1, 2, 256, 64)),
         "made from shapes", errors=(RuntimeError,)),
    Case("plan v of another shape", wplan(v=(1, 2, 128, 64)), "v must be k's shape"),
    Case("plan k an int", wplan(k=5), "k must be a shape"),
    Case("plan stream with shapes", wplan(stream=0), "stream applies to a Plan of GPU arrays"),
    Case("plan q a shape with a float", wplan(q=(1, 2, 256, 64.0)), "q"),
    Case("plan q a shape with a string", wplan(q=(1, 2, "256", 64)), "q"),
    Case("plan unknown gpu preset", wplan(gpu="h900"), "h900"),
    Case("plan gpu an int", wplan(gpu=5), "gpu"),
    Case("plan sms 0", wplan(gpu=None, sms=0, l2_bytes=50 << 20), "sms"),
    Case("plan sms a string", wplan(gpu=None, sms="132", l2_bytes=50 << 20), "sms"),
    Case("plan dtype fp8", wplan(dtype="fp8"), "dtype"),
    Case("plan dtype a torch dtype", wplan(dtype=torch.bfloat16), "dtype"),
    Case("plan gpu with CPU tensors", lambda: wavefront.plan(
        _t(1, 2, 16, 64), _t(1, 2, 16, 64), _t(1, 2, 16, 64), gpu="h100"),
         "gpu applies to a Plan of shapes"),
    Case("plan CPU tensors without v", lambda: wavefront.plan(_t(1, 2, 16, 64),
                                                              _t(1, 2, 16, 64)),
         "v must be given"),
    Case("plan unknown lever", wplan(warp_specialise=True), "warp_specialise",
         errors=(TypeError, ValueError)),
    Case("plan prediction of a huge launch", lambda: wavefront.plan(
        (64, 64, 1 << 20, 128), (64, 64, 1 << 20, 128), gpu="h100").prediction(),
         "max_accesses", seconds=30),
    Case("plan DRAM bytes of a huge launch", lambda: wavefront.plan(
        (64, 64, 1 << 20, 128), (64, 64, 1 << 20, 128), gpu="h100").predicted_dram_bytes,
         "max_accesses", seconds=30),
    Case("plan l2_bytes 10**20", wplan(gpu=None, sms=132, l2_bytes=10 ** 20),
         "l2_bytes must be a positive integer up to"),
    Case("plan sms 10**9", wplan(sms=10 ** 9), "sms must be a positive integer up to"),
    Case("plan huge shape printed", lambda: str(wavefront.plan(
        (64, 64, 1 << 20, 128), (64, 64, 1 << 20, 128), gpu="h100", causal=True)), None,
         seconds=30),
]


# --------------------------------------------------------------------------------------------
# Files: packed files, the tuned table, calibrations, carry-over choices
# --------------------------------------------------------------------------------------------

def _write(name, data: bytes):
    path = _dir() / name
    path.write_bytes(data)
    return path


def _gz(obj) -> bytes:
    return gzip.compress(json.dumps(obj).encode())


def packed(name, make):
    """read_packed of a file `make(path)` makes."""
    from wavefront.files import read_packed

    def call():
        path = _dir() / name
        make(path)
        return read_packed(path, "the test's packed file")
    return call


def read_json_of(text: bytes, name="x.json"):
    from wavefront.files import read_json
    return lambda: read_json(_write(name, text), "the test's JSON")


def _fifo(path):
    os.mkfifo(path)


def _link_loop(path):
    os.symlink(path, path)


def _half_gzip(path):
    data = gzip.compress(b"a,b\n" + b"1,2\n" * 1000)
    path.write_bytes(data[: len(data) // 2])


def _two_members_second_foreign(path):
    path.write_bytes(gzip.compress(b"a,b\n1,2\n") + b"PK\x03\x04 not gzip at all")


def _bomb(directory):
    """600 MiB of zeros packed (about 0.6 MB), written a MiB at a time before the case runs:
    the case's memory is the reader's alone."""
    chunk = b"0" * (1 << 20)
    with gzip.open(directory / "r.csv.gz", "wb", compresslevel=1) as f:
        for _ in range(600):
            f.write(chunk)


def _tuned_entry(**changes):
    entry = {"schedule": "persistent+linear", "tiles": "128x64", "occupancy": 1,
             "shape": "B=1 H=32 KV=32 S=8192 bfloat16", "tflops": 400.0, "x_cudnn": 0.9,
             "measured": "2026-11-25"}
    entry.update(changes)
    return entry


def tuned(table, raw: bytes | None = None):
    from wavefront.kernel.tuning import _parsed_table, _stamp

    def call():
        path = _write("tuned.json", raw if raw is not None else json.dumps(table).encode())
        return _parsed_table(str(path), _stamp(path))
    return call


def _calibration(**changes):
    cal = json.loads((ROOT / "paper" / "fits.json").read_text())["timed_model"]["calibrations"]
    first = dict(cal[next(iter(cal))])
    first["step_ns"] = [dict(r) for r in first["step_ns"]]
    for key, value in changes.items():
        if key.startswith("step0."):
            first["step_ns"][0][key[6:]] = value
        else:
            first[key] = value
    return first


def loaded(loader, name, doc=None, raw: bytes | None = None, make=None):
    """`loader(path)` of a file holding `doc` as JSON, or `raw`, or what `make(path)` makes."""
    def call():
        path = _dir() / name
        if make is not None:
            make(path)
        else:
            path.write_bytes(raw if raw is not None else json.dumps(doc).encode())
        return loader(path)
    return call


def fits(doc=None, raw: bytes | None = None, make=None):
    from wavefront.model.calibration import read_calibrations
    return loaded(read_calibrations, "fits.json", doc, raw, make)


def cal(**changes):
    return fits({"timed_model": {"calibrations": {"NVIDIA H100 80GB HBM3": _calibration(
        **changes)}}})


def choices(doc=None, raw: bytes | None = None, make=None):
    from wavefront.kernel.carry_over import _read_choices
    return loaded(_read_choices, "choices.json", doc, raw, make)


def _choice(**changes):
    config = {"schedule": "persistent+linear", "tiles": "128x64", "occupancy": 1}
    choice = {"config": config, "timed": [{"config": config, "ms": 1.05, "range_ms": [1.0, 1.1]}],
              "left_out": [], "seconds": 2.0}
    choice.update(changes)
    return {"NVIDIA H100 q=[1, 2, 256, 64] k=[1, 2, 256, 64] full table=abc": choice}


def writer(name, initial: bytes | None, data, prepare=None, **kw):
    """write_file onto `name` (holding `initial`), after `prepare(path)`; the snapshot is the
    file's (or its link target's) bytes."""
    from wavefront.files import write_file

    def call():
        path = _dir() / name
        return write_file(path, data, **kw)
    return call


def _snapshot_of(name):
    def snap():
        target = _dir() / name
        try:
            return (target.is_symlink(), (target.resolve()).read_bytes())
        except OSError as exc:
            return type(exc).__name__
    return snap


ROWS = lambda text: len([line for line in text.splitlines() if line.strip()])  # noqa: E731

FILE_CASES = [
    Case("packed FIFO", packed("r.csv.gz", _fifo), "FIFO", seconds=5),
    Case("packed link to itself", packed("r.csv.gz", _link_loop), "r.csv.gz", seconds=5),
    Case("packed half a gzip", packed("r.csv.gz", _half_gzip), "r.csv.gz"),
    Case("packed a zip behind a gzip member", packed("r.csv.gz", _two_members_second_foreign),
         "r.csv.gz"),
    Case("packed plain text named .gz", packed("r.csv.gz",
                                                lambda p: p.write_bytes(b"a,b\n1,2\n")),
         "r.csv.gz"),
    Case("packed empty file named .gz", packed("r.csv.gz", lambda p: p.write_bytes(b"")),
         "r.csv.gz"),
    Case("packed a gzip bomb of 600 MiB", packed("r.csv.gz", lambda path: None), "r.csv.gz",
         seconds=60, memory_bytes=(512 + 128) << 20, setup=_bomb),  # the reader's bound: 512 MiB
    Case("packed /dev/zero behind a link", packed("z.gz", lambda p: os.symlink("/dev/zero", p)),
         "device", seconds=5),
    Case("json 1e400", read_json_of(b'{"a": 1e400}'), "1e400"),
    Case("json -1e400 in a list", read_json_of(b'[1, -1e400]'), "1e400"),
    Case("json nested 100000 deep", read_json_of(b"[" * 100000 + b"]" * 100000), "nested"),
    Case("json UTF-16", read_json_of('{"a": 1}'.encode("utf-16")), "UTF-8"),
    Case("json a BOM", read_json_of(b'\xef\xbb\xbf{"a": 1}'), "x.json"),
    Case("json duplicate key deep down", read_json_of(b'{"a": {"b": 1, "b": 2}}'), "'b' twice"),
    Case("json -Infinity", read_json_of(b'{"a": -Infinity}'), "-Infinity"),
    Case("tuned a list", tuned([1, 2]), "expected a JSON object of GPUs"),
    Case("tuned tflops 1e308", tuned({"H100": {"d64_full": _tuned_entry(tflops=1e308)}}),
         "tflops"),
    Case("tuned tflops 1e400", tuned(None, raw=json.dumps(
        {"H100": {"d64_full": _tuned_entry()}}).replace("400.0", "1e400").encode()), "tuned.json"),
    Case("tuned tflops a string", tuned({"H100": {"d64_full": _tuned_entry(tflops="fast")}}),
         "tflops"),
    Case("tuned tflops True", tuned({"H100": {"d64_full": _tuned_entry(tflops=True)}}),
         "tflops"),
    Case("tuned x_cudnn negative", tuned({"H100": {"d64_full": _tuned_entry(x_cudnn=-1)}}),
         "x_cudnn"),
    Case("tuned occupancy 1.0", tuned({"H100": {"d64_full": _tuned_entry(occupancy=1.0)}}),
         "occupancy"),
    Case("tuned occupancy 10**20", tuned({"H100": {"d64_full": _tuned_entry(occupancy=10 ** 20)}}),
         "occupancy"),
    Case("tuned tiles 128x", tuned({"H100": {"d64_full": _tuned_entry(tiles="128x")}}),
         "tiles"),
    Case("tuned schedule an int", tuned({"H100": {"d64_full": _tuned_entry(schedule=3)}}),
         "schedule"),
    Case("tuned shape of 0 heads", tuned({"H100": {"d64_full": _tuned_entry(
        shape="B=1 H=0 KV=0 S=8192")}}), "shape"),
    Case("tuned key head dim 96", tuned({"H100": {"d96_full": _tuned_entry()}}), "head dim 96"),
    Case("tuned key a typo", tuned({"H100": {"d64_fulll": _tuned_entry()}}), "the key must read"),
    Case("tuned measured a number", tuned({"H100": {"d64_full": _tuned_entry(measured=20261125)}}),
         "measured"),
    Case("tuned gpu maps to a list", tuned({"H100": []}), "must map entry keys"),
    Case("tuned a gzip named .json", tuned(None, raw=_gz({"H100": {}})), "tuned"),
    Case("fits a list", fits([1]), "no timed-model calibration"),
    Case("fits missing timed_model", fits({"other": 1}), "no timed-model calibration"),
    Case("fits calibrations a list", fits({"timed_model": {"calibrations": [1]}}),
         "calibrations must be a mapping"),
    Case("fits a FIFO", fits(make=_fifo), "FIFO", seconds=5),
    Case("fits /dev/zero", fits(make=lambda p: os.symlink("/dev/zero", p)), "device", seconds=5),
    Case("fits truncated", fits(raw=(ROOT / "paper" / "fits.json").read_bytes()[:5000]),
         "no timed-model calibration"),
    Case("cal launch_ns NaN", cal(launch_ns=math.nan), "launch_ns"),
    Case("cal item_ns a string", cal(item_ns="843"), "item_ns"),
    Case("cal step ns 0", cal(**{"step0.ns": 0}), "step_ns[0].ns"),
    Case("cal step ns -1e308", cal(**{"step0.ns": -1e308}), "step_ns[0].ns"),
    Case("cal step head_dim a float", cal(**{"step0.head_dim": 64.7}), "step_ns[0]"),
    Case("cal step head_dim a string", cal(**{"step0.head_dim": "64"}), "step_ns[0]"),
    Case("cal step head_dim 1e400", fits(raw=json.dumps({"timed_model": {"calibrations": {
        "X": _calibration(**{"step0.head_dim": 12345})}}}).replace("12345", "1e400").encode()),
         "step_ns[0]"),
    Case("cal step causal 'false'", cal(**{"step0.causal": "false"}), "step_ns[0]"),
    Case("cal step ctas_per_sm 0", cal(**{"step0.ctas_per_sm": 0}), "step_ns[0]"),
    Case("cal points a string", cal(points="many"), "points"),
    Case("cal step_ns a dict", cal(step_ns={"a": 1}), "step_ns"),
    Case("choices a list", choices([1]), "expected a JSON object of choices"),
    Case("choices a FIFO", choices(make=_fifo), "FIFO", seconds=5),
    Case("choices range_ms reversed", choices(_choice(timed=[{
        "config": {"schedule": "persistent+linear", "tiles": "128x64", "occupancy": 1},
        "ms": 1.5, "range_ms": [2.0, 1.0]}])), "range_ms"),
    Case("choices seconds NaN", choices(None, raw=json.dumps(_choice(seconds=123.5)).replace(
        "123.5", "NaN").encode()), "NaN"),
    Case("choices config not timed", choices(_choice(config={"schedule": "grid+linear",
                                                             "tiles": "64x64",
                                                             "occupancy": 1})),
         "none of the timed configurations"),
    Case("choices timed empty", choices(_choice(timed=[])), "timed"),
    Case("choices left_out a string", choices(_choice(left_out="all")), "left_out"),
    Case("write through a link", writer("t.json", None, b'{"a": 1}'), "link",
         snapshot=_snapshot_of("t.json"),
         setup=lambda d: ((d / "target.json").write_bytes(b'{"keep": 1}'),
                          os.symlink(d / "target.json", d / "t.json"))),
    Case("write onto a directory", writer("d", None, b"x"), "d",
         errors=(ValueError, IsADirectoryError, OSError),
         setup=lambda d: (d / "d").mkdir()),
    Case("write fewer rows", writer("r.csv", None, b"a\n1\n", rows=ROWS), "r.csv",
         snapshot=_snapshot_of("r.csv"),
         setup=lambda d: (d / "r.csv").write_bytes(b"a\n1\n2\n3\n")),
    Case("write onto a FIFO", writer("f", None, b"x"), "f", seconds=5,
         setup=lambda d: os.mkfifo(d / "f")),
    Case("write packed beside a dangling link", writer("r.csv.gz", None, b"a\n1\n"), "link",
         setup=lambda d: os.symlink(d / "nowhere", d / "r.csv.gz")),
]


ALL = (ARRAY_CASES + LENGTH_CASES + KV_OPTION_CASES + BW_OPTION_CASES + BW_VARLEN_CASES
       + BW_SHAPE_CASES
       + DECODE_CASES + TORCH_CASES + PLAN_CASES + VARLEN_CASES + FILE_CASES)


def _prepare(case, tmp: Path):
    WHERE["dir"] = tmp
    if case.setup is not None:
        case.setup(tmp)


@pytest.mark.parametrize("case", ALL, ids=[c.name for c in ALL])
def test_an_unfriendly_call_ends_clearly(case, tmp_path):
    _prepare(case, tmp_path)
    kind, detail = outcome(case)
    assert kind == wanted(case), f"{case.name}: {kind}: {detail}"


def test_the_count(tmp_path_factory):
    names = [c.name for c in ALL]
    assert len(set(names)) == len(names), "case names must be unique"
    counts, bad = count(ALL, lambda c: _prepare(c, tmp_path_factory.mktemp("case")))
    print(f"{len(ALL)} CPU cases: " + ", ".join(f"{k} {v}" for k, v in counts.items() if v))
    for name, kind, detail in bad:
        print(f"  {kind:9s} {name}: {detail}")
    assert len(ALL) >= 150
    assert not bad
