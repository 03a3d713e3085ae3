"""Co-runners: kernels that share the GPU with an attention launch, to find where a miss costs
time. Each runs on the SMs the attention leaves free (one CTA per SM: its reserved shared
memory keeps every other CTA off that SM) until a `%globaltimer` deadline, and counts the bytes
it moved, so its achieved DRAM bandwidth is known while the attention runs beside it.

Kinds (what a real deployment overlaps with attention):
- `read`: streams loads through a buffer far larger than the L2;
- `copy`: loads one large buffer and stores into another (a streaming copy, an all-gather's
  local copy);
- `append`: stores only, sequentially (a KV-cache append);
- `gemm_like`: loads from a small operand that stays in the L2 and writes a large output once
  (a GEMM's traffic shape: L2-resident operands, its output written through the L2). Not a GEMM:
  it has no arithmetic; it only moves bytes the way one does.

Each load and store carries one of the cache policies PTX offers, so the L2 lines a co-runner
leaves behind differ: loads `ca` (default), `cg`, `cs` (evict-first), `lu` (last use), or an
`L2::cache_hint` policy of evict_first / evict_last; stores `wb` (default), `cg`, `cs`, `wt`
(write-through), `L1::no_allocate`, or an evict_first / evict_last hint.

`L2Hold` takes L2 away from everything else without touching the attention's code: it sets the
context's persisting L2 limit and fills a buffer through an access-policy window that marks its
lines persisting, so normal accesses (the attention's) see the L2 minus the held bytes.
Process-level only: no device setting changes, and the limit and the persisting lines are reset
when the hold ends.
"""
from __future__ import annotations

import ctypes
import time
from dataclasses import dataclass

KINDS = ("read", "copy", "append", "gemm_like")
LOAD_POLICIES = ("ca", "cg", "cs", "lu", "evict_first", "evict_last")
STORE_POLICIES = ("wb", "cg", "cs", "wt", "no_allocate", "evict_first", "evict_last")
BUFFER_BYTES = 2 << 30  # 40x the L2: every streaming access misses it
OPERAND_BYTES = 8 << 20  # gemm_like's operand: stays in the L2
THREADS = 512
RESERVE_SHARED_BYTES = 200 << 10  # leaves too little shared memory for any other CTA
NO_LIMIT = (1 << 64) - 1


def _load(policy: str) -> str:
    if policy in ("evict_first", "evict_last"):
        return ('asm volatile("ld.global.L2::cache_hint.v4.s32 {%0,%1,%2,%3}, [%4], %5;" '
                ': "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p), "l"(policy));')
    op = "" if policy == "ca" else f".{policy}"
    return (f'asm volatile("ld.global{op}.v4.s32 {{%0,%1,%2,%3}}, [%4];" '
            ': "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));')


def _store(policy: str) -> str:
    if policy in ("evict_first", "evict_last"):
        return ('asm volatile("st.global.L2::cache_hint.v4.s32 [%0], {%1,%2,%3,%4}, %5;" '
                ':: "l"(p), "r"(v.x), "r"(v.y), "r"(v.z), "r"(v.w), "l"(policy) : "memory");')
    op = {"wb": "", "no_allocate": ".L1::no_allocate"}.get(policy, f".{policy}")
    return (f'asm volatile("st.global{op}.v4.s32 [%0], {{%1,%2,%3,%4}};" '
            ':: "l"(p), "r"(v.x), "r"(v.y), "r"(v.z), "r"(v.w) : "memory");')


def _policy_register(load: str, store: str) -> str:
    hinted = {p for p in (load, store) if p in ("evict_first", "evict_last")}
    if len(hinted) > 1:
        raise ValueError("load and store hints must agree (one policy register): "
                         f"load={load!r}, store={store!r}")
    if not hinted:
        return ""
    return ("unsigned long long policy; asm volatile(\"createpolicy.fractional.L2::"
            f"{hinted.pop()}.b64 %0, 1.0;\" : \"=l\"(policy));")


