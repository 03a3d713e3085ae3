"""The call a model makes, `wavefront.attention(q, k, v, causal=...)` with no other option,
keys by the arrays and the mask alone (`kernel.call.attention_plain`). On the CPU, with the
Plan's build and launch stood in for: a miss takes the full path and the plain map then
holds the very Plan the full path cached; a hit takes no other path; an int mask or
another library takes the full path; an eviction empties the map."""
import pytest

torch = pytest.importorskip("torch")

from wavefront.kernel import arrays as A  # noqa: E402
from wavefront.kernel import call as C  # noqa: E402
from wavefront.kernel import launcher as L  # noqa: E402
from wavefront.kernel import streams as S  # noqa: E402
from wavefront.kernel.plan import CALL_OPTIONS, CallOptions  # noqa: E402


class FakeLauncher:
    plain_ready = False  # not prepared: the hit goes through `launch_call`

    def __init__(self, launched):
        self.launched = launched

    def launch_call(self, q, k, v, out, stream):
        self.launched.append(self)


class FakePlan:
    recently_used = False

    def __init__(self, launcher):
        self.launcher = launcher


@pytest.fixture
def stand_ins(monkeypatch):
    built, launched, full = [], [], []

    def new_plan(vq, q, k, v, options, stream=None):
        built.append(options)
        return FakePlan(FakeLauncher(launched))

    real_with = C.attention_with

    def attention_with(q, k, v, values, out=None, stream=None):
        full.append(values)
        return real_with(q, k, v, values, out, stream)
    monkeypatch.setattr(C, "_check_inputs", lambda q, k, v: (q, (q, k, v)))
    monkeypatch.setattr(C, "_new_plan", new_plan)
    monkeypatch.setattr(C, "attention_with", attention_with)
    C.clear_launcher_cache()
    yield built, launched, full
    C.clear_launcher_cache()


def test_a_plain_call_shares_the_full_paths_plan(stand_ins):
    built, launched, full = stand_ins
    q, k, v = (torch.zeros(1, 2, 64, 64, dtype=torch.bfloat16) for _ in range(3))
    C.attention_plain(q, k, v, True)
    assert len(built) == 1 and len(full) == 1
    (cached,) = C._plans.values()
    assert list(C._plain_plans.values()) == [cached]
    # the full path saw exactly the options of a call that names none: CallOptions' defaults
    assert full[0] == CallOptions(causal=True).values()
    assert dict(zip(CALL_OPTIONS, full[0])) == {**dict.fromkeys(CALL_OPTIONS), "causal": True,
                                                "return_lse": False,
                                                "causal_alignment": "top_left"}
    assert built == [CallOptions(causal=True)]
    C.attention_plain(q, k, v, True)  # a hit: no full path, the same Plan
    assert len(full) == 1 and launched == [cached.launcher] * 2 and cached.recently_used
    C.attention_plain(q, k, v, False)  # the other mask: its own Plan
    assert len(built) == 2 and len(C._plain_plans) == 2
    with pytest.raises(ValueError, match="causal must be True or False"):
        C.attention_plain(q, k, v, 1)  # an int mask: the full path, keyed apart, refused
    assert len(full) == 3 and len(C._plain_plans) == 2


def test_an_eviction_empties_the_plain_map(stand_ins, monkeypatch):
    monkeypatch.setattr(C, "LAUNCHER_CACHE_SIZE", 2)
    for n in range(4):
        q = torch.zeros(1, 1, 64 + n, 64, dtype=torch.bfloat16)
        C.attention_plain(q, q, q, False)
    cached = list(C._plans.values())
    assert len(cached) == 2 and C._plain_plans
    assert all(any(kept is c for c in cached) for kept in C._plain_plans.values())


class FakeCupyArray:
    """What the keys read of a CuPy array (shape, strides, dtype, and the device its memory
    is on), no GPU needed."""

    def __init__(self, shape, device=0):
        import types
        self.shape, self.dtype = shape, "bfloat16"
        self.strides = tuple(2 * n for n in (shape[1] * shape[2] * shape[3],
                                             shape[2] * shape[3], shape[3], 1))
        self.data = types.SimpleNamespace(device_id=device)


