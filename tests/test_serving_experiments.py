"""The serving experiments on the CPU: shared-prefix block tables and the LRU replay of their
page stream, the experiments' tables from committed data (skipped where none is committed
yet), and the transformers hook's routing between the prefill and the KV-cache calls (with
fakes standing in for the GPU calls and for transformers)."""
from pathlib import Path

import numpy as np
import pytest

from wavefront.model.page_replay import (CTA_ORDERS, SharedPrefixBatch, item_order, page_trace,
                                         replay)

ROOT = Path(__file__).resolve().parents[1]
MiB = 1 << 20


@pytest.mark.parametrize("layout", ["interleaved", "adjacent"])
def test_shared_prefix_block_tables_share_prefix_pages_and_cover_each_sequence(layout):
    b = SharedPrefixBatch(batch=12, group=4, prefix=128, context=300, page_size=64,
                          layout=layout)
    table = b.block_table()
    assert table.dtype == np.int32 and table.shape == (12, 5)  # ceil(300 / 64) pages
    groups = b.group_of()
    assert np.bincount(groups).tolist() == [4, 4, 4]
    for g in range(b.groups):
        members = table[groups == g]
        # the prefix's pages are the same physical pages for every sharer ...
        assert (members[:, :2] == members[0, :2]).all()
        # ... and no other group's
        others = table[groups != g][:, :2]
        assert not np.isin(members[0, :2], others).any()
    # every private page belongs to one sequence, and no page is both shared and private
    private = table[:, 2:].ravel()
    assert len(np.unique(private)) == len(private)
    assert not np.isin(private, table[:, :2]).any()
    # the pool holds exactly the pages the tables name, and each sequence's pages cover it
    assert sorted(np.unique(table)) == list(range(b.num_pages))
    assert (table.shape[1] * b.page_size >= b.cache_seqlens()).all()
    assert b.num_pages == 3 * 2 + 12 * 3
    if layout == "interleaved":
        assert groups[:3].tolist() == [0, 1, 2]
    else:
        assert groups[:5].tolist() == [0, 0, 0, 0, 1]


def test_shared_prefix_batches_refuse_what_cannot_be_shared():
    with pytest.raises(ValueError, match="prefix must be a multiple of page_size"):
        SharedPrefixBatch(batch=4, group=2, prefix=100, context=200)
    with pytest.raises(ValueError, match="group must divide batch"):
        SharedPrefixBatch(batch=5, group=2, prefix=64, context=200)
    with pytest.raises(ValueError, match="context must hold the prefix"):
        SharedPrefixBatch(batch=4, group=2, prefix=256, context=200)
    with pytest.raises(ValueError, match="layout"):
        SharedPrefixBatch(batch=4, group=2, prefix=64, context=200, layout="random")
    with pytest.raises(ValueError, match="cta_order"):
        item_order(SharedPrefixBatch(batch=4, group=2, prefix=64, context=200), "longest")


def test_item_orders_cover_every_item_once_and_group_sharers():
    b = SharedPrefixBatch(batch=8, group=4, prefix=64, context=128, kv_heads=2, heads=4)
    seen = {}
    for order in CTA_ORDERS:
        items = item_order(b, order)
        assert len(items) == 16 and len({tuple(r) for r in items}) == 16
        seen[order] = items
    assert seen["batch_major"][:2, :2].tolist() == [[0, 0], [0, 1]]
    assert seen["kv_head_major"][:2, :2].tolist() == [[0, 0], [1, 0]]
    # prefix_grouped: the first group's sequences (0, 2, 4, 6 interleaved) for K/V head 0,
    # then for head 1, then the second group's
    assert seen["prefix_grouped"][:8].tolist() == [[b, h, 0] for h in (0, 1)
                                                   for b in (0, 2, 4, 6)]
    assert seen["prefix_grouped"][8, 0] == 1