def corunner_source(kind: str, load: str = "ca", store: str = "wb") -> str:
    """CUDA C of one co-runner: `kind` moving 16-byte vectors with the named cache policies."""
    if kind not in KINDS:
        raise ValueError(f"kind: expected one of {KINDS}, got {kind!r}")
    if load not in LOAD_POLICIES:
        raise ValueError(f"load policy: expected one of {LOAD_POLICIES}, got {load!r}")
    if store not in STORE_POLICIES:
        raise ValueError(f"store policy: expected one of {STORE_POLICIES}, got {store!r}")
    reads = kind in ("read", "copy", "gemm_like")
    writes = kind in ("copy", "append", "gemm_like")
    # gemm_like reads its small operand (src_vec vectors) over and over; the others stream
    read_step = "{ const int4* p = src + i; int4 v; " + _load(load) + " acc ^= v.x ^ v.w; x = v; }"
    write_step = "{ int4* p = dst + j; int4 v = x; v.y ^= k; " + _store(store) + " }"
    body = "\n".join(s for s in (
        read_step if reads else "x.x += 1;",
        write_step if writes else "",
        "i += stride; if (i >= src_vec) i -= src_vec;" if reads else "",
        "j += stride; if (j >= dst_vec) j -= dst_vec;" if writes else "") if s)
    return f"""
extern "C" __global__ void corunner(const int4* __restrict__ src, long long src_vec,
                                    int4* __restrict__ dst, long long dst_vec,
                                    unsigned long long deadline_ns,
                                    unsigned long long step_limit,
                                    unsigned long long* counts, int* sink) {{
    extern __shared__ int reserve[];  // only reserved: keeps other CTAs off this SM
    {_policy_register(load, store)}
    const long long stride = (long long)gridDim.x * blockDim.x;
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    long long j = i;
    int acc = 0;
    int4 x = make_int4(threadIdx.x, blockIdx.x, 0, 0);
    unsigned long long steps = 0;
    while (true) {{
        // 32 vectors between clock checks: the check costs next to nothing
        #pragma unroll 8
        for (int k = 0; k < 32; ++k) {{
            {body}
        }}
        steps += 32;
        unsigned long long now;
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
        if (now >= deadline_ns || steps >= step_limit) break;
    }}
    atomicAdd(counts + 0, {16 if reads else 0} * steps);
    atomicAdd(counts + 1, {16 if writes else 0} * steps);
    if (acc == 0x13572468) sink[0] = acc + reserve[0] + x.y;  // keeps the loads
}}
"""


_NOW_SOURCE = r"""
extern "C" __global__ void global_now(unsigned long long* out) {
    unsigned long long now;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
    out[0] = now;
}
"""


@dataclass(frozen=True)
class CoRunnerSpec:
    """One co-runner: what it does and with which cache policies."""

    kind: str
    load: str = "ca"
    store: str = "wb"

    def __post_init__(self):
        corunner_source(self.kind, self.load, self.store)  # validates

    @property
    def label(self) -> str:
        parts = [self.kind]
        if self.kind in ("read", "copy", "gemm_like"):
            parts.append(f"ld.{self.load}")
        if self.kind in ("copy", "append", "gemm_like"):
            parts.append(f"st.{self.store}")
        return " ".join(parts)