FakeCupyArray.__module__ = "cupy._core.core"


def test_cupy_arrays_take_the_plain_key_too(stand_ins):
    built, launched, full = stand_ins
    q, k, v = (FakeCupyArray((1, 2, 64, 64)) for _ in range(3))
    C.attention_plain(q, k, v, False)
    C.attention_plain(q, k, v, False)
    assert len(built) == 1 and len(full) == 1 and len(C._plain_plans) == 1
    (cached,) = C._plans.values()
    assert launched == [cached.launcher] * 2
    other_gpu = [FakeCupyArray((1, 2, 64, 64), device=1) for _ in range(3)]
    C.attention_plain(*other_gpu, False)  # another device: another Plan
    assert len(built) == 2 and len(C._plain_plans) == 2
    # a torch q with CuPy k and v: no plain key, the full path
    C.attention_plain(torch.zeros(1, 2, 64, 64, dtype=torch.bfloat16), k, v, False)
    assert len(full) == 3


def test_a_streams_handle_is_read_by_its_types_attribute():
    """torch streams hold their handle in `cuda_stream`, CuPy's in `ptr`: found once per type
    (a failed `hasattr` costs about a microsecond a call), a raw handle passed through, and
    anything else refused by name."""
    class TorchLike:
        cuda_stream = 0x1234

    class CupyLike:
        def __init__(self, ptr):
            self.ptr = ptr

    assert S._stream_handle(7) == 7
    assert S._stream_handle(TorchLike()) == 0x1234
    assert S._stream_handle(CupyLike(0x99)) == 0x99 and S._stream_handle(CupyLike(5)) == 5
    assert S._handle_attributes[TorchLike] == "cuda_stream"
    assert S._handle_attributes[CupyLike] == "ptr"
    with pytest.raises(ValueError, match="stream must be a raw CUDA stream handle"):
        S._stream_handle("the default stream")


def test_a_hit_on_a_launcher_ready_for_it_takes_launch_plain(stand_ins):
    """Once a launcher is `plain_ready` (prepared, one GPU, torch, one kernel, no LSE), a hit
    goes to its `launch_plain`, not through `launch_call`."""
    built, launched, full = stand_ins
    q = torch.zeros(1, 2, 64, 64, dtype=torch.bfloat16)
    C.attention_plain(q, q, q, False)
    (cached,) = C._plans.values()
    fast = []
    cached.launcher.plain_ready = True
    cached.launcher.launch_plain = lambda q, k, v: fast.append((q, k, v)) or "out"
    assert C.attention_plain(q, q, q, False) == "out"
    assert launched == [cached.launcher] and len(fast) == 1 and len(full) == 1


class FakePrepared:
    def __init__(self, fits=True):
        self.fits, self.launched = fits, []

    def launch(self, stream, addresses):
        self.launched.append((stream, addresses))
        return self.fits


class FakeCupyBuffer(FakeCupyArray):
    """A CuPy array as the CuPy address reader reads it: its address in `data.ptr`."""

    def __init__(self, ptr):
        super().__init__((1, 1, 8, 64))
        self.data.ptr = ptr


class FakeEvent:
    ptr = 0xE0


def _ready_launcher(stream=7, launched_on=(7,), table_built=None, capturing=False, fits=True,
                    library="torch"):
    """An AttentionLauncher as far as `launch_plain` reads it, ready for the plain call on
    `library`'s arrays (a CuPy launcher notes its launches: each stream has its event)."""
    launcher = L.AttentionLauncher.__new__(L.AttentionLauncher)
    launcher.current_stream = lambda: stream
    launcher._launched_on = set(launched_on)
    launcher._table_built = table_built
    launcher.capturing = lambda handle: capturing
    launcher._prepared = FakePrepared(fits)
    launcher._lse_argument = A._Described(None, {"data": (0xABC00, False)})  # the stand-in
    launcher._addresses = A._address_reader(library)
    launcher._notes_launches = library != "torch"
    if library == "torch":
        launcher.new_output = torch.empty_like
    else:
        launcher.new_output = lambda q: FakeCupyBuffer(0x5000)
        launcher._last_launch_on = {handle: FakeEvent() for handle in launched_on}
        launcher.recorded = []
        launcher._record_event = lambda event, handle: launcher.recorded.append((event, handle))
    return launcher


