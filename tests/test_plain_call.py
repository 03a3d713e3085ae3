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
