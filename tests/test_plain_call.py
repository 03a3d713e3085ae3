"""The call a model makes, `wavefront.attention(q, k, v, causal=...)` with no other option,
keys by the arrays and the mask alone (`kernel.launcher.attention_plain`). On the CPU, with the
launcher's build and launch stood in for: a miss takes the full path and the plain map then
holds the very launcher the full path cached; a hit takes no other path; an int mask or
another library takes the full path; an eviction empties the map."""
import pytest

torch = pytest.importorskip("torch")

from wavefront.kernel import launcher as L  # noqa: E402


class FakeLauncher:
    recently_used = False
    plain_ready = False  # not prepared: the hit goes through `_launch_call`


@pytest.fixture
def stand_ins(monkeypatch):
    built, launched, full = [], [], []

    def new_launcher(vq, k_shape, **config):
        built.append(config)
        return FakeLauncher()

    real_positional = L.attention_positional

    def positional(*args):
        full.append(args[3:])
        return real_positional(*args)
    monkeypatch.setattr(L, "_check_inputs", lambda q, k, v: (q, (q, k, v)))
    monkeypatch.setattr(L, "resolve_config", lambda *args: {})
    monkeypatch.setattr(L, "_new_launcher", new_launcher)
    monkeypatch.setattr(L, "attention_positional", positional)
    monkeypatch.setattr(L, "_launch_call",
                        lambda launcher, q, k, v, out, stream: launched.append(launcher))
    L.clear_launcher_cache()
    yield built, launched, full
    L.clear_launcher_cache()


def test_a_plain_call_shares_the_full_paths_launcher(stand_ins):
    built, launched, full = stand_ins
    q, k, v = (torch.zeros(1, 2, 64, 64, dtype=torch.bfloat16) for _ in range(3))
    L.attention_plain(q, k, v, True)
    assert len(built) == 1 and len(full) == 1
    (cached,) = L._launchers.values()
    assert list(L._plain_launchers.values()) == [cached]
    # the full path saw exactly the options and levers of a call that names none
    options, levers = full[0][:11], full[0][11:]
    assert options == (True, None, None, None, None, False, None, None, None, None, None)
    assert levers == (None,) * len(L.KERNEL_LEVERS)
    L.attention_plain(q, k, v, True)  # a hit: no full path, the same launcher
    assert len(full) == 1 and launched == [cached, cached] and cached.recently_used
    L.attention_plain(q, k, v, False)  # the other mask: its own launcher
    assert len(built) == 2 and len(L._plain_launchers) == 2
    L.attention_plain(q, k, v, 1)  # an int mask: the full path, keyed apart from True
    assert len(full) == 3 and len(L._plain_launchers) == 2
    # the kwargs entry (wavefront.torch's) with no option is the plain call
    L.attention(q, k, v, causal=True)
    assert len(full) == 3 and launched[-1] is cached


def test_an_eviction_empties_the_plain_map(stand_ins, monkeypatch):
    monkeypatch.setattr(L, "LAUNCHER_CACHE_SIZE", 2)
    for n in range(4):
        q = torch.zeros(1, 1, 64 + n, 64, dtype=torch.bfloat16)
        L.attention_plain(q, q, q, False)
    cached = list(L._launchers.values())
    assert len(cached) == 2 and L._plain_launchers
    assert all(any(kept is c for c in cached) for kept in L._plain_launchers.values())


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
    L.attention_plain(q, k, v, False)
    L.attention_plain(q, k, v, False)
    assert len(built) == 1 and len(full) == 1 and len(L._plain_launchers) == 1
    (cached,) = L._launchers.values()
    assert launched == [cached, cached]
    other_gpu = [FakeCupyArray((1, 2, 64, 64), device=1) for _ in range(3)]
    L.attention_plain(*other_gpu, False)  # another device: another launcher
    assert len(built) == 2 and len(L._plain_launchers) == 2
    # a torch q with CuPy k and v: no plain key, the full path
    L.attention_plain(torch.zeros(1, 2, 64, 64, dtype=torch.bfloat16), k, v, False)
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

    assert L._stream_handle(7) == 7
    assert L._stream_handle(TorchLike()) == 0x1234
    assert L._stream_handle(CupyLike(0x99)) == 0x99 and L._stream_handle(CupyLike(5)) == 5
    assert L._handle_attributes[TorchLike] == "cuda_stream"
    assert L._handle_attributes[CupyLike] == "ptr"
    with pytest.raises(ValueError, match="stream must be a raw CUDA stream handle"):
        L._stream_handle("the default stream")


def test_a_hit_on_a_launcher_ready_for_it_takes_launch_plain(stand_ins):
    """Once a launcher is `plain_ready` (prepared, one GPU, torch, one kernel, no LSE), a hit
    goes to its `launch_plain`, not through `_launch_call`."""
    built, launched, full = stand_ins
    q = torch.zeros(1, 2, 64, 64, dtype=torch.bfloat16)
    L.attention_plain(q, q, q, False)
    (cached,) = L._launchers.values()
    fast = []
    cached.plain_ready = True
    cached.launch_plain = lambda q, k, v: fast.append((q, k, v)) or "out"
    assert L.attention_plain(q, q, q, False) == "out"
    assert launched == [cached] and len(fast) == 1 and len(full) == 1


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
    launcher._lse_argument = L._Described(None, {"data": (0xABC00, False)})  # the stand-in
    launcher._addresses = L._address_reader(library)
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
    table built and outside a capture; otherwise it hands the call to `_launch_call` (which
    makes a stream's own copy, waits for the table, keeps a captured launcher), and notes
    nothing itself."""
    whole = []
    monkeypatch.setattr(L, "_launch_call", lambda *args: whole.append(args) or "whole")
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
    monkeypatch.setattr(L, "_launch_call", lambda *args: pytest.fail("went the whole way"))
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
    monkeypatch.setattr(L, "_launch_call", lambda *args: pytest.fail("went the whole way"))
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