def _misaligned(launcher, monkeypatch) -> list:
    """`launcher` with a prepared launch that refuses the addresses: what `ct.launch` gets."""
    jit = []
    monkeypatch.setattr(L.ct, "launch", lambda *args: jit.append(args))
    launcher.grid, launcher.kernel, launcher._bound_args = (3, 1, 1), "kernel", ("bound",)
    return jit


@pytest.mark.parametrize("library", ["torch", "cupy"])
@pytest.mark.parametrize("why", ["another stream", "table still building", "capturing"])
def test_launch_plain_goes_the_whole_way_for_what_it_leaves_out(why, library, monkeypatch):
    """`launch_plain` launches only on a stream the launcher has launched on, with its work
    table built and outside a capture; otherwise it hands the call to `launch_call` (which
    makes a stream's own copy, waits for the table, keeps a captured launcher), and notes
    nothing itself."""
    whole = []
    monkeypatch.setattr(L.AttentionLauncher, "launch_call",
                        lambda *args: whole.append(args) or "whole")
    launcher = _ready_launcher(library=library, **{
        "another stream": {"launched_on": (3,)}, "table still building": {"table_built": object()},
        "capturing": {"capturing": True}}[why])
    q = torch.zeros(1, 1, 8, 64, dtype=torch.bfloat16) if library == "torch" else \
        FakeCupyBuffer(0x1000)
    assert launcher.launch_plain(q, q, q) == "whole"
    assert whole == [(launcher, q, q, q, None, None)] and not launcher._prepared.launched
    if library == "cupy":
        assert not launcher.recorded


def test_launch_plain_launches_the_addresses_in_parameter_order(monkeypatch):
    """On its own path: a new output of q's shape and dtype, and the prepared launch given
    q's, k's, v's, the output's and the LSE stand-in's addresses on the current stream; where
    the addresses break the binary's alignment (the prepared launch says so), `ct.launch`."""
    monkeypatch.setattr(L.AttentionLauncher, "launch_call",
                        lambda *args: pytest.fail("went the whole way"))
    q, k, v = (torch.randn(1, 2, 8, 64).to(torch.bfloat16) for _ in range(3))
    launcher = _ready_launcher()
    out = launcher.launch_plain(q, k, v)
    assert out.shape == q.shape and out.dtype == q.dtype
    assert launcher._prepared.launched == [
        (7, (q.data_ptr(), k.data_ptr(), v.data_ptr(), out.data_ptr(), 0xABC00))]
    launcher = _ready_launcher(fits=False)
    jit = _misaligned(launcher, monkeypatch)
    out = launcher.launch_plain(q, k, v)
    assert jit == [(7, (3, 1, 1), "kernel", (q, k, v, out, launcher._lse_argument, "bound"))]


def test_the_cupy_plain_launch_reads_cupys_addresses_and_notes_its_stream(monkeypatch):
    """CuPy arrays' addresses (`data.ptr`) in parameter order; each launch noted on its stream
    by recording the stream's event; on the null stream, never (CuPy does not destroy it)."""
    monkeypatch.setattr(L.AttentionLauncher, "launch_call",
                        lambda *args: pytest.fail("went the whole way"))
    q, k, v = FakeCupyBuffer(0x1000), FakeCupyBuffer(0x2000), FakeCupyBuffer(0x3000)
    launcher = _ready_launcher(library="cupy")
    first, second = launcher.launch_plain(q, k, v), launcher.launch_plain(q, k, v)
    assert first.data.ptr == second.data.ptr == 0x5000
    assert launcher._prepared.launched == [(7, (0x1000, 0x2000, 0x3000, 0x5000, 0xABC00))] * 2
    assert launcher.recorded == [(FakeEvent.ptr, 7)] * 2
    null = _ready_launcher(stream=0, launched_on=(0,), library="cupy")
    null.launch_plain(q, k, v)
    assert null._prepared.launched and not null.recorded
    misaligned = _ready_launcher(fits=False, library="cupy")
    jit = _misaligned(misaligned, monkeypatch)
    out = misaligned.launch_plain(q, k, v)
    assert jit == [(7, (3, 1, 1), "kernel", (q, k, v, out, misaligned._lse_argument, "bound"))]
    assert misaligned.recorded == [(FakeEvent.ptr, 7)]


