"""Generate through transformers with wavefront's attention: the same greedy tokens as the SDPA path, and the tokens/s beside it?

transformers' `LlamaForCausalLM` with random weights (seed 0, bf16; 4 layers, hidden 2048,
H32 KV8 D128, vocabulary 32000), a batch of 4 random prompts of 512 tokens, then 128 greedy
decode steps, with transformers' DynamicCache (eager) and its StaticCache (which generate
compiles, CUDA graphs included), once with `attn_implementation="sdpa"` and once with
`"wavefront"` (`wavefront.serving`: the prefill through the attention call, every cached step
through `attention_with_kvcache`). Tokens: the generated tokens against the SDPA path's with
DynamicCache, position by position and up to the first difference per row (free running);
and, with the SDPA tokens forced (`prefix_allowed_tokens_fn`), the share of steps whose own
greedy choice would have been the same (teacher-forced agreement: a difference does not
propagate). The SDPA path with StaticCache against itself with DynamicCache is the yardstick:
how far two numerically equal paths drift apart anyway. Speed: generated tokens per second of
each path, timed around whole generate calls in interleaved rounds (after a warm-up call that
compiles), the wavefront path's over SDPA's paired by round.

    python experiments/generate.py run
    python -c "import experiments.generate as e; e.measure('$OUT/generate')"
"""
import numpy as np
import pandas as pd

from wavefront.report.draft import Section, md_table
from wavefront.report.experiments import run_as_script, until_measured

DATASETS = ()
RECORDS = ("generate",)
MODEL = dict(vocab_size=32000, hidden_size=2048, intermediate_size=5632, num_hidden_layers=4,
             num_attention_heads=32, num_key_value_heads=8, head_dim=128,
             max_position_embeddings=4096)
BATCH, PROMPT, NEW_TOKENS = 4, 512, 128
ROUNDS = 6
CAPTION = ("Generating through transformers: tokens per second of the SDPA and wavefront paths "
           "(median and range over interleaved rounds) and the teacher-forced agreement of each "
           "path's greedy choice with SDPA's DynamicCache tokens, per cache; the GPU and the "
           "model are named in the figure's title.")
CACHES = ("dynamic", "static")
PATHS = ("sdpa", "wavefront")


