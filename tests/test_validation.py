"""Bad input: a ValueError naming the argument (no GPU)."""
import numpy as np
import pytest

from wavefront.api import attention, parse_schedule, parse_tiles, plan

pytest.importorskip("wavefront.kernel.launcher", reason="needs cuda-tile (gpu extra)")
from wavefront.kernel import arrays, streams  # noqa: E402
_ArrayView, validate_views = arrays._ArrayView, arrays.validate_views


def view(shape=(1, 4, 128, 64), dtype="bfloat16", device=0, strides=None, library="cupy"):
    if strides is None:
        strides = tuple(int(np.prod(shape[i + 1:])) for i in range(len(shape)))
    return _ArrayView(library, tuple(shape), dtype, device, tuple(strides))


def test_valid_views_pass():
    validate_views(view(), view((1, 2, 300, 64)), view((1, 2, 300, 64)))


@pytest.mark.parametrize("q,k,v,match", [
    (view((4, 128, 64)), view(), view(), r"^q must be 4-D"),
    (view(), view((1, 4, 0, 64)), view((1, 4, 0, 64)), r"^k seqlen must be at least 1"),
    (view(dtype="float32"), view(), view(), r"^q dtype must be one of"),
    (view(), view(dtype="float16"), view(), r"^k dtype must be one of|^k dtype must match"),
    (view(), view(), view(dtype="float16"), r"^v dtype"),
    (view(), view(device=1), view(), r"^k must be on q's device"),
    (view(), view(library="torch"), view(), r"^k must come from the same library"),
    (view(strides=(1, 1, 1, 2)), view(), view(), r"^q must be contiguous in its last"),
    (view(), view(), view((1, 4, 64, 64)), r"^v shape must equal k shape"),
    (view(), view((2, 4, 128, 64)), view((2, 4, 128, 64)), r"^k batch must equal q batch"),
    (view(), view((1, 4, 128, 128)), view((1, 4, 128, 128)), r"^k head_dim must equal"),
    (view((1, 4, 128, 96)), view((1, 4, 128, 96)), view((1, 4, 128, 96)), r"^q head_dim must be"),
    (view(), view((1, 3, 128, 64)), view((1, 3, 128, 64)), r"^q heads \(4\) must be a multiple"),
])
def test_bad_views(q, k, v, match):
    with pytest.raises(ValueError, match=match):
        validate_views(q, k, v)


def test_host_arrays_are_refused_naming_the_argument():
    a = np.zeros((1, 1, 8, 64), dtype=np.float16)
    with pytest.raises(ValueError, match="^q must live in GPU memory"):
        attention(a, a, a)
    with pytest.raises(ValueError, match="^q must be a CuPy array"):
        attention([1, 2], a, a)


@pytest.mark.parametrize("bad", ["", "diagonal+linear", "persistent+blocked", 3])
def test_bad_schedule(bad):
    with pytest.raises(ValueError, match="schedule"):
        parse_schedule(bad)


def test_schedule_and_tiles_parse():
    assert parse_schedule("grid") == ("grid", "linear")
    assert parse_schedule("grouped+sawtooth") == ("grouped", "sawtooth")
    assert parse_tiles("128X64") == (128, 64)
    for bad in ("128", "64x32", "axb"):
        with pytest.raises(ValueError, match="tiles"):
            parse_tiles(bad)


def test_plan_validates_occupancy_and_defaults():
    launch = plan((1, 32, 8192, 128), (1, 32, 8192, 128), schedule="persistent+sawtooth",
                  sms=132, l2_bytes=50 << 20).launch
    assert (launch.problem.tile_m, launch.problem.tile_n, launch.ctas_per_sm) == (128, 64, 2)
    assert launch.num_ctas == 264
    with pytest.raises(ValueError, match="occupancy"):
        plan((1, 1, 64, 64), (1, 1, 64, 64), occupancy=0, sms=132, l2_bytes=50 << 20)


def test_a_bad_causal_alignment_names_the_argument():
    from wavefront.kernel.plan import CallOptions
    for bad in ("bottom-right", "", None, 0):
        with pytest.raises(ValueError, match="^causal_alignment must be one of"):
            CallOptions(causal=True, causal_alignment=bad)
        with pytest.raises(ValueError, match="^causal_alignment must be one of"):
            plan((1, 2, 64, 64), (1, 2, 128, 64), causal=True, causal_alignment=bad,
                 sms=132, l2_bytes=50 << 20)
    assert CallOptions(causal=True, causal_alignment="bottom_right").values()[
        list(CallOptions.__dataclass_fields__).index("causal_alignment")] == "bottom_right"


def test_the_public_call_passes_its_options_in_call_options_order(monkeypatch):
    """`wavefront.attention`'s keywords go to the kernel as one tuple (keywords cost
    microseconds per call), in `CallOptions`' field order, levers last in their declared
    order: each keyword given a value of its own lands in the field of its name."""
    import wavefront.api as api
    from wavefront.kernel.plan import CALL_OPTIONS
    from wavefront.point import LEVERS, lever_values
    passed = []
    monkeypatch.setattr(api, "_launch", (lambda q, k, v, values, out, stream: passed.append(
        (values, out, stream)), lambda q, k, v, causal: passed.append(("plain", causal))))
    names = [n for n in CALL_OPTIONS if n != "causal"]
    given = {name: f"<{name}>" for name in names}
    api.attention("q", "k", "v", causal="<causal>", out="<out>", stream="<stream>", **given)
    (values, out, stream), = passed
    assert dict(zip(CALL_OPTIONS, values)) == {"causal": "<causal>", **given}
    assert (out, stream) == ("<out>", "<stream>")
    api.attention("q", "k", "v", causal=True)
    assert passed[-1] == ("plain", True)
    # a bottom-right call is not the plain call (whose key holds only the mask)
    api.attention("q", "k", "v", causal=True, causal_alignment="bottom_right")
    values = passed[-1][0]
    assert dict(zip(CALL_OPTIONS, values))["causal_alignment"] == "bottom_right"
    assert lever_values({"cluster": 2, "exp2_poly": 1}) == tuple(
        {"cluster": 2, "exp2_poly": 1}.get(lever.name) for lever in LEVERS)
    with pytest.raises(TypeError, match="unknown kernel levers"):
        lever_values({"warps": 8})


def test_kept_buffers_go_once_their_events_are_done():
    """What a dropped launcher's buffers wait on (`_keep_until_done`): each kept entry goes at
    the first keeping after all its events are done, not before (stand-in events, no GPU)."""
    class Event:
        done = False
    kept = streams._kept
    kept.clear()
    first, second = Event(), Event()
    streams._keep_until_done([first, second], "table A")
    streams._keep_until_done([], "pinned copy B")
    second.done = True
    streams._keep_until_done([Event()], "table C")
    assert [buffers for _, buffers in kept] == ["table A", "table C"]  # B had no events
    first.done = True
    streams._keep_until_done([], "table D")
    assert [buffers for _, buffers in kept] == ["table C", "table D"]
    kept.clear()
