"""Does the static order lose its time at one long head to its binary's register spills?

At one head (B1 H1 D128 bf16, 128x64 tiles, two CTAs per SM) the static persistent order ran
slower than the dynamic order and than itself on the ticket-taking binary, at every length,
also where the K and V fit in the L2 and every binary reads the same bytes (`cta_convoy`).
cuTile's JIT compiles each launch for a signature derived from its arguments, and bakes a
dimension of size 1 (one head, a batch of one) into it as a constant. Read from
the binaries the JIT compiled there, the plain static binary spills registers to local memory
inside its K/V loop and the ticket-taking one does not. The test: each binary compiled twice,
for the JIT's signature and for the same signature with q, k, v and out's shapes left free
(`PreparedLaunch(free_shapes=...)`), so the spills move without a change to the code; does the
time follow the spills or the tickets?

Per launch: every binary's output checked against the float32 reference, then ROUNDS rounds
in which each binary runs once in a random order (prepared launches, CUDA events), the speed
over the plain JIT binary paired by round. The spill census: the JIT's plain and ticket
binaries, and their shape-free twins, at several batch and head counts (local loads and
stores in the SASS, `kernel.sass.summarise`). Then each binary's DRAM reads at S256k, under
Nsight Compute (`wavefront profile --free-shapes`, cold L2), in NCU_ROUNDS interleaved rounds.

    python experiments/binary_spills.py run            # on a GPU: data/binary_spills/
    python experiments/binary_spills.py plot --out DIR # anywhere: figure, table
"""
import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import seaborn as sns

from wavefront.report.draft import Section, md_table, span
from wavefront.report.experiments import run_as_script
from wavefront.report.exposure import measured

DATASETS = ()
RECORDS = ("binary_spills",)
ROUNDS = 32
SEQLENS = (65536, 262144)  # the control (K/V in the L2) and the longest cta_convoy length
# the kernel's code: plain, or taking two tickets per work item (clock off)
CODES = {"plain": False, "tickets": "shared"}
SIGNATURES = ("jit", "free shapes")
BASE = "plain, jit"  # what every speed is paired against
# (batch, heads, tiles) whose binaries the census reads (D128, S8k, static persistent)
CENSUS = ((1, 1, "128x64"), (1, 2, "128x64"), (2, 1, "128x64"), (2, 8, "128x64"),
          (4, 32, "128x64"), (1, 1, "64x64"), (4, 32, "64x64"))
SEED = 11
NCU_LAUNCH = 262144  # where the binaries' DRAM reads are counted (the control's are equal)
NCU_ROUNDS = 3  # Nsight Compute rounds, one launch of each binary per round


def _point(seqlen: int, batch: int = 1, heads: int = 1, tiles: str = "128x64"):
    from wavefront.point import Point
    return Point(batch=batch, heads=heads, seqlen=seqlen, head_dim=128, tiles=tiles,
                 occupancy=2, schedule="persistent+linear")


def _binaries(point, seed: int) -> dict:
    """{(code, signature): (prepared launch, its addresses, the arrays)} for `point`."""
    import cupy

    from wavefront.kernel.launcher import launcher_for
    from wavefront.measure.bench import random_inputs
    q, k, v = random_inputs(point, seed)
    out = {}
    for code, order in CODES.items():
        launcher, _ = launcher_for(q, k, v, record_order=order, **point.attention_kwargs())
        o = cupy.full(q.shape, cupy.nan, dtype=q.dtype)
        for sig in SIGNATURES:
            prepared = launcher.prepared_for(q, k, v, o, free_shapes=sig == "free shapes")
            out[(code, sig)] = (prepared, launcher.addresses(q, k, v, o), (q, k, v, o), launcher)
    return out