class CoRunner:
    """Runs one co-runner on its own stream: `start(ctas, seconds)`, `finish()` -> the bytes it
    read and wrote and its elapsed time (CUDA events)."""

    def __init__(self, spec: CoRunnerSpec, buffers: "Buffers"):
        import cupy
        self.cupy, self.spec, self.buffers = cupy, spec, buffers
        self.kernel = cupy.RawKernel(corunner_source(spec.kind, spec.load, spec.store),
                                     "corunner", options=("-std=c++17",))
        self.kernel.max_dynamic_shared_size_bytes = RESERVE_SHARED_BYTES
        self.counts = cupy.zeros(2, dtype=cupy.uint64)
        self.sink = cupy.zeros(1, dtype=cupy.int32)
        self.stream = cupy.cuda.Stream(non_blocking=True)

    def start(self, ctas: int, seconds: float | None, step_limit: int = NO_LIMIT) -> None:
        """Runs until `seconds` have passed on the GPU's clock (None: no deadline) or each
        thread has moved `step_limit` vectors (a fixed amount of work: what a profiler, which
        delays a launch, can replay)."""
        cupy = self.cupy
        src = self.buffers.operand if self.spec.kind == "gemm_like" else self.buffers.src
        self.counts.fill(0)
        cupy.cuda.Device().synchronize()
        deadline = NO_LIMIT if seconds is None else gpu_now_ns() + int(seconds * 1e9)
        self.began, self.ended = cupy.cuda.Event(), cupy.cuda.Event()
        self.began.record(self.stream)
        self.kernel((ctas,), (THREADS,),
                    (src, cupy.int64(src.nbytes // 16), self.buffers.dst,
                     cupy.int64(self.buffers.dst.nbytes // 16), cupy.uint64(deadline),
                     cupy.uint64(step_limit), self.counts, self.sink),
                    shared_mem=RESERVE_SHARED_BYTES, stream=self.stream)
        self.ended.record(self.stream)

    def finish(self) -> dict:
        self.ended.synchronize()
        ms = self.cupy.cuda.get_elapsed_time(self.began, self.ended)
        read, written = (int(x) for x in self.counts.get())
        return {"corunner_ms": ms, "corunner_read_bytes": read,
                "corunner_write_bytes": written,
                "corunner_read_gbps": read / (ms * 1e-3) / 1e9,
                "corunner_write_gbps": written / (ms * 1e-3) / 1e9}


class Buffers:
    """The co-runners' buffers, allocated once: two streaming buffers (random, never zeros) and
    a small operand."""

    def __init__(self, stream_bytes: int = BUFFER_BYTES):
        import cupy
        rng = cupy.random.default_rng(7)
        self.src = rng.integers(0, 1 << 30, stream_bytes // 4, dtype=cupy.int32)
        self.dst = rng.integers(0, 1 << 30, stream_bytes // 4, dtype=cupy.int32)
        self.operand = rng.integers(0, 1 << 30, OPERAND_BYTES // 4, dtype=cupy.int32)


_now = {}


def gpu_now_ns() -> int:
    """The GPU's %globaltimer, read by a one-thread kernel (the co-runners' deadline clock)."""
    import cupy
    if "kernel" not in _now:
        _now["kernel"] = cupy.RawKernel(_NOW_SOURCE, "global_now")
        _now["out"] = cupy.zeros(1, dtype=cupy.uint64)
    _now["kernel"]((1,), (1,), (_now["out"],))
    return int(_now["out"].get()[0])


# ---- taking L2 away: a persisting access-policy window over a held buffer ------------------

_CU_LIMIT_PERSISTING_L2_CACHE_SIZE = 0x06
_CU_STREAM_ATTRIBUTE_ACCESS_POLICY_WINDOW = 1
_CU_ACCESS_PROPERTY_STREAMING, _CU_ACCESS_PROPERTY_PERSISTING = 1, 2
_CUDA_DEV_ATTR_MAX_PERSISTING_L2 = 108  # cudaDevAttrMaxPersistingL2CacheSize


class _AccessPolicyWindow(ctypes.Structure):
    _fields_ = [("base_ptr", ctypes.c_void_p), ("num_bytes", ctypes.c_size_t),
                ("hitRatio", ctypes.c_float), ("hitProp", ctypes.c_int),
                ("missProp", ctypes.c_int)]


class _StreamAttrValue(ctypes.Union):  # CUlaunchAttributeValue: 64 bytes since CUDA 12
    _fields_ = [("accessPolicyWindow", _AccessPolicyWindow), ("pad", ctypes.c_char * 64)]


def _driver():
    lib = ctypes.CDLL("libcuda.so.1")
    for name, args in (("cuCtxSetLimit", (ctypes.c_int, ctypes.c_size_t)),
                       ("cuCtxGetLimit", (ctypes.POINTER(ctypes.c_size_t), ctypes.c_int)),
                       ("cuCtxResetPersistingL2Cache", ()),
                       ("cuStreamSetAttribute", (ctypes.c_void_p, ctypes.c_int,
                                                 ctypes.POINTER(_StreamAttrValue)))):
        getattr(lib, name).argtypes = args
        getattr(lib, name).restype = ctypes.c_int
    return lib


def _check(code: int, what: str) -> None:
    if code != 0:
        raise RuntimeError(f"{what} failed with CUDA driver error {code}")


def max_persisting_bytes() -> int:
    """How much L2 this GPU lets a context set aside for persisting lines."""
    import cupy
    return int(cupy.cuda.runtime.deviceGetAttribute(_CUDA_DEV_ATTR_MAX_PERSISTING_L2,
                                                    cupy.cuda.Device().id))


class L2Hold:
    """`with L2Hold(nbytes):` the L2 minus `nbytes` for everything else. Sets the context's
    persisting limit, marks a buffer of `nbytes` persisting through a stream access-policy
    window and reads it until its lines are resident; on exit resets the persisting lines and
    sets the limit back to what it was. `nbytes=0` holds nothing (the control)."""

    def __init__(self, nbytes: int, *, fill_passes: int = 4):
        if nbytes < 0:
            raise ValueError(f"nbytes: expected >= 0, got {nbytes}")
        self.nbytes, self.fill_passes = int(nbytes), fill_passes

    def __enter__(self):
        if not self.nbytes:
            return self
        import cupy
        limit = max_persisting_bytes()
        if self.nbytes > limit:
            raise ValueError(f"nbytes: this GPU sets aside at most {limit} bytes for "
                             f"persisting lines, asked for {self.nbytes}")
        self.lib = _driver()
        old = ctypes.c_size_t()
        _check(self.lib.cuCtxGetLimit(ctypes.byref(old), _CU_LIMIT_PERSISTING_L2_CACHE_SIZE),
               "cuCtxGetLimit")
        self.old_limit = old.value
        try:  # whatever fails after the limit is set, the limit goes back
            _check(self.lib.cuCtxSetLimit(_CU_LIMIT_PERSISTING_L2_CACHE_SIZE, self.nbytes),
                   "cuCtxSetLimit(persisting L2)")
            got = ctypes.c_size_t()
            _check(self.lib.cuCtxGetLimit(ctypes.byref(got), _CU_LIMIT_PERSISTING_L2_CACHE_SIZE),
                   "cuCtxGetLimit")
            self.granted = got.value  # what the driver set aside, which it may round
            self.buffer = cupy.random.default_rng(11).integers(0, 1 << 30, self.nbytes // 4,
                                                               dtype=cupy.int32)
            self.stream = cupy.cuda.Stream(non_blocking=True)
            self._window(self.buffer.data.ptr, min(self.buffer.nbytes, self.granted))
            self.refill()
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def _window(self, base: int, nbytes: int) -> None:
        value = _StreamAttrValue()
        value.accessPolicyWindow = _AccessPolicyWindow(
            base, nbytes, 1.0, _CU_ACCESS_PROPERTY_PERSISTING, _CU_ACCESS_PROPERTY_STREAMING)
        _check(self.lib.cuStreamSetAttribute(self.stream.ptr,
                                             _CU_STREAM_ATTRIBUTE_ACCESS_POLICY_WINDOW,
                                             ctypes.byref(value)), "cuStreamSetAttribute")

    def refill(self) -> None:
        """Reads the held buffer through the window (its lines persisting)."""
        if not self.nbytes:
            return
        with self.stream:
            for _ in range(self.fill_passes):
                self.buffer.sum()
        self.stream.synchronize()

    def __exit__(self, *exc):
        if not self.nbytes or not hasattr(self, "old_limit"):
            return
        import cupy
        cupy.cuda.Device().synchronize()
        try:
            if hasattr(self, "stream"):
                self._window(0, 0)  # the stream's window cleared
            _check(self.lib.cuCtxResetPersistingL2Cache(), "cuCtxResetPersistingL2Cache")
        finally:
            _check(self.lib.cuCtxSetLimit(_CU_LIMIT_PERSISTING_L2_CACHE_SIZE, self.old_limit),
                   "cuCtxSetLimit(reset)")
            self.__dict__.pop("buffer", None)
            del self.old_limit


PROBE_SOURCE = r"""
extern "C" __global__ void probe_passes(const int4* __restrict__ buf, long long n_vec,
                                        int passes, int* sink) {
    // Every SM reads the whole buffer `passes` times; each pass shifts which SM reads which
    // line, as the CTAs of an attention launch all read the same K/V.
    const long long stride = (long long)gridDim.x * blockDim.x;
    const long long me = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    int acc = 0;
    for (int pass = 0; pass < passes; ++pass) {
        long long shift = (long long)pass * 7 * blockDim.x;
        for (long long i = me; i < n_vec; i += stride) {
            long long at = i + shift;
            if (at >= n_vec) at -= n_vec * (at / n_vec);
            int4 v = buf[at];
            acc ^= v.x ^ v.y ^ v.z ^ v.w;
        }
    }
    if (acc == 0x13572468) sink[0] = acc;
}
"""
PROBE_PASSES = 8


class Probe:
    """The L2 capacity normal loads see, from DRAM bytes: every SM reads a buffer of a given
    size PROBE_PASSES times in one launch; a size that fits reads DRAM about once (a miss
    fraction near 1/PROBE_PASSES), one that does not nearly every pass. Profiled by Nsight
    Compute (`exposure_profile`), not timed: the co-runners' own rates showed loads served
    faster than DRAM allows, so the probe counts DRAM bytes instead of trusting a rate."""

    def __init__(self, nbytes: int):
        import cupy
        from wavefront.device import current_device
        self.cupy, self.nbytes = cupy, int(nbytes)
        self.sms = current_device().sms
        self.kernel = cupy.RawKernel(PROBE_SOURCE, "probe_passes")
        self.buf = cupy.random.default_rng(3).integers(0, 1 << 30, self.nbytes // 4,
                                                       dtype=cupy.int32)
        self.sink = cupy.zeros(1, dtype=cupy.int32)

    def __call__(self):
        cupy = self.cupy
        self.kernel((2 * self.sms,), (THREADS,), (self.buf, cupy.int64(self.nbytes // 16),
                                                  cupy.int32(PROBE_PASSES), self.sink))


def l2_left_from_probe(rows: list[dict]) -> float | None:
    """The largest probed size whose DRAM reads stayed under half of what reading it on
    every pass would cost; None when none did."""
    fits = [r["probe_bytes"] for r in rows
            if r["dram__bytes_read.sum"] < 0.5 * PROBE_PASSES * r["probe_bytes"]]
    return float(max(fits)) if fits else None


# ---- rounds: the attention's schedules beside a co-runner -----------------------------------

def checked_launchers(points: dict, seed: int) -> dict:
    """{name: (launcher, q, k, v, out)} for each point ({name: Point, or (Point, launcher
    options such as {"record_order": "per_cta"})}), each checked against the float32 reference
    first (IncorrectResult otherwise): a wrong kernel is not timed."""
    import cupy

    from wavefront.kernel.launcher import launcher_for
    from wavefront.measure.bench import IncorrectResult, random_inputs, relative_error
    from wavefront.results.measurement import CORRECTNESS_TOLERANCE
    runs = {}
    for name, point in points.items():
        point, options = point if isinstance(point, tuple) else (point, {})
        q, k, v = random_inputs(point, seed + 1)
        launcher, _ = launcher_for(q, k, v, **options, **point.attention_kwargs())
        err = relative_error(point, seed, record_order=options.get("record_order", False),
                             launcher=launcher)
        if not err < CORRECTNESS_TOLERANCE:
            raise IncorrectResult(f"{name}: relative error {err:.3g}")
        runs[name] = (launcher, q, k, v, cupy.empty_like(q))
    return runs


def paired_rounds(points: dict, environments: dict, *, rounds: int = 6, seed: int = 0,
                  spare_ctas: int, progress=None) -> list[dict]:
    """For each environment ({name: CoRunnerSpec | (CoRunnerSpec, CTAs) | int (bytes held) |
    None}), `rounds` rounds;
    in each, the co-runner runs (or the hold is refilled) and every point ({name: Point}) is
    launched once, in a random order, on its own stream, timed with CUDA events and its SM
    clock and throttle state sampled while it ran. -> one record per (environment, round,
    point). Every point is checked against the float32 reference first."""
    import cupy
    import numpy as np

    from wavefront.device import current_device
    from wavefront.measure.conditions import ConditionsSampler
    dev = current_device()
    runs = checked_launchers(points, seed)
    stream = cupy.cuda.Stream(non_blocking=True)
    alone = {}
    for name, (launcher, q, k, v, out) in runs.items():
        launcher(q, k, v, out, stream.ptr)  # warm-up (compiles, loads)
        stream.synchronize()
        began = time.perf_counter()
        launcher(q, k, v, out, stream.ptr)
        stream.synchronize()
        alone[name] = time.perf_counter() - began
    # the co-runner outlasts a round even if it doubled every launch
    seconds = 2.5 * sum(alone.values()) + 0.3
    environments = {name: (env, spare_ctas) if isinstance(env, CoRunnerSpec) else env
                    for name, env in environments.items()}
    needs_buffers = any(isinstance(e, tuple) for e in environments.values())
    buffers = Buffers() if needs_buffers else None
    rng = np.random.default_rng(seed)
    records = []
    for env_name, env in environments.items():
        corunner, ctas = (CoRunner(env[0], buffers), env[1]) if isinstance(env, tuple) else (
            None, 0)
        hold = L2Hold(env if isinstance(env, int) else 0)
        with hold:
            for r in range(rounds):
                hold.refill()
                if corunner:
                    corunner.start(ctas, seconds)
                    time.sleep(0.02)  # the co-runner takes its SMs before the attention starts
                times, stop = {}, None
                for idx in rng.permutation(len(runs)):
                    name = list(runs)[idx]
                    launcher, q, k, v, out = runs[name]
                    with ConditionsSampler(period_s=0.02) as sampler:
                        start, stop = cupy.cuda.Event(), cupy.cuda.Event()
                        start.record(stream)
                        launcher(q, k, v, out, stream.ptr)
                        stop.record(stream)
                        stop.synchronize()
                    cond = sampler.conditions()
                    times[name] = (cupy.cuda.get_elapsed_time(start, stop), cond)
                traffic, overran = {}, False
                if corunner:
                    traffic = corunner.finish()
                    overran = cupy.cuda.get_elapsed_time(stop, corunner.ended) < 0
                for name, (ms, cond) in times.items():
                    records.append({"gpu": dev.name, "sms": dev.sms, "environment": env_name,
                                    "round": r, "point": name, "ms": ms,
                                    "held_bytes": hold.nbytes,
                                    "granted_bytes": getattr(hold, "granted", 0),
                                    "corunner_ctas": ctas,
                                    "sm_clock_mhz": cond.sm_clock_mhz,
                                    "throttle_reasons": cond.throttle_reasons,
                                    "throttled": cond.throttled, "overran": overran,
                                    **traffic})
                if progress:
                    progress(env_name, r)
    return records


def solo_traffic(specs: dict, ctas_list, *, seconds: float = 0.3) -> list[dict]:
    """Each co-runner alone at each CTA count: the bandwidth it takes with nothing beside it."""
    from wavefront.device import current_device
    dev = current_device()
    buffers = Buffers()
    out = []
    for name, spec in specs.items():
        runner = CoRunner(spec, buffers)
        runner.start(ctas_list[0], 0.05)  # warm-up: module load
        runner.finish()
        for ctas in ctas_list:
            runner.start(ctas, seconds)
            out.append({"gpu": dev.name, "environment": name, "corunner_ctas": ctas,
                        **runner.finish()})
    return out
