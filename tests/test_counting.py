import pytest

from wavefront.model.counting import launch_counts, paper_sector_count
from wavefront.point import SECTOR_BYTES
from wavefront.schedules import AttentionProblem, Launch, cta_schedule, kv_schedule


@pytest.mark.parametrize("seqlen,tile", [(4096, 64), (8192, 128), (131072, 64)])
def test_noncausal_matches_the_paper_closed_form(seqlen, tile):
    p = AttentionProblem(1, 1, 1, seqlen, seqlen, 64, tile_m=tile, tile_n=64)
    c = launch_counts(p)
    assert c.sectors == pytest.approx(paper_sector_count(seqlen, 64, tile), rel=1e-12)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("seqlen", [1, 100, 333, 1024])
@pytest.mark.parametrize("tiles", [(64, 64), (128, 64), (128, 128)])
def test_counts_match_the_tiles_a_launch_visits(causal, seqlen, tiles):
    p = AttentionProblem(2, 2, 1, seqlen, seqlen, 128, causal=causal, tile_m=tiles[0],
                         tile_n=tiles[1])
    launch = Launch(p, cta_schedule("persistent"), kv_schedule("sawtooth"), 4, 2, 1 << 20)
    row_bytes = p.head_dim * p.element_bytes
    kv_sectors = 0
    for w in launch.all_work():
        for j in w.kv_tiles:
            rows = min(p.tile_n, p.seqlen_kv - j * p.tile_n)
            kv_sectors += 2 * rows * row_bytes // SECTOR_BYTES
    c = launch_counts(p)
    assert c.kv_read_sectors == kv_sectors
    assert c.q_read_sectors == c.o_write_sectors == p.batch * p.heads * seqlen * row_bytes // SECTOR_BYTES


def test_causal_useful_flops_are_about_half():
    full = launch_counts(AttentionProblem(1, 1, 1, 8192, 8192, 128))
    causal = launch_counts(AttentionProblem(1, 1, 1, 8192, 8192, 128, causal=True))
    assert causal.useful_flops / full.useful_flops == pytest.approx(0.5, abs=1e-3)
    # The kernel also computes the masked halves of the diagonal tiles.
    assert causal.executed_flops > causal.useful_flops
