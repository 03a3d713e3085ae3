"""Decode with a shared prefix: does a CTA order that runs sharers together read fewer DRAM bytes, and run faster?

Decode batches (one query token per sequence, H32 over KV8, D128, bf16, 64-token pages) whose
sequences share a prompt in groups of G through block tables pointing at the same physical
pages. `wavefront.attention_with_kvcache` with cta_order batch_major (default), kv_head_major
and prefix_grouped, one split: time in paired interleaved rounds (CUDA events, medians with
95% intervals, each order against batch_major) and DRAM bytes from cold-L2 kernel replay
(ncu), beside the LRU replay's prediction (`wavefront.model.page_replay`), committed in
paper/shared_prefix_predictions.csv before any measurement
(`python scripts/shared_prefix_predictions.py`). The batches: no sharing (the control: all
orders read the same pages once), sharers interleaved in the batch (several prompts'
requests in turn) with prefixes whose pages fit the L2 one group at a time but not all
together, the same with sharers adjacent (batch_major already groups them), twice the batch
(four waves of items), longer prefixes in one wave, and one prompt shared by the whole batch.

    python experiments/shared_prefix.py run            # on a GPU: data/shared_prefix/
    python -c "import experiments.shared_prefix as e; e.measure('$OUT/shared_prefix')"
"""
import sys
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from wavefront.model.page_replay import CTA_ORDERS, SharedPrefixBatch
from wavefront.report.draft import Section, change_with_range, md_table
from wavefront.report.experiments import run_as_script, until_measured
from wavefront.report.figures import short_gpu

DATASETS = ()
RECORDS = ("shared_prefix",)
ROUNDS = 10
PER_ROUND = 5
NCU_REPEATS = 2
# the persistent launch's CTAs the replay assumes: two per SM, as the cache call launches
# its decode kernel (wavefront.kernel.decode.DECODE_OCCUPANCY)
CTAS_PER_SM = 2
PREDICTIONS = "paper/shared_prefix_predictions.csv"
ROOT = Path(__file__).resolve().parents[1]
# CTAs drifting apart, in the replay: each starts up to this many pages late (a sensitivity
# column beside the lock-step prediction, not the prediction)
DRIFT_PAGES = 32
CAPTION = ("Shared-prefix decode batches on the H200, the one GPU measured (H32 over KV8, "
           "D128, bf16, 64-token pages, one split): DRAM read bytes (GB) per CTA order from cold-L2 ncu replay beside the "
           "LRU replay's prediction committed before measuring (left); the call's speed against "
           "batch_major paired by round, median and 95% interval (right).")

BATCHES = (
    # no sharing: every order reads every page once (the control)
    SharedPrefixBatch(batch=64, group=1, prefix=2048, context=4096),
    # 8 prompts of 2k tokens, 8 sequences each, interleaved: one prompt's pages 8 MiB, all 64
    SharedPrefixBatch(batch=64, group=8, prefix=2048, context=4096),
    # the same, sharers adjacent: batch_major already runs them together
    SharedPrefixBatch(batch=64, group=8, prefix=2048, context=4096, layout="adjacent"),
    # 16 prompts of 2k tokens (128 MiB together), 8 sequences each, interleaved: 4 waves of
    # items, so batch_major reads each prompt's pages once a wave
    SharedPrefixBatch(batch=128, group=8, prefix=2048, context=3072),
    # 4 prompts of 8k tokens (32 MiB each, 128 MiB together), 8 sequences each, interleaved:
    # one wave of items (every order has the same items in flight)
    SharedPrefixBatch(batch=32, group=8, prefix=8192, context=9216),
    # one 16k prompt (64 MiB: more than either L2) shared by the whole batch
    SharedPrefixBatch(batch=16, group=16, prefix=16384, context=17408),
)


