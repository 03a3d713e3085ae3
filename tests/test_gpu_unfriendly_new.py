"""Issue 55, item 6, the cases only a GPU array can reach (torch CUDA tensors): lengths and
block tables on the GPU (dtype, shape, values out of the cache, checked by the kernels and
raised by the call with WAVEFRONT_CHECK_LENGTHS=1 or by the next call), views, outputs and
streams of the cache call; the backward's lse/out/dout; the Plan run on other arrays; the
options of both calls with real arrays. Classified as in `test_unfriendly_new.py`
(`unfriendly_outcomes`); every case must end "clear" (or "ok": a hostile but valid call that
must finish). The file imports nothing added with it, so it also runs against older code (to
count the outcomes before the fixes)."""
from __future__ import annotations

import math
import os

import pytest

from unfriendly_outcomes import Case, Damaged, count, outcome, wanted

pytestmark = pytest.mark.gpu
torch = pytest.importorskip("torch")
# The torch ops' first call imports torch._dynamo and sympy. Under a case's tracemalloc that import
# alone ran past the 20 s limit on an H200 host (a "hang"), and the alarm left sympy half-imported
# for the worker's later cases ("module 'sympy' has no attribute 'printing'"). Import it here.
import torch._dynamo  # noqa: E402,F401

BF16 = torch.bfloat16


def _t(*shape, dtype=BF16, device="cuda"):
    return torch.randn(shape, device=device).to(dtype)


def _i(values, dtype=torch.int32, device="cuda"):
    return torch.tensor(values, dtype=dtype, device=device)


# --------------------------------------------------------------------------------------------
# The cache call
# --------------------------------------------------------------------------------------------

def kv(*, q=None, k_cache=None, v_cache=None, cache_seqlens=None, check_now=False, **kw):
    """attention_with_kvcache on a contiguous cache (2 sequences, 256 keys, 2 K/V heads,
    8 query heads, D=64) or, with block_table given, a pool of 8 pages of 16."""
    def call():
        import wavefront
        paged = kw.get("block_table") is not None
        shape = (8, 16, 2, 64) if paged else (2, 256, 2, 64)
        qq = _t(2, 1, 8, 64) if q is None else q()
        kc = _t(*shape) if k_cache is None else k_cache()
        vc = _t(*shape) if v_cache is None else v_cache()
        seqlens = _i([3, 5]) if cache_seqlens is None else cache_seqlens()
        options = {name: (value() if callable(value) else value) for name, value in kw.items()}
        previous = os.environ.get("WAVEFRONT_CHECK_LENGTHS")
        if check_now:
            os.environ["WAVEFRONT_CHECK_LENGTHS"] = "1"
        try:
            out = wavefront.attention_with_kvcache(qq, kc, vc, seqlens, **options)
            torch.cuda.synchronize()
            return out
        finally:
            if previous is None:
                os.environ.pop("WAVEFRONT_CHECK_LENGTHS", None)
            else:
                os.environ["WAVEFRONT_CHECK_LENGTHS"] = previous
    return call


def kv_then_next(**kw):
    """A call with bad lengths on the GPU (not checked at once), then
    `check_kvcache_flags()`: it must raise, naming the argument the first call's kernels
    clamped."""
    def call():
        kv(**kw)()
        from wavefront.kernel.kvcache import check_kvcache_flags
        check_kvcache_flags()  # (waits): the flags the first call's kernels raised
    return call


def kv_append_intact(seqlens, paged=False):
    """Append 4 keys through GPU lengths `seqlens` (checked at once): the call must raise,
    and the cache's keys outside what a good length would write stay as they were."""
    def call():
        import wavefront
        shape = (8, 16, 2, 64) if paged else (2, 256, 2, 64)
        k_cache, v_cache = _t(*shape), _t(*shape)
        before = k_cache.clone(), v_cache.clone()
        options = {"block_table": _i(TABLE)} if paged else {}
        previous = os.environ.get("WAVEFRONT_CHECK_LENGTHS")
        os.environ["WAVEFRONT_CHECK_LENGTHS"] = "1"
        try:
            wavefront.attention_with_kvcache(_t(2, 1, 8, 64), k_cache, v_cache, _i(seqlens),
                                             k=_t(2, 4, 2, 64), v=_t(2, 4, 2, 64), **options)
        finally:
            torch.cuda.synchronize()
            if previous is None:
                os.environ.pop("WAVEFRONT_CHECK_LENGTHS", None)
            else:
                os.environ["WAVEFRONT_CHECK_LENGTHS"] = previous
            # sequence 0's bad length: none of its keys may change (sequence 1's good length
            # writes its 4 new keys, which are left out of the comparison)
            first = slice(0, 4) if paged else slice(0, 1)
            if not (torch.equal(before[0][first], k_cache[first])
                    and torch.equal(before[1][first], v_cache[first])):
                raise Damaged("the cache of the sequence with a bad length was overwritten")
    return call


