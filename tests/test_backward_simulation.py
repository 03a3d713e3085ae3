"""The backward's lock-step L2 model (CPU): its trace replays the work table exactly (every
item's K/V once, every visit's Q, dO and row statistics, dQ atomics only in the atomic mode,
dK/dV written once), and an L2 that holds everything reads each byte from DRAM once."""
import numpy as np
import pytest

from wavefront.backward_schedules import BackwardLaunch
from wavefront.model.backward_simulation import (KIND_DO, KIND_DQ, KIND_ROW_STATS,
                                                 backward_trace, predict_backward_l2)
from wavefront.model.simulation import KIND_O, KIND_Q
from wavefront.schedules import AttentionProblem

PROBLEM = AttentionProblem(2, 4, 2, 333, 333, 64, True, 64, 64)


@pytest.mark.parametrize("schedule", ["grid+linear", "persistent+sawtooth", "grouped+linear",
                                      "longest_first+sawtooth"])
@pytest.mark.parametrize("atomic", [False, True])
def test_trace_replays_the_table(schedule, atomic):
    launch = BackwardLaunch.of(PROBLEM, schedule, 5, 1, 1 << 20)
    trace = backward_trace(launch, atomic)
    visits = sum(len(launch.q_order(i)) for i in range(launch.num_items))
    counts = {k: int((trace.kind == k).sum()) for k in (0, 1, KIND_Q, KIND_DO, KIND_ROW_STATS,
                                                         KIND_DQ, KIND_O)}
    assert counts[0] == counts[1] == launch.num_items
    assert counts[KIND_O] == 2 * launch.num_items
    assert counts[KIND_Q] == counts[KIND_DO] == counts[KIND_ROW_STATS] == visits
    assert counts[KIND_DQ] == (visits if atomic else 0)
    assert set(np.unique(trace.slot)) <= set(range(trace.n_slots))


def test_an_l2_that_holds_everything_reads_each_byte_once():
    launch = BackwardLaunch.of(PROBLEM, "persistent+linear", 5, 1, 1 << 20)
    trace = backward_trace(launch)
    reads = trace.is_read
    _, first = np.unique(trace.address[reads], return_index=True)
    compulsory = int(trace.nbytes[reads][first].sum())
    got = predict_backward_l2(launch, capacity_bytes=1 << 40)
    assert got.dram_read_sectors * 32 == pytest.approx(compulsory, rel=0.01)
    small = predict_backward_l2(launch, capacity_bytes=64 << 10)
    assert small.dram_read_sectors > got.dram_read_sectors