def predictions() -> pd.DataFrame:
    """The replay's DRAM read bytes per GPU preset, batch and order: lock-step (the
    prediction) and with CTAs drifting up to DRIFT_PAGES pages apart (a sensitivity)."""
    from wavefront.model.page_replay import replay
    from wavefront.model.presets import PRESETS
    rows = []
    for gpu in ("h100", "h200"):
        spec = PRESETS[gpu]
        for b in BATCHES:
            for order in CTA_ORDERS:
                ctas = min(spec.sms * CTAS_PER_SM, b.batch * b.kv_heads)
                locked = replay(b, order, ctas=ctas, l2_bytes=spec.l2_bytes,
                                partitions=spec.l2_partitions, sms=spec.sms)
                drift = replay(b, order, ctas=ctas, l2_bytes=spec.l2_bytes,
                               partitions=spec.l2_partitions, sms=spec.sms,
                               stagger=DRIFT_PAGES)
                rows.append({"gpu": spec.name, "batch": b.label(), **locked.as_dict(),
                             "predicted_dram_read_bytes_drift": drift.dram_read_bytes,
                             "shared_bytes": 2 * b.groups * b.prefix_pages * b.kv_heads
                             * b.page_head_bytes if b.group > 1 else 0,
                             "l2_bytes": spec.l2_bytes})
    return pd.DataFrame(rows)


def measure(out_dir) -> int:
    """Times every order of every batch in paired rounds, then profiles them under ncu;
    prints the summary table. -> the number of failed rows."""
    import click
    from wavefront.device import current_device
    from wavefront.measure.shared_prefix import profile_orders, time_orders
    from wavefront.measure.sink import JsonlSink
    from wavefront.results.records import SERVING_RECORDS
    gpu = current_device().name
    failed = 0
    import wavefront
    with JsonlSink(out_dir, "rounds.jsonl", ["rounds.jsonl", "ncu.jsonl"]) as sink:
        with click.progressbar(BATCHES, label="shared-prefix rounds") as bar:
            for b in bar:
                try:
                    rows = time_orders(b, wavefront.attention_with_kvcache, rounds=ROUNDS,
                                       per_round=PER_ROUND)
                except Exception as exc:  # recorded, and the next batch goes on
                    rows = [{"kind": "failed", "error": f"{type(exc).__name__}: {exc}"[:300]}]
                for row in rows:
                    failed += row["kind"] == "failed"
                    sink.write(SERVING_RECORDS.stamp({**row, "gpu": gpu, "batch": b.label(),
                                                      "spec": b.as_dict()}))
    with JsonlSink(out_dir, "ncu.jsonl", manifest_files=()) as sink:
        try:
            rows = profile_orders(list(BATCHES), WORKER, repeats=NCU_REPEATS)
        except Exception as exc:
            rows = [{"kind": "failed", "error": f"ncu: {type(exc).__name__}: {exc}"[:300]}]
        for row in rows:
            failed += row["kind"] == "failed"
            sink.write(SERVING_RECORDS.stamp({**row, "gpu": gpu}))
    from wavefront.report.analysis import Study
    out_dir = Path(out_dir)
    try:
        print(table(Study(out_dir.parent), out_dir.name).to_string(index=False))
    except Exception as exc:  # the data are written; the summary is a courtesy
        print(f"no summary table: {type(exc).__name__}: {exc}")
    return failed


# The ncu worker: this file's `ncu_worker`, run from the checkout it lies in.
WORKER = [sys.executable, "-c", f"import sys; sys.path.insert(0, {str(ROOT)!r}); "
          "import experiments.shared_prefix as e; e.ncu_worker()"]


def ncu_worker() -> None:
    """Under ncu: `measure.shared_prefix.run_worker` with the cache call; the batches (JSON)
    and the repeats are the last two arguments."""
    import json

    import wavefront
    from wavefront.measure.shared_prefix import run_worker
    run_worker(json.loads(sys.argv[-2]), int(sys.argv[-1]), wavefront.attention_with_kvcache)


def _records(study, dataset: str) -> pd.DataFrame:
    from wavefront.report.exposure import records
    from wavefront.results.records import SERVING_RECORDS
    return records(study, dataset, kind=SERVING_RECORDS)


def _committed_predictions(study) -> pd.DataFrame:
    path = Path(study.data_dir).resolve().parent / PREDICTIONS
    if not path.exists():  # a data directory outside the checkout: the repository's
        path = ROOT / PREDICTIONS
    frame = pd.read_csv(path)
    frame["GPU"] = frame["gpu"].map(short_gpu)
    return frame


