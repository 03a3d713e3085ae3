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
    # prefix_grouped: the first group's sequences (0, 2, 4, 6 interleaved) come first
    assert seen["prefix_grouped"][::2, 0][:4].tolist() == [0, 2, 4, 6]


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


@pytest.mark.parametrize("name", ["shared_prefix", "short_prompts", "generate"])
def test_the_serving_experiments_tables_read_committed_data(name):
    """Each experiment's table from its committed records; skipped until they exist."""
    if not (ROOT / "data" / name).is_dir():
        pytest.skip(f"no committed data/{name} yet")
    from wavefront.report.analysis import Study
    from wavefront.report.experiments import load_experiment
    exp = load_experiment(ROOT / "experiments" / f"{name}.py")
    t = exp.table(Study(ROOT / "data"))
    assert len(t) > 0