def _models():
    """{path: model}: the same random weights under each attention implementation."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    import wavefront.serving as wfs
    name = wfs.register_with_transformers()
    torch.manual_seed(0)
    # Two configs: `set_attn_implementation` writes the model's config, and a config shared by
    # both models ran both through wavefront (the first measurement's "sdpa" path gave logits
    # bit-identical to wavefront's; not kept)
    ref = LlamaForCausalLM(LlamaConfig(**MODEL, attn_implementation="sdpa")).to(
        device="cuda", dtype=torch.bfloat16).eval()
    ours = LlamaForCausalLM(LlamaConfig(**MODEL, attn_implementation="sdpa")).to(
        device="cuda", dtype=torch.bfloat16).eval()
    ours.load_state_dict(ref.state_dict())
    ours.set_attn_implementation(name)
    return {"sdpa": ref, "wavefront": ours}


def _generate(model, ids, cache: str, forced=None, logits: bool = False):
    """One greedy generate call: -> (new tokens (B, NEW_TOKENS) on the host, per-step logits
    (NEW_TOKENS, B, vocab) float32 or None)."""
    import torch
    kw = dict(max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS, do_sample=False,
              attention_mask=torch.ones_like(ids), pad_token_id=0)
    if cache == "static":
        kw["cache_implementation"] = "static"
    if forced is not None:
        width = ids.shape[1]

        def allowed(row, so_far):
            return [int(forced[row, len(so_far) - width])]
        kw["prefix_allowed_tokens_fn"] = allowed
    if logits:
        kw.update(return_dict_in_generate=True, output_logits=True)
    with torch.no_grad():
        out = model.generate(ids, **kw)
    if logits:
        steps = torch.stack([x.float() for x in out.logits]).cpu()
        return out.sequences[:, ids.shape[1]:].cpu(), steps
    return out[:, ids.shape[1]:].cpu(), None


def _agreement(tokens, reference) -> dict:
    same = tokens == reference
    first = [int(np.argmin(r)) if not r.all() else len(r) for r in same.numpy()]
    return {"positionwise": float(same.float().mean()), "first_difference": first}


def measure(out_dir) -> int:
    """Tokens and speed of both paths with both caches; prints the summary table. -> failed
    rows."""
    import time

    import torch
    import transformers

    import wavefront.serving as wfs
    from wavefront.device import current_device
    from wavefront.measure.sink import JsonlSink
    from wavefront.results.records import SERVING_RECORDS
    gpu = current_device().name
    models = _models()
    g = torch.Generator(device="cuda").manual_seed(1)
    ids = torch.randint(3, MODEL["vocab_size"], (BATCH, PROMPT), device="cuda", generator=g)
    failed = 0
    common = {"gpu": gpu, "model": MODEL, "batch": BATCH, "prompt": PROMPT,
              "new_tokens": NEW_TOKENS, "transformers": transformers.__version__,
              "torch": torch.__version__}
    with JsonlSink(out_dir, "generate.jsonl") as sink:
        def write(row):
            sink.write(SERVING_RECORDS.stamp({**common, **row}))
        reference, ref_logits = _generate(models["sdpa"], ids, "dynamic", logits=True)
        for cache in CACHES:
            usable = []
            for path in PATHS:
                began = time.perf_counter()
                try:  # the first call compiles (kernels; with StaticCache, the model)
                    tokens, _ = _generate(models[path], ids, cache)
                    forced, steps = _generate(models[path], ids, cache, forced=reference,
                                              logits=True)
                    if not torch.equal(forced, reference):
                        raise RuntimeError("the forced tokens were not generated")
                except Exception as exc:  # recorded; the other paths go on
                    failed += 1
                    error = f"{type(exc).__name__}: {exc}"[:400]
                    write({"kind": "failed", "cache": cache, "path": path, "error": error})
                    print(f"failed: {cache} {path}: {error}", flush=True)
                    continue
                choice = steps.argmax(-1).T  # (B, steps): its own greedy choice
                rel = float((steps - ref_logits).norm() / ref_logits.norm())
                write({"kind": "agreement", "cache": cache, "path": path,
                       "first_call_s": time.perf_counter() - began,
                       **_agreement(tokens, reference),
                       "forced": float((choice == reference).float().mean()),
                       "forced_logits_rel_error": rel,
                       "cache_copies": wfs.cache_copies() if path == "wavefront" else None})
                usable.append(path)
            rng = np.random.default_rng(0)
            for r in range(ROUNDS if len(usable) == len(PATHS) else 0):
                for i in rng.permutation(len(usable)):
                    path = usable[i]
                    torch.cuda.synchronize()
                    began = time.perf_counter()
                    _generate(models[path], ids, cache)
                    torch.cuda.synchronize()
                    seconds = time.perf_counter() - began
                    write({"kind": "round", "cache": cache, "path": path, "round": r,
                           "seconds": seconds, "tokens_per_s": BATCH * NEW_TOKENS / seconds})
    from pathlib import Path

    from wavefront.report.analysis import Study
    out_dir = Path(out_dir)
    try:
        print(table(Study(out_dir.parent), out_dir.name).to_string(index=False))
    except Exception as exc:  # the data are written; the summary is a courtesy
        print(f"no summary table: {type(exc).__name__}: {exc}")
    return failed


def _records(study, dataset: str) -> pd.DataFrame:
    from wavefront.report.exposure import records
    from wavefront.results.records import SERVING_RECORDS
    return records(study, dataset, kind=SERVING_RECORDS)


def table(study, dataset: str = "generate") -> pd.DataFrame:
    """Per GPU, cache and path: agreement with the SDPA path's DynamicCache tokens (free
    running: positionwise and the mean first difference; teacher-forced), tokens/s (median
    over rounds) and, for wavefront, its speed over SDPA's paired by round [95%]."""
    from wavefront.results.measurement import median_ci95
    d = _records(study, dataset)
    agree = d[d["kind"] == "agreement"]
    rounds = d[d["kind"] == "round"]
    rows = []
    for _, a in agree.iterrows():
        mine = rounds[(rounds["GPU"] == a["GPU"]) & (rounds["cache"] == a["cache"])]
        per = mine.pivot_table(index="round", columns="path", values="seconds")
        row = {"GPU": a["GPU"], "cache": a["cache"], "path": a["path"],
               "tokens equal": a["positionwise"],
               "first difference (mean step)": float(np.mean(a["first_difference"])),
               "forced agreement": a["forced"],
               "logits rel. error": a["forced_logits_rel_error"],
               "tokens/s": float(mine[mine["path"] == a["path"]]["tokens_per_s"].median())
               if len(mine) else np.nan,
               "vs sdpa": np.nan, "lo": np.nan, "hi": np.nan, "rounds": len(per)}
        if a["path"] != "sdpa" and {"sdpa", a["path"]} <= set(per.columns):
            ratio = (per["sdpa"] / per[a["path"]]).dropna()
            row["vs sdpa"] = float(ratio.median())
            if len(ratio) >= 6:
                row["lo"], row["hi"] = median_ci95(list(ratio))
        rows.append(row)
    return pd.DataFrame(rows)