TABLE = [[0, 1, 2, 3], [4, 5, 6, 7]]
KV_CASES = [
    Case("gpu kv append through length 2**31-1 keeps the cache",
         kv_append_intact([2 ** 31 - 1, 3]), "k/v were appended"),
    Case("gpu kv append through length 2**31-3 keeps the paged cache",
         kv_append_intact([2 ** 31 - 3, 3], paged=True), "k/v were appended"),
    Case("gpu kv append through length -2 keeps the cache",
         kv_append_intact([-2, 3]), "k/v were appended"),
    Case("gpu kv cache_seqlens int64", kv(cache_seqlens=lambda: _i([3, 5], torch.int64)),
         "cache_seqlens on the GPU must be int32"),
    Case("gpu kv cache_seqlens float32", kv(cache_seqlens=lambda: _i([3, 5], torch.float32)),
         "cache_seqlens on the GPU must be int32"),
    Case("gpu kv cache_seqlens one too many", kv(cache_seqlens=lambda: _i([3, 5, 7])),
         "cache_seqlens must have shape (2,)"),
    Case("gpu kv cache_seqlens 0-D", kv(cache_seqlens=lambda: _i(3)),
         "cache_seqlens must have shape (2,)"),
    Case("gpu kv cache_seqlens 2-D", kv(cache_seqlens=lambda: _i([[3, 5]])),
         "cache_seqlens must have shape (2,)"),
    Case("gpu kv block_table int64", kv(block_table=lambda: _i(TABLE, torch.int64)),
         "block_table on the GPU must be int32"),
    Case("gpu kv block_table float", kv(block_table=lambda: _i(TABLE, torch.float32)),
         "block_table on the GPU must be int32"),
    Case("gpu kv block_table of another batch", kv(block_table=lambda: _i(TABLE + [[0, 0, 0, 0]])),
         "block_table must be 2-D (batch=2"),
    Case("gpu kv block_table 1-D", kv(block_table=lambda: _i([0, 1, 2, 3])),
         "block_table"),
    Case("gpu kv length past the cache (checked now)",
         kv(cache_seqlens=lambda: _i([3, 300]), check_now=True),
         "cache_seqlens held a length", errors=(ValueError,)),
    Case("gpu kv negative length (checked now)",
         kv(cache_seqlens=lambda: _i([-4, 3]), check_now=True), "cache_seqlens held a length"),
    Case("gpu kv length 2**31-1 (checked now)",
         kv(cache_seqlens=lambda: _i([2 ** 31 - 1, 3]), check_now=True),
         "cache_seqlens held a length"),
    Case("gpu kv page id past the pool (checked now)",
         kv(block_table=lambda: _i([[0, 9, 2, 3], [4, 5, 6, 7]]),
            cache_seqlens=lambda: _i([40, 3]), check_now=True), "block_table held a page id"),
    Case("gpu kv negative page id (checked now)",
         kv(block_table=lambda: _i([[-1, 1, 2, 3], [4, 5, 6, 7]]), check_now=True),
         "block_table held a page id"),
    Case("gpu kv appended past the cache (checked now)",
         kv(cache_seqlens=lambda: _i([254, 3]), k=lambda: _t(2, 4, 2, 64),
            v=lambda: _t(2, 4, 2, 64), check_now=True), "cache_seqlens held a length"),
    Case("gpu kv length past the cache, the next check raises",
         kv_then_next(cache_seqlens=lambda: _i([3, 257])), "cache_seqlens held a length"),
    Case("gpu kv page id past the pool, the next check raises",
         kv_then_next(block_table=lambda: _i([[0, 1, 2, 3], [4, 5, 6, 100]]),
                      cache_seqlens=lambda: _i([3, 60])), "block_table held a page id"),
    Case("gpu kv q head_dim strided", kv(q=lambda: _t(2, 1, 8, 128)[..., ::2]),
         "q must be contiguous in its last"),
    Case("gpu kv k_cache head_dim strided", kv(k_cache=lambda: _t(2, 256, 2, 128)[..., ::2]),
         "k_cache must be contiguous in its last"),
    Case("gpu kv q a transposed view (valid)",
         kv(q=lambda: _t(2, 8, 1, 64).transpose(1, 2)), None),
    Case("gpu kv k_cache on the CPU", kv(k_cache=lambda: _t(2, 256, 2, 64, device="cpu")),
         "k_cache must be on a CUDA device"),
    Case("gpu kv v_cache float16", kv(v_cache=lambda: _t(2, 256, 2, 64, dtype=torch.float16)),
         "v_cache dtype must match q"),
    Case("gpu kv q float32", kv(q=lambda: _t(2, 1, 8, 64, dtype=torch.float32)),
         "q dtype must be one of"),
    Case("gpu kv q batch 0", kv(q=lambda: _t(0, 1, 8, 64)), "q batch must be at least 1"),
    Case("gpu kv GQA 6 over 4", kv(q=lambda: _t(2, 1, 6, 64), k_cache=lambda: _t(2, 256, 4, 64),
                                   v_cache=lambda: _t(2, 256, 4, 64)), "multiple of k_cache"),
    Case("gpu kv 256 query heads per K/V head",
         kv(q=lambda: _t(2, 1, 256, 64), k_cache=lambda: _t(2, 256, 1, 64),
            v_cache=lambda: _t(2, 256, 1, 64)), "heads / kv_heads must be at most"),
    Case("gpu kv page size 8", kv(k_cache=lambda: _t(8, 8, 2, 64), v_cache=lambda: _t(8, 8, 2, 64),
                                  block_table=lambda: _i(TABLE)), "page_size"),
    Case("gpu kv more new keys than the cache",
         kv(k=lambda: _t(2, 257, 2, 64), v=lambda: _t(2, 257, 2, 64), cache_seqlens=lambda: 0),
         "more than the cache holds"),
    Case("gpu kv out of another shape", kv(out=lambda: _t(2, 1, 8, 128)), "out must be"),
    Case("gpu kv out float16", kv(out=lambda: _t(2, 1, 8, 64, dtype=torch.float16)),
         "out must be"),
    Case("gpu kv out on the CPU", kv(out=lambda: _t(2, 1, 8, 64, device="cpu")),
         "out must be on a CUDA device"),
    Case("gpu kv stream a string", kv(stream="default"), "stream must be"),
    Case("gpu kv stream -1", kv(stream=-1), "stream must be"),
    Case("gpu kv stream a torch stream (valid)", kv(stream=lambda: torch.cuda.Stream()), None),
    Case("gpu kv scale True", kv(scale=True), "scale must be"),
    Case("gpu kv scale inf", kv(scale=math.inf), "scale must be"),
    Case("gpu kv return_lse 'no'", kv(return_lse="no"), "return_lse must be True or False"),
    Case("gpu kv cache_seqlens 10**30", kv(cache_seqlens=lambda: 10 ** 30), "cache_seqlens"),
    Case("gpu kv cache_seqlens 300 on the host", kv(cache_seqlens=lambda: 300),
         "exceeds the cache's 256 keys"),
    Case("gpu kv num_splits 10**9", kv(num_splits=10 ** 9), "num_splits must be"),
    Case("gpu kv cta_order typo", kv(cta_order="prefix-grouped"), "cta_order must be one of"),
    Case("gpu kv prefix_grouped with a GPU block table (valid)",
         kv(block_table=lambda: _i(TABLE), cta_order="prefix_grouped"), None),
]