@pytest.mark.parametrize("order", CTA_ORDERS)
@pytest.mark.parametrize("layout", ["interleaved", "adjacent"])
def test_the_replays_item_order_is_the_cache_calls_work_table(order, layout):
    """The replay hands out items in the order the cache call's work table does (where that
    module is in this checkout)."""
    schedules = pytest.importorskip("wavefront.decode_schedules")
    b = SharedPrefixBatch(batch=12, group=4, prefix=128, context=300, kv_heads=2, heads=8,
                          layout=layout)
    problem = schedules.DecodeProblem(batch=12, heads=8, kv_heads=2, seqlen_q=1,
                                      capacity=320, head_dim=128, page_size=64)
    launch = schedules.DecodeLaunch(problem, 1, 264, order,
                                    tuple(int(x) for x in b.block_table()[:, 0]))
    table = launch.work_table()
    columns = [schedules.DECODE_BATCH, schedules.DECODE_KV_HEAD, schedules.DECODE_SPLIT]
    assert table[:, columns].tolist() == item_order(b, order).tolist()


def test_the_page_stream_reads_each_items_pages_in_lockstep_rounds():
    b = SharedPrefixBatch(batch=4, group=2, prefix=64, context=192, kv_heads=1, heads=1,
                          page_size=64)
    trace = page_trace(b, "batch_major", ctas=2)
    kv = trace.kind < 2
    # every item reads K and V of each of its 3 pages once: 4 items x 3 pages x 2
    assert kv.sum() == 24 and (trace.nbytes[kv] == b.page_head_bytes).all()
    # round 0: CTA 0's queries and first page (K, V), then CTA 1's; CTAs take items c, c + 2
    assert trace.slot[:6].tolist() == [0, 0, 0, 1, 1, 1]
    assert trace.kind[:3].tolist() == [2, 0, 1]
    assert set(trace.slot.tolist()) == {0, 1}


@pytest.mark.parametrize("l2_mib", [2, 50])
def test_the_replay_predicts_fewer_bytes_for_prefix_grouped_only_where_pages_are_shared(l2_mib):
    shared = SharedPrefixBatch(batch=64, group=8, prefix=512, context=1024, kv_heads=8)
    alone = SharedPrefixBatch(batch=64, group=1, prefix=512, context=1024, kv_heads=8)
    kw = dict(ctas=132, l2_bytes=l2_mib * MiB, sms=132)
    grouped = replay(shared, "prefix_grouped", **kw).dram_read_bytes
    major = replay(shared, "batch_major", **kw).dram_read_bytes
    assert grouped < 0.9 * major
    # never below one read of every page (and the queries)
    assert grouped >= replay(shared, "prefix_grouped", **kw).compulsory_bytes
    # no sharing: the order changes nothing, every page is read once
    bytes_alone = {o: replay(alone, o, **kw).dram_read_bytes for o in CTA_ORDERS}
    assert len(set(bytes_alone.values())) == 1
    assert bytes_alone["batch_major"] == replay(alone, "batch_major", **kw).compulsory_bytes


def test_the_replay_with_drift_needs_the_l2_to_keep_shared_pages():
    b = SharedPrefixBatch(batch=64, group=8, prefix=512, context=1024, kv_heads=8)
    kw = dict(ctas=132, sms=132, stagger=16)
    small = replay(b, "batch_major", l2_bytes=1 * MiB, **kw).dram_read_bytes
    large = replay(b, "batch_major", l2_bytes=1024 * MiB, **kw).dram_read_bytes
    assert large == replay(b, "batch_major", l2_bytes=1024 * MiB, **kw).compulsory_bytes
    assert small > large


def test_the_committed_predictions_are_the_replays_of_the_experiments_batches():
    pd = pytest.importorskip("pandas")
    path = ROOT / "paper" / "shared_prefix_predictions.csv"
    if not path.exists():
        pytest.skip("no committed shared-prefix predictions")
    from experiments.shared_prefix import BATCHES
    committed = pd.read_csv(path)
    assert set(committed["batch"]) == {b.label() for b in BATCHES}
    assert set(committed["cta_order"]) == set(CTA_ORDERS)
    assert (committed["predicted_dram_read_bytes"] >= committed["compulsory_bytes"]).all()