def table(study, dataset: str = "shared_prefix") -> pd.DataFrame:
    """Per GPU, batch and order: measured DRAM read bytes (median over ncu repeats, range),
    the replay's prediction (lock-step; drift) and its error, the compulsory bytes, the
    order's time (median ms) and its speed over batch_major paired by round [95%]."""
    from wavefront.report.exposure import paired
    d = _records(study, dataset)
    rounds = d[d["kind"] == "round"]
    speed = pd.DataFrame()
    for order in CTA_ORDERS[1:]:
        t = paired(rounds, ["GPU", "batch"], "batch_major", order)
        t["cta_order"] = order
        speed = pd.concat([speed, t])
    speed = speed.rename(columns={"sawtooth vs linear": "speed vs batch_major",
                                  "linear ms": "batch_major ms"})
    ms = rounds.groupby(["GPU", "batch", "cta_order"])["ms"].median().rename("ms")
    ncu = d[d["kind"] == "ncu"]
    dram = ncu.groupby(["GPU", "batch", "cta_order"])["dram__bytes_read.sum"].agg(
        ["median", "min", "max"])
    # the kernels' own duration under ncu replay (cold L2; ncu runs with --clock-control
    # none): not a timing, but free of
    # host work between launches (prefix_grouped reads a GPU block table back every call)
    kernel_us = ncu.groupby(["GPU", "batch", "cta_order"])["gpu__time_duration.sum"].median()
    pred = _committed_predictions(study).set_index(["GPU", "batch", "cta_order"])
    rows = []
    for (gpu, batch, order), r in dram.iterrows():
        p = pred.loc[(gpu, batch, order)] if (gpu, batch, order) in pred.index else None
        s = speed[(speed["GPU"] == gpu) & (speed["batch"] == batch)
                  & (speed["cta_order"] == order)]
        rows.append({
            "GPU": gpu, "batch": batch, "cta_order": order,
            "DRAM MB": r["median"] / 1e6, "DRAM lo": r["min"] / 1e6, "DRAM hi": r["max"] / 1e6,
            "predicted MB": np.nan if p is None else p["predicted_dram_read_bytes"] / 1e6,
            "predicted MB (drift)": np.nan if p is None
            else p["predicted_dram_read_bytes_drift"] / 1e6,
            "compulsory MB": np.nan if p is None else p["compulsory_bytes"] / 1e6,
            "ms": ms.get((gpu, batch, order), np.nan),
            "ncu kernel us": kernel_us.get((gpu, batch, order), np.nan) / 1e3,
            "speed vs batch_major": 1.0 if order == "batch_major" or s.empty
            else float(s["speed vs batch_major"].iloc[0]),
            "lo": np.nan if s.empty else float(s["lo"].iloc[0]),
            "hi": np.nan if s.empty else float(s["hi"].iloc[0]),
            "rounds": np.nan if s.empty else int(s["rounds"].iloc[0])})
    t = pd.DataFrame(rows)
    t["model error"] = t["predicted MB"] / t["DRAM MB"] - 1
    return t


def figure(study):
    t = table(study)
    gpus = sorted(t["GPU"].unique())
    fig, axes = plt.subplots(len(gpus), 2, figsize=(13, 4.6 * len(gpus)), squeeze=False)
    batches = list(dict.fromkeys(t["batch"]))
    width = 0.8 / len(CTA_ORDERS)
    for row, gpu in zip(axes, gpus):
        g = t[t["GPU"] == gpu]
        for i, order in enumerate(CTA_ORDERS):
            o = g[g["cta_order"] == order].set_index("batch").reindex(batches)
            x = np.arange(len(batches)) + (i - 1) * width
            row[0].bar(x, o["DRAM MB"], width, label=f"{order} measured",
                       yerr=[o["DRAM MB"] - o["DRAM lo"], o["DRAM hi"] - o["DRAM MB"]])
            row[0].scatter(x, o["predicted MB"], marker="x", color="k", zorder=3,
                           label="replay's prediction" if i == 0 else None)
            if order != "batch_major":
                y = (o["speed vs batch_major"] - 1) * 100
                err = np.vstack([y - (o["lo"] - 1) * 100, (o["hi"] - 1) * 100 - y])
                row[1].errorbar(x, y, yerr=err, fmt="o", capsize=3, label=order)
        for ax in row:
            ax.set_xticks(range(len(batches)), [b.replace(" pg64", "") for b in batches],
                          rotation=20, ha="right", fontsize=9)
        row[0].set(ylabel=f"{gpu}: DRAM read MB per launch", xlabel="batch")
        row[1].axhline(0, color="k", lw=0.8)
        row[1].set(ylabel=f"{gpu}: call speed vs batch_major (%)", xlabel="batch")
        row[0].legend(fontsize=9, loc="upper left", bbox_to_anchor=(1.0, 1.0))
        row[1].legend(fontsize=9)
    fig.suptitle(f"Shared-prefix decode, {', '.join(gpus)}: H32 KV8 D128 bf16, 64-token pages, "
                 f"one split\nDRAM from cold-L2 ncu replay (median, range of {NCU_REPEATS}), "
                 f"speed paired by round (median, 95%), {ROUNDS} rounds", fontsize=10)
    fig.tight_layout()
    return fig