# --------------------------------------------------------------------------------------------
# The backward
# --------------------------------------------------------------------------------------------

def bw(*, q=None, k=None, v=None, out=None, lse=None, dout=None, **options):
    """attention_backward with B=1 H=4 H_kv=2 S=128 D=64 bf16 arrays, one replaced."""
    def call():
        import wavefront
        qq = _t(1, 4, 128, 64) if q is None else q()
        kk = _t(1, 2, 128, 64) if k is None else k()
        vv = _t(1, 2, 128, 64) if v is None else v()
        oo = _t(1, 4, 128, 64) if out is None else out()
        ll = torch.zeros((1, 4, 128), device="cuda") if lse is None else lse()
        dd = _t(1, 4, 128, 64) if dout is None else dout()
        grads = wavefront.attention_backward(qq, kk, vv, oo, ll, dd, **options)
        torch.cuda.synchronize()
        return grads
    return call


def bw_op(**replace):
    """torch.ops.wavefront.attention_bwd (the op autograd calls) with one argument replaced."""
    def call():
        import wavefront.torch  # noqa: F401
        args = {"dout": _t(1, 4, 128, 64), "q": _t(1, 4, 128, 64), "k": _t(1, 2, 128, 64),
                "v": _t(1, 2, 128, 64), "out": _t(1, 4, 128, 64),
                "lse": torch.zeros((1, 4, 128), device="cuda")}
        args.update({name: make() for name, make in replace.items()})
        return torch.ops.wavefront.attention_bwd(*args.values())
    return call