@pytest.mark.parametrize("name", ["shared_prefix", "short_prompts", "generate", "decode_bench"])
def test_the_serving_experiments_tables_read_committed_data(name):
    """Each experiment's table from its committed records; skipped until they exist."""
    if not (ROOT / "data" / name).is_dir():
        pytest.skip(f"no committed data/{name} yet")
    from wavefront.report.analysis import Study
    from wavefront.report.experiments import load_experiment
    exp = load_experiment(ROOT / "experiments" / f"{name}.py")
    t = exp.table(Study(ROOT / "data"))
    assert len(t) > 0


# ---------------------------------------------------------------------------------------------
# The transformers hook's routing (wavefront.serving), with the GPU calls faked
# ---------------------------------------------------------------------------------------------

def _causal_cache_attention(q, k, v, cache_seqlens, causal=True, scale=None):
    """What `attention_with_kvcache` computes, in float32 on any device: q (B, S_q, H, D),
    k and v (B, L, H_kv, D), row b seeing keys [0, cache_seqlens[b] - S_q + i] at query i."""
    import torch
    b, s_q, h, d = q.shape
    group = h // k.shape[2]
    k = k.float().repeat_interleave(group, dim=2).transpose(1, 2)  # (B, H, L, D)
    v = v.float().repeat_interleave(group, dim=2).transpose(1, 2)
    scores = q.float().transpose(1, 2) @ k.transpose(2, 3) * (scale or d ** -0.5)
    limit = (cache_seqlens.view(-1, 1, 1, 1) - s_q
             + torch.arange(s_q).view(1, 1, -1, 1))
    scores = scores.masked_fill(torch.arange(k.shape[2]).view(1, 1, 1, -1) > limit,
                                float("-inf"))
    return (scores.softmax(-1) @ v).transpose(1, 2).to(q.dtype)


@pytest.fixture
def fake_cache_call(monkeypatch):
    """`wavefront.attention_with_kvcache` replaced by the reference above, noting each call's
    key layout and lengths; the hook's memory of the call's layout reset."""
    torch = pytest.importorskip("torch")
    import wavefront
    import wavefront.serving as wfs
    calls = []

    def fake(q, k_cache, v_cache, cache_seqlens, **kw):
        calls.append({"k_contiguous": k_cache.is_contiguous(), "k_shape": tuple(k_cache.shape),
                      "cache_seqlens": cache_seqlens.tolist(), "causal": kw.get("causal")})
        if fake.refuse_views and not k_cache.is_contiguous():
            raise ValueError("k_cache must be contiguous")
        return _causal_cache_attention(q, k_cache, v_cache, cache_seqlens, kw.get("causal"),
                                       kw.get("scale"))
    fake.refuse_views = False
    monkeypatch.setattr(wavefront, "attention_with_kvcache", fake, raising=False)
    monkeypatch.setattr(wfs, "_views_taken", [None])
    monkeypatch.setattr(wfs, "_copies", {"calls": 0, "bytes": 0})
    monkeypatch.setattr(wfs, "_checked_mask", [])
    monkeypatch.setattr(wfs, "_full_lengths", [])
    return torch, wfs, fake, calls


def _static_mask(torch, valid, s_q, max_len):
    """transformers' sdpa mask at a StaticCache step: query i of row b sees positions up to
    its own (valid[b] - s_q + i), and nothing past the row's valid tokens."""
    valid = torch.as_tensor(valid)
    pos = valid.view(-1, 1, 1) - s_q + torch.arange(s_q).view(1, -1, 1)
    cols = torch.arange(max_len).view(1, 1, -1)
    return ((cols <= pos) & (cols < valid.view(-1, 1, 1)))[:, None]