def _spills(prepared) -> dict:
    from wavefront.kernel.sass import disassemble, kv_loop_mix, summarise
    sass = disassemble(prepared.cubin)
    s = summarise(sass)
    return {"local_loads": s.local_loads, "local_stores": s.local_stores,
            "kv_loop_instructions": kv_loop_mix(sass).get("all"),
            "binary_from": prepared.binary_from}


def measure(out_dir) -> int:
    """The census, then per length the check and the rounds; appended to
    <out_dir>/binaries.jsonl. -> failures."""
    import click
    import cupy

    from wavefront.device import current_device
    from wavefront.measure.bench import output_error
    from wavefront.measure.sink import JsonlSink
    from wavefront.results.measurement import CORRECTNESS_TOLERANCE
    from wavefront.results.records import EXPOSURE_RECORDS
    dev = current_device()
    failures = 0
    stream = cupy.cuda.Stream(non_blocking=True)
    with JsonlSink(out_dir, "binaries.jsonl") as sink:
        def write(row):
            sink.write(EXPOSURE_RECORDS.stamp({"gpu": dev.name, "sms": dev.sms,
                                               "l2_bytes": dev.l2_bytes, **row}))
        for batch, heads, tiles in CENSUS:
            shape = {"batch": batch, "heads": heads, "tiles": tiles}
            try:
                for (code, sig), (prepared, *_rest) in _binaries(
                        _point(8192, batch, heads, tiles), SEED).items():
                    write({"kind": "census", **shape, "code": code, "signature": sig,
                           **_spills(prepared)})
            except Exception as exc:  # recorded, the rest goes on
                failures += 1
                write({"kind": "census", **shape, "error": str(exc)[:300]})
        for seqlen in SEQLENS:
            point = _point(seqlen)
            try:
                runs = _binaries(point, SEED + 1)
                for (code, sig), (prepared, addresses, (q, k, v, o), launcher) in runs.items():
                    o.fill(cupy.nan)
                    if not prepared.launch(stream.ptr, addresses):
                        raise RuntimeError(f"{code}, {sig}: the launch was refused")
                    stream.synchronize()
                    err = output_error(point, q, k, v, o, launcher.launch.problem.tile_m)
                    write({"kind": "check", "seqlen": seqlen, "code": code, "signature": sig,
                           "error_vs_float32": err, **_spills(prepared)})
                    if not err < CORRECTNESS_TOLERANCE:
                        raise ValueError(f"{code}, {sig}: relative error {err:.3g}")
                names = list(runs)
                rng = np.random.default_rng(seqlen)
                with click.progressbar(range(ROUNDS), label=f"S{seqlen // 1024}k rounds") as bar:
                    for r in bar:
                        for i in rng.permutation(len(names)):
                            prepared, addresses, *_ = runs[names[i]]
                            t0, t1 = cupy.cuda.Event(), cupy.cuda.Event()
                            t0.record(stream)
                            if not prepared.launch(stream.ptr, addresses):
                                raise RuntimeError(f"{names[i]}: the launch was refused")
                            t1.record(stream)
                            t1.synchronize()
                            write({"kind": "round", "seqlen": seqlen, "round": r,
                                   "code": names[i][0], "signature": names[i][1],
                                   "ms": cupy.cuda.get_elapsed_time(t0, t1)})
            except Exception as exc:  # recorded, the rest goes on
                failures += 1
                write({"kind": "round", "seqlen": seqlen, "error": str(exc)[:300]})
        failures += _profile(write)
    return failures


def _profile(write) -> int:
    """Nsight Compute's DRAM reads of every binary at NCU_LAUNCH, NCU_ROUNDS rounds, the
    binaries' order reversed from round to round. -> failures."""
    from wavefront.measure.profiling import profile_records
    failures = 0
    binaries = [(code, sig) for code in CODES for sig in SIGNATURES]
    for r in range(NCU_ROUNDS):
        for code, sig in binaries if r % 2 == 0 else binaries[::-1]:
            failures += profile_records(
                write, [_point(NCU_LAUNCH)], {"kind": "ncu", "seqlen": NCU_LAUNCH, "code": code,
                                              "signature": sig, "repeat": r},
                repeats=1, record_order=CODES[code], free_shapes=sig == "free shapes")
    return failures