def bw_compiled_wrong_lse():
    def call():
        import wavefront.torch  # noqa: F401

        @torch.compile(fullgraph=True)
        def step(dout, q, k, v, out, lse):
            return torch.ops.wavefront.attention_bwd(dout, q, k, v, out, lse)
        q = _t(1, 4, 128, 64)
        return step(q, q, _t(1, 2, 128, 64), _t(1, 2, 128, 64), q,
                    torch.zeros((1, 4, 64), device="cuda"))
    return call


def bw_varlen(*, lse=None, dout=None, cu_q=(0, 10, 20), **options):
    """attention_backward_varlen of 2 packed sequences of 10 (H=4, H_kv=2, D=64)."""
    def call():
        import wavefront
        q = _t(20, 4, 64)
        kv = _t(20, 2, 64)
        ll = torch.zeros((4, 20), device="cuda") if lse is None else lse()
        dd = _t(20, 4, 64) if dout is None else dout()
        grads = wavefront.attention_backward_varlen(q, kv, kv, _t(20, 4, 64), ll, dd,
                                                    list(cu_q), [0, 10, 20], **options)
        torch.cuda.synchronize()
        return grads
    return call


BW_CASES = [
    Case("gpu bw varlen lse (total, heads)", bw_varlen(lse=lambda: torch.zeros((20, 4),
                                                                               device="cuda")),
         "lse must have shape (4, 20)"),
    Case("gpu bw varlen dout of k's heads", bw_varlen(dout=lambda: _t(20, 2, 64)),
         "dout must have shape (20, 4, 64)"),
    Case("gpu bw varlen cu_seqlens_q short of the rows", bw_varlen(cu_q=(0, 10, 15)),
         "cu_seqlens_q"),
    Case("gpu bw varlen scale inf", bw_varlen(scale=math.inf), "scale must be"),
    Case("gpu bw lse of another seqlen", bw(lse=lambda: torch.zeros((1, 4, 64), device="cuda")),
         "lse must have shape (1, 4, 128)"),
    Case("gpu bw lse bfloat16", bw(lse=lambda: torch.zeros((1, 4, 128), device="cuda",
                                                           dtype=BF16)),
         "lse dtype must be float32"),
    Case("gpu bw lse on the CPU", bw(lse=lambda: torch.zeros((1, 4, 128))),
         "lse must be on a CUDA device"),
    Case("gpu bw lse a transposed view", bw(lse=lambda: torch.zeros((1, 128, 4),
                                                                    device="cuda").transpose(1, 2)),
         "lse must be contiguous in its last"),
    Case("gpu bw dout of k's shape", bw(dout=lambda: _t(1, 2, 128, 64)),
         "dout must have shape (1, 4, 128, 64)"),
    Case("gpu bw dout float16", bw(dout=lambda: _t(1, 4, 128, 64, dtype=torch.float16)),
         "dout dtype must be bfloat16"),
    Case("gpu bw dout head_dim strided", bw(dout=lambda: _t(1, 4, 128, 128)[..., ::2]),
         "dout must be contiguous in its last"),
    Case("gpu bw out float32", bw(out=lambda: _t(1, 4, 128, 64, dtype=torch.float32)),
         "out dtype must be bfloat16"),
    Case("gpu bw out on the CPU", bw(out=lambda: _t(1, 4, 128, 64, device="cpu")),
         "out must be on a CUDA device"),
    Case("gpu bw k float16", bw(k=lambda: _t(1, 2, 128, 64, dtype=torch.float16)),
         "k dtype must match q"),
    Case("gpu bw q 3-D", bw(q=lambda: _t(4, 128, 64)), "q must be 4-D"),
    Case("gpu bw head_dim 96", bw(q=lambda: _t(1, 4, 128, 96), k=lambda: _t(1, 2, 128, 96),
                                  v=lambda: _t(1, 2, 128, 96), out=lambda: _t(1, 4, 128, 96),
                                  dout=lambda: _t(1, 4, 128, 96)), "head_dim"),
    Case("gpu bw GQA 4 over 3", bw(k=lambda: _t(1, 3, 128, 64), v=lambda: _t(1, 3, 128, 64)),
         "must be a multiple of k heads (3)"),
    Case("gpu bw seqlen 0", bw(q=lambda: _t(1, 4, 0, 64), out=lambda: _t(1, 4, 0, 64),
                               dout=lambda: _t(1, 4, 0, 64),
                               lse=lambda: torch.zeros((1, 4, 0), device="cuda")),
         "seqlen must be at least 1"),
    Case("gpu bw scale inf", bw(scale=math.inf), "scale must be"),
    Case("gpu bw tiles an int", bw(tiles=64), "tiles must be one of"),
    Case("gpu bw tiles 256x64", bw(tiles="256x64"), "tiles must be one of"),
    Case("gpu bw deterministic 1", bw(deterministic=1), "deterministic must be True or False"),
    Case("gpu bw schedule unknown scan", bw(schedule="grid+reverse"), "schedule"),
    Case("gpu bw schedule a forward CTA order", bw(schedule="tiled+linear"), "schedule"),
    Case("gpu bw op lse of another seqlen", bw_op(lse=lambda: torch.zeros((1, 4, 64),
                                                                          device="cuda")),
         "lse must have shape"),
    Case("gpu bw op dout a transposed view (valid)",
         bw_op(dout=lambda: _t(1, 4, 64, 128).transpose(2, 3)), None),
    Case("gpu bw compiled with a wrong lse", bw_compiled_wrong_lse(), "lse",
         errors=(Exception,), seconds=120),
]


