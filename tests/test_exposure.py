"""The exposure experiments' CPU side: co-runner sources and their refusals, the L2 probe's
reading, and sawtooth-against-linear pairing with its dropped rounds."""
import numpy as np
import pandas as pd
import pytest

from wavefront.measure.corunners import (KINDS, LOAD_POLICIES, PROBE_PASSES, STORE_POLICIES,
                                         CoRunnerSpec, L2Hold, corunner_source,
                                         l2_left_from_probe)
from wavefront.report.exposure import multiplicity, paired


@pytest.mark.parametrize("kind", KINDS)
def test_each_kind_moves_what_its_name_says(kind):
    src = corunner_source(kind, "cs", "wt")
    assert ("ld.global.cs" in src) == (kind in ("read", "copy", "gemm_like"))
    assert ("st.global.wt" in src) == (kind in ("copy", "append", "gemm_like"))


@pytest.mark.parametrize("store", STORE_POLICIES)
def test_every_store_policy_is_its_own_instruction(store):
    src = corunner_source("copy", "ca", store)
    if store in ("evict_first", "evict_last"):
        assert f"createpolicy.fractional.L2::{store}" in src and "L2::cache_hint" in src
    elif store == "no_allocate":
        assert "st.global.L1::no_allocate" in src
    elif store == "wb":
        assert "st.global.v4" in src
    else:
        assert f"st.global.{store}.v4" in src


@pytest.mark.parametrize("load", LOAD_POLICIES)
def test_every_load_policy_reaches_the_source(load):
    src = corunner_source("read", load)
    expected = "L2::cache_hint" if load.startswith("evict") else (
        "ld.global.v4" if load == "ca" else f"ld.global.{load}.v4")
    assert expected in src


@pytest.mark.parametrize("args, named", [(("scatter",), "kind"), (("read", "ld"), "load"),
                                         (("copy", "ca", "st"), "store"),
                                         (("copy", "evict_first", "evict_last"), "hints")])
def test_bad_co_runners_are_refused_by_name(args, named):
    with pytest.raises(ValueError, match=named):
        CoRunnerSpec(*args)


def test_labels_name_only_the_policies_a_kind_uses():
    assert CoRunnerSpec("append", "cs", "wb").label == "append st.wb"
    assert CoRunnerSpec("read", "cs").label == "read ld.cs"
    assert CoRunnerSpec("copy", "ca", "wt").label == "copy ld.ca st.wt"


def test_an_empty_hold_needs_no_gpu_and_a_negative_one_is_refused():
    with L2Hold(0) as hold:
        hold.refill()
    with pytest.raises(ValueError, match="nbytes"):
        L2Hold(-1)


def test_the_probe_reads_the_l2_left_from_dram_bytes():
    mib = 1 << 20
    fits = [{"probe_bytes": n * mib, "dram__bytes_read.sum": n * mib * 1.1} for n in (8, 16)]
    spills = [{"probe_bytes": n * mib, "dram__bytes_read.sum": n * mib * PROBE_PASSES * 0.9}
              for n in (24, 32)]
    assert l2_left_from_probe(fits + spills) == 16 * mib
    assert l2_left_from_probe(spills) is None


def _rounds(lin, saw, **extra):
    rows = []
    for r, (a, b) in enumerate(zip(lin, saw)):
        for point, ms in (("linear", a), ("sawtooth", b)):
            rows.append({"GPU": "H100", "env": "x", "round": r, "point": point, "ms": ms,
                         "throttled": extra.get("throttled", {}).get((r, point), False),
                         "sm_clock_mhz": 1980.0,
                         "overran": extra.get("overran", {}).get(r, False)})
    return pd.DataFrame(rows)


def test_pairing_is_linear_over_sawtooth_by_round():
    t = paired(_rounds([10.0] * 7, [8.0] * 7), ["GPU", "env"], "linear", "sawtooth")
    row = t.iloc[0]
    assert row["sawtooth vs linear"] == pytest.approx(1.25) and row["rounds"] == 7
    assert row["lo"] == pytest.approx(1.25) and row["hi"] == pytest.approx(1.25)


def test_a_round_across_a_clock_change_or_after_the_co_runner_is_dropped():
    d = _rounds([10.0] * 8, [10.0] * 7 + [1.0], throttled={(0, "linear"): True},
                overran={7: True})
    row = paired(d, ["GPU", "env"], "linear", "sawtooth").iloc[0]
    assert row["rounds"] == 6 and row["dropped (clock state)"] == 1
    assert row["dropped (co-runner ended first)"] == 1
    assert row["sawtooth vs linear"] == pytest.approx(1.0)


def test_too_few_rounds_give_no_interval_and_multiplicity_counts_what_has_one():
    few = paired(_rounds([10.0] * 5, [9.0] * 5), ["GPU", "env"], "linear", "sawtooth")
    assert np.isnan(few.iloc[0]["lo"])
    many = paired(_rounds([10.0] * 6, [9.0] * 6), ["GPU", "env"], "linear", "sawtooth")
    m = multiplicity(pd.concat([few, many]))
    assert (m["intervals"], m["above"], m["below"], m["above by > 1%"]) == (1, 1, 0, 1)
    assert m["expected_by_chance"] == pytest.approx(1 / 32, abs=0.01)


def test_the_driver_structs_have_the_cuda_layouts():
    """CUaccessPolicyWindow (base, bytes, hit ratio, two properties) and the 64-byte union
    CUlaunchAttributeValue the stream attribute takes: a wrong layout would hold other bytes."""
    import ctypes
    from wavefront.measure.corunners import _AccessPolicyWindow, _StreamAttrValue
    assert ctypes.sizeof(_AccessPolicyWindow) == 32
    assert [getattr(_AccessPolicyWindow, f).offset for f in
            ("base_ptr", "num_bytes", "hitRatio", "hitProp", "missProp")] == [0, 8, 16, 20, 24]
    assert ctypes.sizeof(_StreamAttrValue) == 64
