"""The K/V pipeline read from SASS text (model.pipeline), on producer/consumer loops shaped as
tileiras 13.4 emits them for the paper launch's binary (addresses and registers as there)."""
import pytest

from wavefront.model.pipeline import kv_pipeline

# A producer loop with a 6-stage K ring (wrap by UIMAD -0x6) and a 2-stage V ring (idx &= 1),
# then a consumer loop (HGMMA, MUFU.EX2) with two waits and two releases per step.
PRODUCER = """
        /*a0d0*/                   ULEA UR8, UR15, UR29, 0x3 ;
        /*a100*/                   SYNCS.PHASECHK.TRANS64.TRYWAIT P0, [UR8+0x26030], R4 ;
        /*a1c0*/               @P0 MOV R5, 0x2000 ;
        /*a200*/                   UIADD3 UR15, UR15, 0x1, URZ ;
        /*a210*/                   UTMALDG.4D [UR16], [UR10], desc[URZ] ;
        /*a220*/               @P0 SYNCS.ARRIVE.TRANS64 RZ, [UR8+0x26000], R5 ;
        /*a230*/                   UIMAD.WIDE.U32 UR8, UR15, -0x55555555, URZ ;
        /*a270*/                   SYNCS.PHASECHK.TRANS64.TRYWAIT P0, [UR30+0x260c8], R4 ;
        /*a260*/                   UIMAD UR15, UR9, -0x6, UR15 ;
        /*a310*/               @P0 IMAD.MOV.U32 R4, RZ, RZ, 0x2000 ;
        /*a370*/                   UTMALDG.4D [UR8], [UR18], desc[URZ] ;
        /*a380*/               @P0 SYNCS.ARRIVE.TRANS64 RZ, [UR30+0x260b0], R4 ;
        /*a390*/                   ULOP3.LUT UR7, UR7, 0x1, URZ, 0xc0, !UPT ;
        /*a3e0*/               @P0 BRA 0xa0d0 ;
"""
CONSUMER = """
        /*2610*/                   SYNCS.PHASECHK.TRANS64.TRYWAIT P0, [UR4+0x26000], R2 ;
        /*2620*/                   HGMMA.64x64x16.F32.BF16 R24, gdesc[UR8], RZ ;
        /*2630*/                   MUFU.EX2 R3, R3 ;
        /*2640*/                   SYNCS.ARRIVE.TRANS64.A1T0 RZ, [UR4+0x26030], RZ ;
        /*2650*/                   SYNCS.PHASECHK.TRANS64.TRYWAIT P0, [UR5+0x260b0], R2 ;
        /*2660*/                   HGMMA.64x64x16.F32.BF16 R56, gdesc[UR12], R56 ;
        /*2670*/                   SYNCS.ARRIVE.TRANS64.A1T0 RZ, [UR5+0x260c8], RZ ;
        /*2680*/               @P1 BRA 0x2610 ;
"""


def test_rings_and_lookahead_are_read_from_the_loops():
    p = kv_pipeline(CONSUMER + PRODUCER)
    assert (p.k_stages, p.v_stages) == (6, 2)
    assert p.loads_ahead == 2  # a step needs both tiles: the shorter ring
    assert p.bytes_per_load == 0x2000
    assert (p.consumer_waits, p.consumer_releases) == (2, 2)


def test_a_ring_without_a_wrap_has_one_stage():
    single = "\n".join(line for line in PRODUCER.splitlines()
                       if "-0x6" not in line and "0xc0" not in line)
    assert kv_pipeline(CONSUMER + single).loads_ahead == 1


def test_code_without_the_shape_is_refused_by_name():
    with pytest.raises(ValueError, match="producer loop"):
        kv_pipeline(CONSUMER)
    with pytest.raises(ValueError, match="consumer K/V loop"):
        kv_pipeline(PRODUCER)


def test_the_committed_depths_reach_the_launches(tmp_path):
    """The committed summaries give the paper launch's binary (D64 64x64 non-causal, one CTA per
    SM) three steps in flight and a 128-row tile one; a variant not read is assumed two; a
    malformed file is refused naming it."""
    from wavefront.model.pipeline import loads_ahead_of, read_depths
    from wavefront.point import plan

    def launch(tiles, occupancy, head_dim=64):
        s = (1, 1, 8192, head_dim)
        return plan(s, s, sms=132, l2_bytes=50 << 20, tiles=tiles, occupancy=occupancy,
                    schedule="persistent+linear")
    assert loads_ahead_of(launch("64x64", 1)) == (3, "read from the binary's SASS")
    assert loads_ahead_of(launch("128x64", 2))[0] == 1
    assert loads_ahead_of(launch("64x64", 4))[1].startswith("assumed")
    bad = tmp_path / "pipeline.json"
    bad.write_text('{"binaries": {"x": {"head_dim": 64}}}')
    with pytest.raises(ValueError, match="pipeline.json"):
        read_depths(bad)