# ---- analysis (anywhere) ----------------------------------------------------------------------

def _records(study, kind: str) -> pd.DataFrame:
    d = measured(study, "binary_spills", kind)
    return d.assign(binary=d["code"] + ", " + d["signature"])


def census(study) -> pd.DataFrame:
    """Per GPU, shape and binary: its K/V loop's local loads and stores (spills)."""
    c = _records(study, "census")
    if c.empty:
        return c
    c = c.assign(shape=[f"B{int(b)} H{int(h)} {t}"
                        for b, h, t in zip(c["batch"], c["heads"], c["tiles"])])
    return c.drop_duplicates(["GPU", "shape", "binary"], keep="last")[
        ["GPU", "shape", "binary", "code", "signature", "local_loads", "local_stores",
         "kv_loop_instructions"]].reset_index(drop=True)


def dram(study) -> pd.DataFrame:
    """Per GPU, length and binary: Nsight Compute's DRAM reads (GB: median, range, launches)."""
    n = _records(study, "ncu")
    if n.empty:
        return n
    n = n[n["status"] == "ok"]
    return n.groupby(["GPU", "seqlen", "binary"])["dram_read_bytes"].agg(
        dram_gb=lambda x: x.median() / 1e9, dram_lo=lambda x: x.min() / 1e9,
        dram_hi=lambda x: x.max() / 1e9, ncu_launches="size").reset_index()


def table(study) -> pd.DataFrame:
    """Per GPU, length and binary: its spills, median time (range), speed over the plain JIT
    binary paired by round with the 95% interval of the median, and its DRAM reads where
    counted."""
    from wavefront.results.measurement import median_ci95
    r, ch = _records(study, "round"), _records(study, "check")
    if r.empty or ch.empty:
        return pd.DataFrame()
    ms = r.pivot_table(index=["GPU", "run", "seqlen", "round"], columns="binary", values="ms")
    out = []
    for (gpu, seqlen), g in ms.groupby(level=["GPU", "seqlen"]):
        for b in g.columns:
            ratio = (g[BASE] / g[b]).dropna().to_numpy()
            lo, hi = median_ci95(ratio) if len(ratio) >= 6 else (np.nan, np.nan)
            spill = ch[(ch["GPU"] == gpu) & (ch["seqlen"] == seqlen) & (ch["binary"] == b)]
            out.append({"GPU": gpu, "seqlen": int(seqlen),
                        "launch": f"S{int(seqlen) // 1024}k", "binary": b,
                        "spills": int(spill["local_loads"].max() + spill["local_stores"].max()),
                        "error": float(spill["error_vs_float32"].max()),
                        "median ms": float(g[b].median()), "ms lo": float(g[b].min()),
                        "ms hi": float(g[b].max()), "rounds": len(ratio),
                        "speed": float(np.median(ratio)), "lo": lo, "hi": hi})
    rank = {f"{c}, {s}": i for i, (c, s) in enumerate((c, s) for c in CODES for s in SIGNATURES)}
    out = pd.DataFrame(out)
    d = dram(study)
    if not d.empty:
        out = out.merge(d, on=["GPU", "seqlen", "binary"], how="left")
    return out.sort_values(["GPU", "seqlen", "binary"], key=lambda x: x.map(
        rank) if x.name == "binary" else x).reset_index(drop=True)