def _kernel_change(t: pd.DataFrame) -> pd.DataFrame:
    """Per GPU, batch and order other than batch_major: DRAM bytes and the ncu kernel
    duration against batch_major's (ratios - 1)."""
    idx = t.set_index(["GPU", "batch", "cta_order"])
    major = idx.xs("batch_major", level="cta_order")
    out = []
    for (gpu, batch, order), r in idx.iterrows():
        if order == "batch_major":
            continue
        m = major.loc[(gpu, batch)]
        out.append({"GPU": gpu, "batch": batch, "cta_order": order,
                    "bytes": r["DRAM MB"] / m["DRAM MB"] - 1,
                    "kernel": r["ncu kernel us"] / m["ncu kernel us"] - 1})
    return pd.DataFrame(out)


def section(study) -> Section:
    s = Section()
    t = table(study)
    one_gpu = t["GPU"].nunique() == 1
    label = t["batch"].str.replace(" pg64", "", regex=False)
    shown = pd.DataFrame({
        **({} if one_gpu else {"GPU": t["GPU"]}), "batch": label, "order": t["cta_order"],
        "DRAM MB": t["DRAM MB"].map(lambda x: f"{x:.0f}"),
        "predicted MB": t["predicted MB"].map(lambda x: f"{x:.0f}"),
        "call vs batch_major [95%]": [
            ("-" if o == "batch_major" or np.isnan(lo)
             else change_with_range(v - 1, lo - 1, hi - 1))
            for o, v, lo, hi in zip(t["cta_order"], t["speed vs batch_major"], t["lo"], t["hi"])],
        "ncu kernel us": t["ncu kernel us"].map(lambda x: f"{x:.0f}")})
    repeat_spread = (t["DRAM hi"] / t["DRAM lo"] - 1).max()
    d = _records(study, "shared_prefix")
    ncu = d[d["kind"] == "ncu"]
    durations = ncu.groupby(["GPU", "batch", "cta_order"])["gpu__time_duration.sum"]
    duration_spread = (durations.max() / durations.min() - 1).max()
    control = t[t["batch"].str.contains(" G1 ")]
    spread = control.groupby("GPU")["DRAM MB"].agg(lambda x: x.max() / x.min() - 1)
    s.claim("Without sharing the three orders read the same DRAM bytes (largest spread "
            + ", ".join(f"{g} {x:.1%}" for g, x in spread.items())
            + "), as the replay predicts (one read of every page)",
            len(spread) > 0 and bool((spread < 0.03).all()), spread.to_dict())
    change = _kernel_change(t)
    shared = change[~change["batch"].str.contains(" G1 ")].copy()
    pred = t.set_index(["GPU", "batch", "cta_order"])["predicted MB"]
    shared["predicted"] = [pred[(g, b, o)] / pred[(g, b, "batch_major")] - 1
                           for g, b, o in zip(shared["GPU"], shared["batch"],
                                              shared["cta_order"])]
    fewer = shared[shared["bytes"] < -0.05]
    s.claim("Where sequences share a prefix, an order that runs sharers together reads at least "
            f"5% fewer DRAM bytes than batch_major in {len(fewer)} of {len(shared)} "
            "(batch, order) pairs: "
            + ", ".join(f"{b.replace(' pg64', '')} {o} {x:+.0%} (predicted {p:+.0%})"
                        for b, o, x, p in zip(fewer["batch"], fewer["cta_order"],
                                              fewer["bytes"], fewer["predicted"]))
            + f"; the other pairs read within {shared.drop(fewer.index)['bytes'].abs().max():.1%}",
            len(fewer) > 0 and bool(((shared["bytes"] - shared["predicted"]).abs() < 0.10).all()),
            shared.to_dict("records"))
    err = t["model error"].abs()
    s.claim(f"The lock-step replay predicts every launch's DRAM bytes within {err.max():.1%} "
            f"(median {err.median():.2%}) over {len(t)} launches (predictions committed "
            "before measuring)", bool(err.max() <= 0.10), t[["GPU", "batch", "cta_order",
                                                             "model error"]].to_dict("records"))
    timed = t[(t["cta_order"] != "batch_major") & t["lo"].notna()]
    resolved = timed[(timed["lo"] > 1) | (timed["hi"] < 1)]
    big = fewer.loc[fewer["bytes"].idxmin()]
    big_t = timed.set_index(["GPU", "batch", "cta_order"]).loc[
        (big["GPU"], big["batch"], big["cta_order"])]
    s.claim(f"The call's time does not resolve the byte savings: {len(timed) - len(resolved)} of "
            f"{len(timed)} paired 95% intervals of an order against batch_major include no "
            f"change; at the largest saving ({big['batch'].replace(' pg64', '')} "
            f"{big['cta_order']}, {big['bytes']:+.0%} bytes) the call runs "
            + change_with_range(big_t["speed vs batch_major"] - 1, big_t["lo"] - 1,
                                big_t["hi"] - 1),
            resolved.empty, timed[["batch", "cta_order", "speed vs batch_major", "lo",
                                   "hi"]].to_dict("records"))
    s.claim("In the kernels' own durations under ncu (cold L2, single launches, median of "
            f"{NCU_REPEATS} repeats that differ by at most {duration_spread:.1%}; no interval), "
            "the pairs that read at least 5% fewer bytes take "
            + ", ".join(f"{b.replace(' pg64', '')} {o} {k:+.1%}"
                        for b, o, k in zip(fewer["batch"], fewer["cta_order"], fewer["kernel"]))
            + " time against batch_major: never a larger saving than the bytes'",
            bool((fewer["kernel"] >= fewer["bytes"]).all()),
            fewer[["batch", "cta_order", "bytes", "kernel"]].to_dict("records"))
    gpus = ", ".join(sorted(t["GPU"].unique()))
    s.text = f"""## Decode with a shared prefix: where bytes should be time

A decode step reads each K/V byte once unless the L2 serves it again, and at long contexts it
runs near the DRAM bandwidth (the decode bench, in the appendix on the public call): if a miss
costs time anywhere, it is here. Sequences that share a prompt read the same pages, so a CTA
order that runs sharers together should read fewer bytes and, if the step is bandwidth-bound
(a hypothesis this section tests), take less time.
Decode batches whose sequences share a prompt through block tables that point at the same
pages (`experiments/shared_prefix.py`, {gpus}: H32 KV8 D128 bf16, 64-token pages, one split;
batch BxGyPzCw: x sequences in groups of y sharing a z-token prefix, w tokens each). DRAM read
bytes from cold-L2 ncu replay, median of {NCU_REPEATS} (they differ by at most
{repeat_spread:.2%}), beside the LRU replay's prediction committed before the measurement in
`{PREDICTIONS}`; "call vs batch_major": the call as users make it, its speed against
batch_major paired by round over {ROUNDS} rounds (median, 95% interval; prefix_grouped reads a
GPU block table's first pages back once per table, not per call); "ncu kernel us": the
kernel's own duration, single launches with no interval (under ncu replay, cold L2; not a
timing):

![shared prefix](figures/shared_prefix.png)

{md_table(shown)}

{' '.join(c.text + '.' for c in s.claims)}"""
    return s


# Data committed (H200): in the paper (experiments/__init__.py lists it).
PAPER_READY = True
until_measured(globals(), PAPER_READY)

if __name__ == "__main__":  # the same as `wavefront experiment ACTION NAME`
    run_as_script(__file__)