def figure(study):
    import matplotlib.pyplot as plt
    import seaborn as sns
    d = _records(study, "generate")
    rounds = d[d["kind"] == "round"]
    agree = d[d["kind"] == "agreement"]
    gpus = sorted(rounds["GPU"].unique())
    fig, axes = plt.subplots(1, 2, figsize=(11, 3.8))
    sns.barplot(data=rounds, x="cache", y="tokens_per_s", hue="path", order=list(CACHES),
                hue_order=list(PATHS), estimator="median", errorbar=("pi", 100), ax=axes[0])
    axes[0].set(xlabel="transformers' cache", ylabel="generated tokens/s (median, range)")
    sns.barplot(data=agree, x="cache", y="forced", hue="path", order=list(CACHES),
                hue_order=list(PATHS), ax=axes[1])
    axes[1].set(xlabel="transformers' cache", ylim=(0.9, 1.0),
                ylabel="teacher-forced agreement with SDPA (DynamicCache) tokens")
    fig.suptitle(f"Generate through transformers, {', '.join(gpus)}: Llama 4 layers H32 KV8 D128 "
                 f"bf16 (random weights), {BATCH} x {PROMPT}-token prompts, {NEW_TOKENS} greedy "
                 f"steps, {ROUNDS} rounds", fontsize=10)
    fig.tight_layout()
    return fig


# How far (percentage points) the wavefront path's forced agreement may fall below SDPA's own
# StaticCache-against-DynamicCache agreement, the yardstick of two paths that should agree. Set
# after a run failed a fixed 95% (the StaticCache path at 94.5%, SDPA's own two paths at 94.9%,
# 497f0b9); SDPA's two paths agreed on 94.3% (718f106) and 95.9% (38b174b) in the runs before,
# which the committed data (one run) no longer holds.
NOISE_POINTS = 2


def section(study) -> Section:
    s = Section()
    t = table(study)
    shown = t.assign(**{
        "tokens equal": t["tokens equal"].map(lambda x: f"{x:.1%}"),
        "forced agreement": t["forced agreement"].map(lambda x: f"{x:.1%}"),
        "logits rel. error": t["logits rel. error"].map(lambda x: f"{x:.2e}"),
        "tokens/s": t["tokens/s"].map(lambda x: f"{x:.0f}"),
        "vs sdpa [95%]": [("-" if np.isnan(v) else f"{v:.3f}x" if np.isnan(lo)
                           else f"{v:.3f}x [{lo:.3f}, {hi:.3f}]")
                          for v, lo, hi in zip(t["vs sdpa"], t["lo"], t["hi"])]}).drop(
        columns=["vs sdpa", "lo", "hi"])
    ours = t[t["path"] == "wavefront"]
    yard = t[(t["path"] == "sdpa") & (t["cache"] == "static")]
    s.claim("With the SDPA tokens forced, the wavefront path's own greedy choice agrees at "
            + ", ".join(f"{r['GPU']} {r['cache']} {r['forced agreement']:.1%}"
                        for _, r in ours.iterrows())
            + " of the steps; SDPA's own StaticCache path against its DynamicCache: "
            + ", ".join(f"{r['GPU']} {r['forced agreement']:.1%}" for _, r in yard.iterrows())
            + f" (the yardstick: every wavefront path within {NOISE_POINTS} points of it or "
            "above)",
            len(ours) == 2 * t["GPU"].nunique() and len(yard) == t["GPU"].nunique()
            and all(r["forced agreement"] >= float(yard.loc[yard["GPU"] == r["GPU"],
                                                            "forced agreement"].iloc[0])
                    - NOISE_POINTS / 100 for _, r in ours.iterrows()),
            t[["GPU", "cache", "path", "forced agreement", "tokens equal"]].to_dict("records"))
    s.claim("The wavefront path generates "
            + ", ".join(f"{r['GPU']} {r['cache']} {r['vs sdpa']:.3f}x [{r['lo']:.3f}, "
                        f"{r['hi']:.3f}]" for _, r in ours.iterrows())
            + f" the SDPA path's tokens/s (median of {int(ours['rounds'].min())} rounds paired "
            "by index, 95% interval: with so few rounds, close to their range)",
            bool((ours["rounds"] >= 6).all()), ours[["GPU", "cache", "vs sdpa", "lo", "hi"]]
            .to_dict("records"))
    s.text = f"""## Generating through transformers

transformers' Llama (random weights, 4 layers, hidden 2048, H32 KV8 D128, bf16), {BATCH} prompts
of {PROMPT} tokens, {NEW_TOKENS} greedy steps (`experiments/generate.py`); tokens against the SDPA
path with DynamicCache; speed over {ROUNDS} interleaved rounds:

{md_table(shown)}

![generate](figures/generate.png)

{' '.join(c.text + '.' for c in s.claims)}"""
    return s


# Out of the paper until its first data are committed (then listed in APPENDICES).
PAPER_READY = True
until_measured(globals(), PAPER_READY)

if __name__ == "__main__":  # the same as `wavefront experiment ACTION NAME`
    run_as_script(__file__)