def test_the_hook_routes_by_query_and_key_length_and_mask():
    torch = pytest.importorskip("torch")
    from wavefront.serving import Route, route
    from wavefront.torch import SequencesMask
    q1, q9 = (2, 32, 1, 64), (2, 32, 9, 64)
    assert route(q9, (2, 8, 9, 64), None) == Route("prefill")
    assert route(q1, (2, 8, 300, 64), None) == Route("cache", "key")  # DynamicCache step
    assert route(q1, (2, 8, 300, 64), None, causal=False) == Route("cache", "key")
    # no mask with several queries: torch's is_causal (top-left), an empty StaticCache's prefill
    assert route(q9, (2, 8, 300, 64), None) == Route("cache", "query")
    with pytest.raises(ValueError, match="^is_causal must be True with no attention_mask"):
        route(q9, (2, 8, 300, 64), None, causal=False)
    static = torch.ones(2, 1, 1, 4096, dtype=torch.bool)
    assert route(q1, (2, 8, 4096, 64), static) == Route("cache", "mask")  # StaticCache step
    assert route(q9, (2, 8, 4096, 64), static.expand(2, 1, 9, 4096)) == Route("cache", "mask")
    with pytest.raises(ValueError, match="^attention_mask must be None or a boolean"):
        route(q1, (2, 8, 300, 64), torch.zeros(2, 1, 1, 300))  # an additive float mask
    with pytest.raises(ValueError, match="^attention_mask must be None or a boolean"):
        route(q1, (2, 8, 300, 64), SequencesMask(torch.tensor([0, 1]), 2, 1))
    with pytest.raises(ValueError, match="query has 9 tokens and key 4"):
        route(q9, (2, 8, 4, 64), None)


@pytest.mark.parametrize("s_q", [1, 3])
def test_cache_lengths_come_from_the_static_caches_mask_without_reading_it_back(s_q):
    torch = pytest.importorskip("torch")
    from wavefront.serving import cache_seqlens_from_mask, mask_matches_lengths
    mask = _static_mask(torch, [5, 9], s_q, 12)
    lengths = cache_seqlens_from_mask(mask, 2)
    assert lengths.dtype == torch.int32 and lengths.tolist() == [5, 9]
    assert mask_matches_lengths(mask, lengths)
    padded = mask.clone()
    padded[0, 0, :, 0] = False  # a left-padded row: a hole no length describes
    assert not mask_matches_lengths(padded, cache_seqlens_from_mask(padded, 2))
    # a mask of one row for the whole batch
    assert cache_seqlens_from_mask(mask[:1], 3).tolist() == [5, 5, 5]