# --------------------------------------------------------------------------------------------
# The Plan object and the forward's alignment
# --------------------------------------------------------------------------------------------

def planned(run_with, **options):
    """wavefront.plan of (1, 4, 256, 64) bf16 arrays, run on what `run_with()` gives."""
    def call():
        import wavefront
        q, k = _t(1, 4, 256, 64), _t(1, 2, 256, 64)
        plan = wavefront.plan(q, k, k, **options)
        result = plan.run(*run_with())
        torch.cuda.synchronize()
        return result
    return call


PLAN_CASES = [
    Case("gpu plan run with another seqlen",
         planned(lambda: (_t(1, 4, 128, 64), _t(1, 2, 256, 64), _t(1, 2, 256, 64))),
         "q shape must be this Plan's"),
    Case("gpu plan run with float16",
         planned(lambda: tuple(_t(*s, dtype=torch.float16) for s in
                               ((1, 4, 256, 64), (1, 2, 256, 64), (1, 2, 256, 64)))),
         "dtype"),
    Case("gpu plan run with a longer k",
         planned(lambda: (_t(1, 4, 256, 64), _t(1, 2, 512, 64), _t(1, 2, 512, 64))),
         "k shape must be this Plan's"),
    Case("gpu plan run with CPU tensors",
         planned(lambda: (_t(1, 4, 256, 64, device="cpu"), _t(1, 2, 256, 64, device="cpu"),
                          _t(1, 2, 256, 64, device="cpu"))), "must be on a CUDA device"),
    Case("gpu plan run with v of another length",
         planned(lambda: (_t(1, 4, 256, 64), _t(1, 2, 256, 64), _t(1, 2, 128, 64))), "v"),
    Case("gpu plan run with a strided q (valid)",
         planned(lambda: (_t(1, 256, 4, 64).transpose(1, 2), _t(1, 2, 256, 64),
                          _t(1, 2, 256, 64))), None),
    Case("gpu plan with a gpu preset", lambda: __import__("wavefront").plan(
        _t(1, 4, 256, 64), _t(1, 2, 256, 64), _t(1, 2, 256, 64), gpu="h100"),
         "gpu applies to a Plan of shapes"),
    Case("gpu plan tiles '128x'", planned(lambda: (), tiles="128x"), "tiles"),
    Case("gpu attention alignment typo", lambda: __import__("wavefront").attention(
        _t(1, 4, 128, 64), _t(1, 2, 256, 64), _t(1, 2, 256, 64), causal=True,
        causal_alignment="bottom-right"), "causal_alignment must be one of"),
]

ALL = KV_CASES + BW_CASES + PLAN_CASES


@pytest.mark.parametrize("case", ALL, ids=[c.name for c in ALL])
def test_an_unfriendly_gpu_call_ends_clearly(case):
    kind, detail = outcome(case)
    assert kind == wanted(case), f"{case.name}: {kind}: {detail}"


def test_the_gpu_count():
    names = [c.name for c in ALL]
    assert len(set(names)) == len(names)
    counts, bad = count(ALL)
    print(f"{len(ALL)} GPU cases: " + ", ".join(f"{k} {v}" for k, v in counts.items() if v))
    for name, kind, detail in bad:
        print(f"  {kind:9s} {name}: {detail}")
    assert not bad
