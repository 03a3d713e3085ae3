"""Nsight Compute on contenders that are not one of our points: production kernels (cuDNN and
FlashAttention-2 through torch SDPA, TileGym) beside ours, ours under an L2 hold, and warp-state
sampling. One ncu process per task; inside it, the worker launches each contender once per
repeat under its own NVTX range (`wf:<n>`), between cudaProfilerStart/Stop, so every kernel a
contender launches is attributed to it and nothing else (input set-up, warm-up) is profiled.

    python -m wavefront.measure.exposure_profile --task production --shape 8,1,131072,64 ...

is the worker; `profile_contenders` runs it under ncu and returns one row per contender and
repeat.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile

from wavefront.measure.profiling import (COLD_REPLAY, RESULT_MARK, ProfilerError,
                                         check_ncu_output, find_ncu_report, tag_for)

DRAM_METRICS = ("dram__bytes_read.sum", "dram__bytes_write.sum", "gpu__time_duration.sum")
# Warp states: the average number of warps stalled for each reason per issued instruction
# (WarpStateStats); the reasons are read from the report, not listed here.
WARP_STATE_SECTION = "WarpStateStats"
OURS = ("persistent+linear", "persistent+sawtooth")


def _point(shape, schedule, causal, tiles, ctas, levers=None):
    from wavefront.point import Point
    b, h, s, d = shape
    return Point(batch=b, heads=h, seqlen=s, head_dim=d, causal=causal, tiles=tiles,
                 occupancy=1 if ctas else None, ctas=ctas, schedule=schedule,
                 **(levers or {}))


CORUNNER_STEPS = 2048  # vectors per thread: tens of milliseconds on the spare SMs


def _extra(name: str):
    """A contender named `probe:<MiB>` (the L2 probe over that size) or
    `corunner:<kind>:<load>:<store>` (a co-runner on the SMs the paper's launch leaves, a fixed
    amount of work): -> (launch, after) where after() returns what it counted, or None."""
    from wavefront.device import current_device
    from wavefront.measure import corunners
    kind, _, rest = name.partition(":")
    if kind == "probe":
        probe = corunners.Probe(int(rest) << 20)
        return probe, lambda: {"probe_bytes": probe.nbytes,
                               "probe_passes": corunners.PROBE_PASSES}
    if kind == "corunner":
        what, load, store = rest.split(":")
        spec = corunners.CoRunnerSpec(what, load, store)
        runner = corunners.CoRunner(spec, _extra.buffers)
        ctas = current_device().sms - 48

        def launch():
            runner.start(ctas, None, CORUNNER_STEPS)
            runner.ended.synchronize()
        return launch, lambda: {"corunner": spec.label, "corunner_ctas": ctas,
                                **runner.finish()}
    return None


def _contenders(shape, causal, tiles, ctas, peers: bool, only: str | None = None,
                levers=None):
    """{name: (launch(), after())} for ours (linear, sawtooth), with `peers` the production
    kernels, and any probe or co-runner `only` names."""
    import cupy
    from wavefront.kernel.launcher import launcher_for
    from wavefront.measure.bench import peer_runners, random_inputs
    names = only.split(",") if only else None
    out = {}
    nothing = (lambda: None)
    if names is None or any("+" in n or n in ("cudnn", "fa2", "tilegym") for n in names):
        base = _point(shape, OURS[0], causal, tiles, ctas)
        q, k, v = random_inputs(base, 5)
        o = cupy.empty_like(q)
        for schedule in OURS:
            launcher, _ = launcher_for(q, k, v, **_point(shape, schedule, causal, tiles,
                                                         ctas, levers).attention_kwargs())
            out[schedule] = (lambda launcher=launcher: launcher(
                q, k, v, o, cupy.cuda.get_current_stream().ptr), nothing)
        if peers:
            for name, run in peer_runners(base, [(q, k, v)], tilegym=True).items():
                out[name] = ((lambda run=run: run(0)), nothing)
    if names and any(":" in n for n in names):
        from wavefront.measure.corunners import Buffers
        _extra.buffers = Buffers()
        for n in names:
            made = _extra(n) if ":" in n else None
            if made is not None:
                out[n] = made
    if names:
        out = {name: pair for name, pair in out.items() if name in names}
    return out


def _nvtx():
    from cupy.cuda import nvtx
    return nvtx.RangePush, nvtx.RangePop


def run_worker(args) -> None:
    import cupy
    from wavefront.measure.corunners import L2Hold
    shape = tuple(int(x) for x in args.shape.split(","))
    contenders = _contenders(shape, args.causal, args.tiles, args.ctas, args.peers,
                             args.only, json.loads(args.levers))
    push, pop = _nvtx()
    usable = {}
    for name, (launch, _) in contenders.items():  # warm-up: compiles, autotunes, loads
        try:
            launch()
            cupy.cuda.Device().synchronize()
            usable[name] = contenders[name]
        except Exception as exc:  # a backend that refuses the shape is a result
            print(RESULT_MARK + json.dumps({"contender": name,
                                            "error": f"{type(exc).__name__}: {exc}"[:200]}),
                  flush=True)
    n = 0
    for held in (int(x) for x in args.hold_bytes.split(",")):
        with L2Hold(held) as hold:
            for repeat in range(args.repeats):
                for name, (launch, after) in usable.items():
                    hold.refill()
                    cupy.cuda.Device().synchronize()
                    tag = tag_for(n)
                    push(tag)
                    cupy.cuda.runtime.profilerStart()
                    launch()
                    cupy.cuda.Device().synchronize()
                    cupy.cuda.runtime.profilerStop()
                    pop()
                    print(RESULT_MARK + json.dumps({"tag": tag, "contender": name,
                                                    "repeat": repeat, "held_bytes": held,
                                                    **(after() or {})}), flush=True)
                    n += 1


def _read_actions(report: str, ncu: str) -> list[dict]:
    """Every profiled kernel: its name, NVTX tag and all its numeric metrics."""
    module = find_ncu_report(ncu)
    if module is None:
        raise ProfilerError("ncu_report (Nsight Compute's Python report module) not found")
    from wavefront.measure.profiling import _action_tag, report_actions
    out = []
    for action in report_actions(module, report):
        metrics = {}
        for name in action.metric_names():  # all of them: the warp states are read by name
            try:
                metrics[name] = float(action.metric_by_name(name).as_double())
            except Exception:  # a string or missing metric
                continue
        out.append({"kernel": action.name(), "tag": _action_tag(action), "metrics": metrics})
    return out


def run_marked(ncu: str, options: list[str], program: list[str], report: str,
               timeout_s: float) -> tuple[list[dict], list[dict]]:
    """`program` under ncu with `options`, its report exported to `report`: -> (the marked
    lines it printed, as dicts; every profiled kernel, `_read_actions`)."""
    cmd = [ncu, *options, "--export", report, "--force-overwrite", *program]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s)
    check_ncu_output(proc.stdout + proc.stderr)
    if proc.returncode != 0:
        raise ProfilerError(f"ncu exited {proc.returncode}: {proc.stderr[-400:]}")
    marks = [json.loads(line[len(RESULT_MARK):]) for line in proc.stdout.splitlines()
             if line.startswith(RESULT_MARK)]
    return marks, _read_actions(report, ncu)


def tagged_totals(kernels: list[dict]) -> dict:
    """What one tag's kernels (`_read_actions` rows) add up to: their count, names, and the
    sum of each of DRAM_METRICS."""
    return {"kernels": len(kernels), "kernel_names": sorted({a["kernel"][:60] for a in kernels}),
            **{metric: sum(a["metrics"].get(metric, 0.0) for a in kernels)
               for metric in DRAM_METRICS}}


def profile_contenders(shape, *, causal: bool, tiles: str = "64x64", ctas: int | None = 48,
                       peers: bool = True, repeats: int = 3, hold_bytes=(0,),
                       only: str | None = None, levers: dict | None = None,
                       warp_states: bool = False, timeout_s: float = 900,
                       keep: str | None = None) -> list[dict]:
    """Runs the worker under ncu; -> one row per contender and repeat: its kernels, summed
    DRAM bytes and ncu duration, and (with `warp_states`) the stall reasons. With an L2 hold,
    caches are not flushed between passes (the held lines must stay): one pass per launch."""
    from wavefront.device import find_ncu
    ncu = find_ncu()
    if ncu is None:
        raise ProfilerError("Nsight Compute (ncu) not found")
    replay = list(COLD_REPLAY)
    hold_bytes = [int(x) for x in hold_bytes]
    if any(hold_bytes):
        replay[replay.index("--cache-control") + 1] = "none"
    what = (["--section", WARP_STATE_SECTION, "--metrics", ",".join(DRAM_METRICS)]
            if warp_states else ["--metrics", ",".join(DRAM_METRICS)])
    with tempfile.TemporaryDirectory() as tmp:
        report = os.path.join(keep or tmp, "contenders.ncu-rep")
        program = [sys.executable, "-m", "wavefront.measure.exposure_profile", "--task", "worker",
                   "--shape", ",".join(map(str, shape)), "--tiles", tiles,
                   "--ctas", str(ctas or 0), "--repeats", str(repeats),
                   "--hold-bytes", ",".join(map(str, hold_bytes))]
        program += ["--only", only] if only else []
        program += ["--levers", json.dumps(levers or {})]
        program += ["--causal"] if causal else []
        program += ["--peers"] if peers else []
        marks, actions = run_marked(ncu, [*replay, "--nvtx", *what], program, report,
                                    timeout_s)
    rows = []
    for mark in marks:
        if "error" in mark:
            rows.append({"contender": mark["contender"], "error": mark["error"]})
            continue
        mine = [a for a in actions if a["tag"] == mark["tag"]]
        row = {**mark, "cache_control": replay[replay.index("--cache-control") + 1],
               **tagged_totals(mine)}
        if warp_states and mine:
            # the attention's kernel is the longest one under the tag
            main = max(mine, key=lambda a: a["metrics"].get("gpu__time_duration.sum", 0))
            row["stalls"] = {name: value for name, value in main["metrics"].items()
                             if "issue_stalled" in name and name.endswith("per_warp_active.pct")
                             or ("warp_latency_issue_stalled" in name)
                             or ("issue_stalled" in name and "ratio" in name)}
        row.pop("tag", None)
        rows.append(row)
    return rows


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--task", choices=["worker"], required=True)
    p.add_argument("--shape", required=True, help="B,H,S,D")
    p.add_argument("--causal", action="store_true")
    p.add_argument("--tiles", default="64x64")
    p.add_argument("--ctas", type=int, default=0)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--hold-bytes", default="0", help="comma-separated: one pass per hold")
    p.add_argument("--only", default=None, help="comma-separated contender names")
    p.add_argument("--levers", default="{}", help="kernel levers of ours, as JSON")
    p.add_argument("--peers", action="store_true")
    args = p.parse_args(argv)
    args.ctas = args.ctas or None
    run_worker(args)


if __name__ == "__main__":
    main()