def test_a_miss_makes_the_plan_from_the_options_and_the_tuned_table(monkeypatch):
    """The miss path as it runs, but for the launcher's binding (recorded) and the GPU (a
    stand-in named after the committed table's H100): the launcher gets the call's own options
    and the configuration chosen (the table's entry where the call chose nothing, the caller's
    otherwise), the Plan says which, and later calls and `plan_for` find that very Plan."""
    from types import SimpleNamespace

    from wavefront.kernel import tuning
    from wavefront.kernel.tuning import tuned_config
    gpu = SimpleNamespace(name="NVIDIA H100 80GB HBM3", sms=132, l2_bytes=50 << 20)
    monkeypatch.setattr(tuning, "current_device", lambda: gpu)
    monkeypatch.setattr(C, "current_device", lambda: gpu)
    monkeypatch.setenv(tuning.CARRY_OVER_VARIABLE, "nearest")
    bound = []

    def planned(vq, k_shape, **arguments):
        bound.append(arguments)
        return SimpleNamespace(launch=f"launch {len(bound)}", launch_call=lambda *a: "out")
    monkeypatch.setattr(L.AttentionLauncher, "planned", staticmethod(planned))
    monkeypatch.setattr(C, "_check_inputs", lambda q, k, v: (SimpleNamespace(
        shape=tuple(q.shape), dtype="bfloat16"), (q, k, v)))
    C.clear_launcher_cache()
    shape = (1, 32, 8192, 128)
    q = torch.zeros(shape, dtype=torch.bfloat16)
    tuned = tuned_config(gpu.name, shape, shape, True)
    assert C.attention_plain(q, q, q, True) == "out"
    (plan,) = C._plans.values()
    assert plan.source == "tuned" and plan.config == tuned and plan.gpu is gpu
    assert bound == [{"causal": True, "scale": None, "return_lse": False, "l2_bytes": None,
                      "ctas": None, "chunk_tiles": None, "causal_alignment": "top_left",
                      **tuned}]
    assert C.plan_for(q, q, q, CallOptions(causal=True)) is plan and len(bound) == 1
    values = CallOptions(causal=True, scale=0.5, schedule="persistent+sawtooth").values()
    C.attention_with(q, q, q, values)
    C.attention_with(q, q, q, values)
    assert len(bound) == 2 and bound[1]["schedule"] == "persistent+sawtooth"
    assert bound[1]["scale"] == 0.5 and bound[1]["tiles"] is None
    mine = C.plan_for(q, q, q, CallOptions(*values))
    assert mine.source == "caller" and mine is not plan and len(C._plans) == 2
    C.clear_launcher_cache()


def test_launch_call_never_prepares_from_arrays_it_does_not_vouch_for(monkeypatch):
    """`launch_call` tells the launch what it knows of the arrays: its own new output and
    vouched arrays -> the prepared launch may take them (True); arrays a Plan was not made
    from (`vouched=False`) -> `ct.launch` and no counting towards preparing (False), so the
    launcher the public call shares is never prepared from another layout."""
    launched = []
    monkeypatch.setattr(L.AttentionLauncher, "__call__",
                        lambda self, q, k, v, out, stream, lse=None, prepared_ok=None:
                        launched.append(prepared_ok) or out)
    launcher = _ready_launcher()
    launcher.view = A._ArrayView("torch", (1, 1, 8, 64), "bfloat16", 0, (512, 512, 64, 1))
    launcher.return_lse = False
    q = torch.zeros(1, 1, 8, 64, dtype=torch.bfloat16)
    launcher.launch_call(q, q, q)
    launcher.launch_call(q, q, q, vouched=False)
    assert launched == [True, False]