def _qkv(torch, b, h, h_kv, s_q, length, d=64, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(b, h, s_q, d, generator=g)
    k = torch.randn(b, h_kv, length, d, generator=g)
    v = torch.randn(b, h_kv, length, d, generator=g)
    return q, k, v


def _sdpa_reference(torch, q, k, v, mask):
    group = q.shape[1] // k.shape[1]
    k, v = (x.repeat_interleave(group, dim=1) for x in (k, v))
    out = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    return out.transpose(1, 2)


def test_a_dynamic_cache_step_runs_the_cache_call_on_views_of_the_whole_key(fake_cache_call):
    torch, wfs, fake, calls = fake_cache_call
    q, k, v = _qkv(torch, 2, 8, 2, 1, 37)
    out, weights = wfs.hf_cache_attention_forward(object(), q, k, v, None)
    assert weights is None and out.shape == (2, 1, 8, 64)
    assert torch.allclose(out, _sdpa_reference(torch, q, k, v, None), atol=1e-5)
    assert calls[0]["k_shape"] == (2, 37, 2, 64) and not calls[0]["k_contiguous"]
    assert calls[0]["cache_seqlens"] == [37, 37] and calls[0]["causal"] is True
    assert wfs.cache_copies() == {"calls": 0, "bytes": 0}


def test_a_static_caches_prefill_without_a_mask_runs_as_sdpas_is_causal(fake_cache_call):
    """transformers skips the mask at the prefill of an empty StaticCache: its SDPA function
    runs torch's is_causal, top-left, so the cache's empty slots past the query are unseen."""
    torch, wfs, fake, calls = fake_cache_call
    q, k, v = _qkv(torch, 2, 8, 2, 5, 64)  # 5 prompt tokens in a cache of 64 slots
    out, _ = wfs.hf_cache_attention_forward(object(), q, k, v, None)
    assert calls[0]["cache_seqlens"] == [5, 5] and calls[0]["causal"] is True
    want = torch.nn.functional.scaled_dot_product_attention(
        q, k, v, is_causal=True, enable_gqa=True).transpose(1, 2)
    assert torch.allclose(out, want, atol=1e-5)

    class Encoder(torch.nn.Module):
        is_causal = False
    with pytest.raises(ValueError, match="^is_causal must be True"):
        wfs.hf_cache_attention_forward(Encoder(), q, k, v, None)
    with pytest.raises(ValueError, match="^is_causal must be True"):
        wfs.hf_cache_attention_forward(object(), q, k, v, None, is_causal=False)


@pytest.mark.parametrize("s_q", [1, 5])
def test_a_static_cache_step_reads_its_lengths_from_the_mask(fake_cache_call, s_q):
    torch, wfs, fake, calls = fake_cache_call
    q, k, v = _qkv(torch, 2, 8, 2, s_q, 64)  # the cache's max length: 64
    mask = _static_mask(torch, [20, 41], s_q, 64)
    out, _ = wfs.hf_cache_attention_forward(object(), q, k, v, mask)
    assert calls[0]["cache_seqlens"] == [20, 41]
    assert torch.allclose(out, _sdpa_reference(torch, q, k, v, mask), atol=1e-5)
    padded = mask.clone()
    padded[1, 0, :, :3] = False  # left padding: refused by name in eager code
    with pytest.raises(ValueError, match="^attention_mask: not the mask of a cache"):
        wfs.hf_cache_attention_forward(object(), q, k, v, padded)


def test_strided_views_the_cache_call_refuses_are_copied_and_counted(fake_cache_call):
    torch, wfs, fake, calls = fake_cache_call
    fake.refuse_views = True
    q, k, v = _qkv(torch, 1, 4, 4, 1, 16)
    with pytest.warns(UserWarning, match="copying the key and value cache"):
        out, _ = wfs.hf_cache_attention_forward(object(), q, k, v, None)
    assert torch.allclose(out, _sdpa_reference(torch, q, k, v, None), atol=1e-5)
    wfs.hf_cache_attention_forward(object(), q, k, v, None)  # no second try of the views
    assert [c["k_contiguous"] for c in calls] == [False, True, True]
    assert wfs.cache_copies() == {"calls": 2, "bytes": 2 * 2 * k.numel() * 4}


def test_a_refusal_that_copies_do_not_cure_is_raised_as_it_is(fake_cache_call, monkeypatch):
    torch, wfs, fake, calls = fake_cache_call
    import wavefront

    def refuses(q, *a, **kw):
        raise ValueError("q head_dim must be one of (64, 128), got 96")
    monkeypatch.setattr(wavefront, "attention_with_kvcache", refuses)
    q, k, v = _qkv(torch, 1, 4, 4, 1, 16, d=96)
    with pytest.raises(ValueError, match="head_dim must be one of"):
        wfs.hf_cache_attention_forward(object(), q, k, v, None)
    assert wfs.cache_copies()["calls"] == 0 and wfs._views_taken == [None]


def test_a_step_without_a_cache_goes_to_the_prefill_hook(fake_cache_call, monkeypatch):
    torch, wfs, fake, calls = fake_cache_call
    import wavefront.torch as wft
    seen = []
    monkeypatch.setattr(wft, "hf_attention_forward",
                        lambda module, q, k, v, mask, *a, **kw: seen.append(q.shape) or (q, None))
    q, k, v = _qkv(torch, 1, 4, 4, 16, 16)
    wfs.hf_cache_attention_forward(object(), q, k, v, None)
    assert seen == [q.shape] and calls == []


def test_the_cache_op_has_a_fake_for_torch_compile():
    torch = pytest.importorskip("torch")
    import wavefront.serving  # noqa: F401  (registers the op)
    from torch._subclasses.fake_tensor import FakeTensorMode
    with FakeTensorMode():
        q = torch.empty(2, 32, 1, 128, dtype=torch.bfloat16)
        k = torch.empty(2, 8, 4096, 128, dtype=torch.bfloat16)
        lengths = torch.empty(2, dtype=torch.int32)
        out = torch.ops.wavefront.hf_kvcache_attention(q, k, k, lengths, None)
    assert tuple(out.shape) == (2, 1, 32, 128) and out.dtype == torch.bfloat16


# ---------------------------------------------------------------------------------------------
# The experiments' analysis on records shaped as their measurements write them (made up here:
# they test the tables and the guarded prose, not any result)
# ---------------------------------------------------------------------------------------------

def _write_records(directory, rows):
    import json
    directory.mkdir(parents=True)
    with open(directory / "rounds.jsonl", "w") as f:
        for row in rows:
            f.write(json.dumps({**row, "record_version": 1}) + "\n")


def test_the_shared_prefix_tables_and_section_read_its_records(tmp_path):
    pytest.importorskip("pandas")
    from experiments import shared_prefix as e
    from wavefront.report.analysis import Study
    gpu = "NVIDIA H100 80GB HBM3"
    control, shared = e.BATCHES[0].label(), e.BATCHES[1].label()
    rows = []
    for batch, grouped_ms, grouped_bytes in ((control, 1.0, 1.074e9), (shared, 0.8, 0.61e9)):
        for order in CTA_ORDERS:
            ms = grouped_ms if order != "batch_major" else 1.0
            for r in range(8):
                rows.append({"kind": "round", "gpu": gpu, "batch": batch, "cta_order": order,
                             "point": order, "round": r, "ms": ms * (1 + 0.001 * r),
                             "sm_clock_mhz": 1980.0})
            for repeat in range(2):
                rows.append({"kind": "ncu", "gpu": gpu, "batch": batch, "cta_order": order,
                             "repeat": repeat, "gpu__time_duration.sum": 250e3,
                             "dram__bytes_read.sum":
                             grouped_bytes if order != "batch_major" else
                             (1.074e9 if batch == control else 0.672e9)})
    _write_records(tmp_path / "shared_prefix", rows)
    study = Study(tmp_path)
    t = e.table(study)
    assert len(t) == 6 and set(t["cta_order"]) == set(CTA_ORDERS)
    g = t[(t["batch"] == shared) & (t["cta_order"] == "prefix_grouped")].iloc[0]
    assert g["speed vs batch_major"] == pytest.approx(1.25) and g["lo"] > 1
    assert g["predicted MB"] > 0 and abs(g["model error"]) < 0.05
    assert g["ncu kernel us"] == 250
    section = e.section(study)
    # control, bytes, model, time, kernel durations: the time claim says the call does not
    # resolve the saving, and these rounds resolve a 25% speed-up, so it fails
    assert [c.holds for c in section.claims] == [True, True, True, False, True]
    assert "H100" in e.figure(study)._suptitle.get_text()
    assert "5% fewer DRAM bytes" in section.text and "single launches" in section.text


def test_the_generate_table_pairs_its_rounds_and_scores_its_tokens(tmp_path):
    pytest.importorskip("pandas")
    from experiments import generate as e
    from wavefront.report.analysis import Study
    gpu = "NVIDIA H100 80GB HBM3"
    rows = []
    for cache in e.CACHES:
        for path in e.PATHS:
            rows.append({"kind": "agreement", "gpu": gpu, "cache": cache, "path": path,
                         "positionwise": 0.5, "first_difference": [10, 20, 128, 128],
                         "forced": 0.99, "forced_logits_rel_error": 0.003})
            for r in range(6):
                seconds = 1.0 if path == "sdpa" else 0.95
                rows.append({"kind": "round", "gpu": gpu, "cache": cache, "path": path,
                             "round": r, "seconds": seconds, "tokens_per_s": 512 / seconds})
    _write_records(tmp_path / "generate", rows)
    t = e.table(Study(tmp_path))
    ours = t[t["path"] == "wavefront"]
    assert len(t) == 4 and (ours["vs sdpa"].round(4) == round(1 / 0.95, 4)).all()
    assert (t["first difference (mean step)"] == 71.5).all()
    section = e.section(Study(tmp_path))
    assert all(c.holds for c in section.claims)
    assert e.figure(Study(tmp_path)).axes[0].get_ylabel().startswith("generated")


def test_the_short_prompt_shapes_and_the_tuned_tables_picks():
    pytest.importorskip("pandas")
    from experiments import short_prompts as e
    shapes = e.shapes()
    assert {s["seqlen"] for s in shapes} == {512, 1024, 2048, 4096}
    assert {s["head_dim"] for s in shapes} == {64, 128}
    assert {s["causal"] for s in shapes} == {False, True}
    assert {s["kv_heads"] < s["heads"] for s in shapes} == {False, True}  # MHA and GQA
    picks = e.picks()
    assert len(picks) == 2 * len(shapes) and picks["schedule"].notna().all()


def test_the_shared_prefix_inputs_and_reference_follow_the_block_tables():
    """measure.shared_prefix on the CPU: the page pool and tables as the model builds them,
    and the reference (pages gathered per sequence) equal to attention over each sequence's
    own keys; a call that reads another group's prefix is caught by `check_order`."""
    torch = pytest.importorskip("torch")
    from wavefront.measure import shared_prefix as m
    spec = SharedPrefixBatch(batch=4, group=2, prefix=32, context=80, page_size=16,
                             kv_heads=2, heads=4, head_dim=64)
    q, k, v, table, seqlens = m.make_inputs(spec, device="cpu")
    assert k.shape == (spec.num_pages, 16, 2, 64) and table.dtype == torch.int32
    assert torch.equal(table[0, :2], table[2, :2]) and seqlens.tolist() == [80] * 4

    def paged(q, k, v, seqlens, block_table=None, out=None, **kw):
        gathered = [x[block_table.long()].reshape(spec.batch, -1, 2, 64) for x in (k, v)]
        out.copy_(_causal_cache_attention(q, *gathered, seqlens))
    assert m.check_order(spec, (q, k, v, table, seqlens), "batch_major", paged) < 1e-2

    def wrong_prefix(q, k, v, seqlens, block_table=None, out=None, **kw):
        swapped = block_table.clone()
        swapped[:, :2] = block_table[[1, 0, 3, 2], :2]  # each sequence reads the other group's
        paged(q, k, v, seqlens, block_table=swapped, out=out)
    assert m.check_order(spec, (q, k, v, table, seqlens), "batch_major", wrong_prefix) > 0.1


@pytest.mark.parametrize("static", [False, True])
def test_the_hook_traces_whole_under_torch_compile(fake_cache_call, static):
    """transformers compiles a StaticCache's decode step with fullgraph=True: the hook (its
    routing, the lengths from the mask, the cache op) must trace without a graph break."""
    torch, wfs, fake, calls = fake_cache_call
    q, k, v = _qkv(torch, 2, 8, 2, 1, 64)
    mask = _static_mask(torch, [20, 41], 1, 64) if static else None

    module = torch.nn.Module()  # (made outside: the traced step only reads it)

    def step(q, k, v, mask):
        return wfs.hf_cache_attention_forward(module, q, k, v, mask)[0]
    compiled = torch.compile(step, backend="eager", fullgraph=True)
    out = compiled(q, k, v, mask)
    assert torch.allclose(out, _sdpa_reference(torch, q, k, v, mask), atol=1e-5)
    assert calls[-1]["cache_seqlens"] == ([20, 41] if static else [64, 64])


def _decode_bench_rows(wf_ms, paged_ms, sdpa_ms, host_us=100.0):
    """bench-decode records of one shape (B8, 128k) with per-round samples."""
    from wavefront.results.records import DECODE_BENCH_RECORDS
    step = 2 * 8 * 131072 * 8 * 128 * 2
    rows = []
    for name, ms in (("wavefront contiguous", wf_ms), ("wavefront paged 64", paged_ms),
                     ("SDPA cudnn", sdpa_ms)):
        samples = [ms * (1 + 0.001 * r) for r in range(8)]
        gbps = step / (ms * 1e-3) / 1e9
        rows.append(DECODE_BENCH_RECORDS.stamp({
            "gpu": "NVIDIA H100 80GB HBM3", "batch": 8, "context": 131072, "heads": 32,
            "kv_heads": 8, "head_dim": 128, "page_size": 64, "contender": name,
            "kv_bytes": step, "samples_ms": samples, "median_ms": samples[4], "gbps": gbps,
            "gbps_ci95": [gbps * 0.99, gbps * 1.01], "dram_peak_gbps": 3000.0,
            "host_us": host_us, "throttled_rounds": 0, "notes": []}))
    return rows


@pytest.mark.parametrize("paged_ms, sdpa_ms, holds", [
    (1.47, 1.45, [True, False, True, True]),  # level with SDPA; paged 2% behind
    (1.60, 1.20, [True, False, False, False]),  # SDPA faster; paged 10% behind, not host-bound
])
def test_the_decode_bench_section_computes_its_goals_from_the_records(tmp_path, paged_ms,
                                                                         sdpa_ms, holds):
    import json
    pytest.importorskip("pandas")
    from experiments import decode_bench as e
    from wavefront.report.analysis import Study
    (tmp_path / "decode_bench").mkdir()
    with open(tmp_path / "decode_bench" / "bench_decode.jsonl", "w") as f:
        for row in _decode_bench_rows(1.44, paged_ms, sdpa_ms):
            f.write(json.dumps(row) + "\n")
    study = Study(tmp_path)
    t = e.table(study)
    assert t["shape"].tolist() == ["B8 128k"]
    section = e.section(study)
    # 4.29 GB in 1.44 ms is 99% of the 3000 GB/s peak: the peak claim holds; the host claim
    # needs a host-bound shape and there is none (100 us of host time in a 1.44 ms step)
    assert [c.holds for c in section.claims] == holds
    assert "H100" in e.figure(study)._suptitle.get_text()


def test_graphed_decode_contenders_are_compared_with_graphed_sdpa(tmp_path):
    """A shape whose eager call is host-bound, measured eager and replayed from CUDA graphs:
    the eager table keeps eager SDPA as its yardstick, the graphed step is paired with graphed
    SDPA, and the graphed claim checks the graphed step against the eager call."""
    import json
    pytest.importorskip("pandas")
    from experiments import decode_bench as e
    from wavefront.report.analysis import Study
    rows = _decode_bench_rows(1.44, 1.47, 1.45, host_us=1400.0)
    graphed = _decode_bench_rows(1.20, 1.22, 1.25, host_us=5.0)
    for r in graphed:
        r["contender"] += e.GRAPHED
    (tmp_path / "decode_bench").mkdir()
    with open(tmp_path / "decode_bench" / "bench_decode.jsonl", "w") as f:
        for row in rows + graphed:
            f.write(json.dumps(row) + "\n")
    study = Study(tmp_path)
    d = e.rows(study).set_index("contender")
    assert d.loc["wavefront contiguous", "best SDPA"] == "SDPA cudnn"
    assert d.loc["wavefront contiguous graphed", "best SDPA"] == "SDPA cudnn graphed"
    assert abs(d.loc["wavefront contiguous graphed", "x SDPA"] - 1.25 / 1.20) < 1e-6
    t = e.table(study)
    assert t["graphed vs SDPA graphed [95%]"].iloc[0].startswith("+4.2%")
    graphed_claim = [c for c in e.section(study).claims if "replayed from CUDA graphs" in c.text]
    assert len(graphed_claim) == 1 and graphed_claim[0].holds