def clock_check(study) -> dict | None:
    """The check Appendix G's clock needs: the ticket-taking JIT binary (the clocked binary,
    its clock off) against the plain code compiled without spills, as it is without them: the
    time paired by round (plain over tickets, median and 95% interval, all rounds of every run
    at NCU_LAUNCH) and both binaries' DRAM reads (median, range) and whether the ranges
    overlap. None before both were counted."""
    from wavefront.results.measurement import median_ci95
    t, r = table(study), _records(study, "round")
    clocked, plain = "tickets, jit", "plain, free shapes"
    if t.empty or "dram_gb" not in t:
        return None
    at = t[t["seqlen"] == NCU_LAUNCH].set_index("binary")
    if not {clocked, plain} <= set(at.index) or at.loc[[clocked, plain], "dram_gb"].isna().any():
        return None
    ms = r[r["seqlen"] == NCU_LAUNCH].pivot_table(index=["run", "round"], columns="binary",
                                                  values="ms")
    ratio = (ms[plain] / ms[clocked]).dropna().to_numpy()
    lo, hi = median_ci95(ratio)
    a, b = at.loc[clocked], at.loc[plain]
    return {"GPU": a["GPU"], "launch": a["launch"], "clocked": clocked, "plain": plain,
            "speed": float(np.median(ratio)), "lo": lo, "hi": hi, "rounds": len(ratio),
            "clocked GB": a["dram_gb"], "clocked lo": a["dram_lo"], "clocked hi": a["dram_hi"],
            "plain GB": b["dram_gb"], "plain lo": b["dram_lo"], "plain hi": b["dram_hi"],
            "overlap": bool(a["dram_lo"] <= b["dram_hi"] and b["dram_lo"] <= a["dram_hi"])}


def figure(study):
    t = table(study)
    fig, ax = plt.subplots(figsize=(7.5, 3.8))
    binaries = list(dict.fromkeys(t["binary"]))
    launches = list(dict.fromkeys(t["launch"]))
    colours = dict(zip((True, False), sns.color_palette(n_colors=2)))
    markers = dict(zip(launches, "os^D"))
    for _, r in t.iterrows():
        x = binaries.index(r["binary"]) + 0.24 * (launches.index(r["launch"]) - 0.5)
        ax.errorbar(x, r["speed"], yerr=[[r["speed"] - r["lo"]], [r["hi"] - r["speed"]]],
                    fmt=markers[r["launch"]], color=colours[bool(r["spills"] > 0)], capsize=3)
    handles = [plt.Line2D([], [], color=colours[sp], marker="o", ls="none",
                          label="spills (local loads, stores)" if sp else "no spills")
               for sp in (True, False)]
    handles += [plt.Line2D([], [], color="0.4", marker=markers[x], ls="none", label=x)
                for x in launches]
    ax.legend(handles=handles, fontsize=8, loc="center left")
    ax.axhline(1, color="0.5", lw=0.8)
    ax.set_xticks(range(len(binaries)), binaries)
    ax.set(xlabel="binary (its code, the signature it was compiled for)",
           ylabel=f"speed over {BASE} (x)")
    gpus = ", ".join(sorted(t["GPU"].unique()))
    fig.suptitle(f"Time follows the spills, not the code ({gpus}; B1 H1 D128 bf16 128x64, "
                 f"static persistent;\n{ROUNDS} rounds paired with {BASE}; median and 95% "
                 "interval of the median)", fontsize=9)
    fig.tight_layout()
    return fig


def _verdict(follows: bool, bytes_follow: bool) -> str:
    if not follows:
        return ("The time does not follow the spills alone at every length: the table says "
                "where.")
    return ("So the time the static order lost at one head goes with its binary's spills: the "
            "same code compiled without them runs at the ticket-taking binary's speed, and the "
            "ticket-taking code compiled with them at the plain one's"
            + ("; so do the DRAM reads at S256k, where the binaries that spill read several "
               "times more (a hypothesis for how: a CTA slowed by its spills drifts from the "
               "others along K/V, and the L2 serves it less)" if bytes_follow else "")
            + ". Whether a signature spills is the compiler's register allocation for it, and "
            "the code does not tell (the census): a comparison of two binaries needs both "
            "binaries' spills beside it.")


def section(study) -> Section:
    from wavefront.results.measurement import CORRECTNESS_TOLERANCE
    s = Section()
    t, c = table(study), census(study)
    if t.empty:
        s.text = "## Register spills of one head\n\nNo run is in `data/binary_spills` yet."
        return s
    s.claim("Every binary's output is within the float32 reference's tolerance "
            f"(largest relative error {t['error'].max():.2g})",
            bool(t["error"].max() < CORRECTNESS_TOLERANCE),
            t[["launch", "binary", "error"]].round(5).to_dict("records"))
    for (gpu, launch), g in t.groupby(["GPU", "launch"], sort=False):
        spilled, clean = g[g["spills"] > 0], g[g["spills"] == 0]
        base_spills = int(g.loc[g["binary"] == BASE, "spills"].iloc[0])
        others = spilled[spilled["binary"] != BASE]
        s.claim(f"{gpu} {launch}: the binaries without spills ("
                + ", ".join(clean["binary"]) + f") run {span(clean['speed'] - 1, '+.1%')} "
                f"faster than {BASE} ({base_spills} local loads and stores), "
                "intervals " + ("excluding" if (clean["lo"] > 1).all() else "not all excluding")
                + " no change; " + ", ".join(
                    f"{r['binary']} ({r['spills']}) {r['speed'] - 1:+.1%} "
                    f"[{r['lo'] - 1:+.1%}, {r['hi'] - 1:+.1%}]" for _, r in others.iterrows()),
                bool(len(clean) and base_spills > 0 and (clean["lo"] > 1).all()),
                g.round(4).to_dict("records"))
    bytes_follow = False
    if "dram_gb" in t and t["dram_gb"].notna().any():
        d = t.dropna(subset=["dram_gb"])
        clean, spilled = d[d["spills"] == 0], d[d["spills"] > 0]
        apart = (clean["dram_hi"].max() < spilled["dram_lo"].min()
                 or spilled["dram_hi"].max() < clean["dram_lo"].min())
        fewer_bytes = bool(clean["dram_hi"].max() < spilled["dram_lo"].min())
        s.claim(f"Under Nsight Compute at {d['launch'].iloc[0]} ({int(d['ncu_launches'].min())} "
                "launches each, cold L2) the binaries without spills read "
                + ", ".join(f"{r['binary']} {r['dram_gb']:.2f} GB ({r['dram_lo']:.2f}-"
                            f"{r['dram_hi']:.2f})" for _, r in clean.iterrows())
                + ", those with them "
                + ", ".join(f"{r['binary']} {r['dram_gb']:.2f} ({r['dram_lo']:.2f}-"
                            f"{r['dram_hi']:.2f})" for _, r in spilled.iterrows())
                + (": the two groups' ranges are apart" if apart else
                   ": the groups' ranges overlap"), bool(len(clean) and len(spilled)),
                d[["binary", "spills", "dram_gb", "dram_lo", "dram_hi"]].round(3)
                .to_dict("records"))
        bytes_follow = fewer_bytes
    check = clock_check(study)
    if check is not None:
        quiet = check["overlap"] and check["lo"] - 1 > -0.01 and check["hi"] - 1 < 0.01
        s.claim(f"{check['GPU']} {check['launch']}: the ticket-taking JIT binary (Appendix G's "
                f"clocked binary, its clock off) read {check['clocked GB']:.2f} GB "
                f"({check['clocked lo']:.2f}-{check['clocked hi']:.2f}) against the plain code "
                f"without spills' {check['plain GB']:.2f} ({check['plain lo']:.2f}-"
                f"{check['plain hi']:.2f}), the ranges "
                + ("overlapping" if check["overlap"] else "apart")
                + f", and the plain one ran {check['speed'] - 1:+.1%} [{check['lo'] - 1:+.1%}, "
                f"{check['hi'] - 1:+.1%}] against it ({check['rounds']} rounds): "
                + ("against a binary with the same spills the tickets move neither the bytes "
                   "nor the time beyond 1%" if quiet else
                   "the tickets still move the bytes or the time"), True, check)
    follows = all((np.where(g["spills"] > 0, (g["speed"] - 1).abs() < 0.03,
                            g["speed"] > 1.03)).all() for _, g in t.groupby(["GPU", "launch"]))
    s.claim("At both lengths every binary that spills runs within 3% of the plain JIT binary "
            "and every one that does not runs more than 3% faster, whichever its code",
            bool(follows), t[["launch", "binary", "spills", "speed"]].round(4).to_dict("records"))
    shown = pd.DataFrame({
        "GPU": t["GPU"], "launch": t["launch"], "binary": t["binary"],
        "local loads + stores": t["spills"],
        "ms, median (range)": [f"{a:.2f} ({b:.2f}-{c:.2f})" for a, b, c in
                               zip(t["median ms"], t["ms lo"], t["ms hi"])],
        f"speed over {BASE} [95%] (rounds)": [
            f"{r['speed'] - 1:+.1%} [{r['lo'] - 1:+.1%}, {r['hi'] - 1:+.1%}] ({r['rounds']})"
            for _, r in t.iterrows()],
        "DRAM GB, ncu (range)": [
            f"{r['dram_gb']:.2f} ({r['dram_lo']:.2f}-{r['dram_hi']:.2f})"
            if np.isfinite(r.get("dram_gb", np.nan)) else "-" for _, r in t.iterrows()]})
    main_claims, census_text = len(s.claims), ""
    if not c.empty:
        c = c.assign(spills=c["local_loads"] + c["local_stores"])
        wide = c.pivot_table(index=["GPU", "shape"], columns="binary", values="spills",
                             sort=False).astype(int).reset_index()
        jit = c[c["signature"] == "jit"]
        mixed = jit.groupby(["GPU", "shape"])["spills"].agg(lambda x: (x > 0).any()
                                                            and (x == 0).any())
        s.claim(f"Of {jit['shape'].nunique()} shapes, at {int(mixed.sum())} one of the JIT's two "
                "binaries (plain, tickets) spills and the other does not: "
                + ", ".join(x for (_, x), m in mixed.items() if m), bool(len(jit)),
                c[["shape", "binary", "spills"]].to_dict("records"))
        plain = jit[jit["code"] == "plain"].set_index("shape")["spills"]
        s.claim("The plain code's JIT binary (what a launch of it runs) spills at "
                + ", ".join(plain.index[plain > 0]) + " and not at "
                + ", ".join(plain.index[plain == 0]), bool(len(plain)), plain.to_dict())
        census_text = f"""
**Which binaries spill.** The JIT's binaries and their shape-free twins at sequence length 8k,
D128, static persistent (local loads plus stores in the SASS):

{md_table(wide)}

{s.claims[-2].text}. {s.claims[-1].text}.
"""
    s.text = f"""## Register spills of one head: the time follows the spills, not the code

At one head the static persistent order ran slower than the dynamic order and than itself on
the ticket-taking binary, at every length, the control included (`cta_convoy`).
cuTile's JIT compiles a launch for a signature that bakes in its arguments' dimensions of size
1; at one head the plain binary compiled so spills registers to local memory inside its K/V
loop. Each of the plain and the ticket-taking code, compiled for the JIT's signature and for
the same signature with q, k, v and out's shapes free, runs in {ROUNDS} rounds per length in
random order, the speed paired by round against the plain JIT binary
(`experiments/binary_spills.py`; prepared launches, the binaries loaded as compiled).

{md_table(shown)}

{' '.join(c.text + '.' for c in s.claims[:main_claims])}
{census_text}
{_verdict(follows, bytes_follow)}

![binary_spills](figures/binary_spills.png)"""
    return s


if __name__ == "__main__":  # the same as `wavefront experiment ACTION NAME`
    run_as_script(__file__)
