"""The public call's structure, on the CPU: no import circle in the package, the options as one
`CallOptions` derived from the kernel levers, and a `Plan` of shapes (for the model) that
prints what it runs and refuses to run; bad arguments to `wavefront.plan` name themselves."""
import re

import pytest

import wavefront
from wavefront.kernel.plan import CALL_OPTIONS, PLAIN_OPTIONS, CallOptions, Plan
from wavefront.point import LEVERS

SHAPE = (1, 32, 8192, 128)
H100_TABLE_NAME = "NVIDIA H100 80GB HBM3"  # the committed table's H100


def import_circles(package: str = "wavefront") -> list[list[str]]:
    """The package's import circles (strongly connected sets of two or more modules, imports
    inside functions included), found by grimp, import-linter's graph."""
    grimp = pytest.importorskip("grimp")
    graph = grimp.build_graph(package, cache_dir=None)
    edges = {m: sorted(n for n in graph.find_modules_directly_imported_by(m)
                       if n in graph.modules) for m in sorted(graph.modules)}
    index, low, stack, on_stack, circles = {}, {}, [], set(), []

    def visit(module):  # Tarjan's strongly connected components
        index[module] = low[module] = len(index)
        stack.append(module)
        on_stack.add(module)
        for other in edges[module]:
            if other not in index:
                visit(other)
                low[module] = min(low[module], low[other])
            elif other in on_stack:
                low[module] = min(low[module], index[other])
        if low[module] == index[module]:
            component = []
            while True:
                other = stack.pop()
                on_stack.discard(other)
                component.append(other)
                if other == module:
                    break
            if len(component) > 1:
                circles.append(sorted(component))
    for module in edges:
        if module not in index:
            visit(module)
    return circles


def test_the_package_has_no_import_circle():
    """The public call once sat in a circle (launcher <-> carry_over <-> torch_arrays, tied by
    imports inside functions): every module's imports now only go down."""
    assert import_circles() == []


def test_the_bound_launcher_knows_nothing_above_it():
    """launcher.py keeps the bound launcher: it imports the arrays' rules and the streams, not
    the cache, the configuration choice, the Plan or packed batches."""
    grimp = pytest.importorskip("grimp")
    graph = grimp.build_graph("wavefront", cache_dir=None)
    below = graph.find_upstream_modules("wavefront.kernel.launcher")  # what it imports
    assert "wavefront.kernel.arrays" in below and "wavefront.kernel.streams" in below
    for above in ("call", "varlen", "tuning", "plan", "carry_over"):
        assert f"wavefront.kernel.{above}" not in below, above


def test_call_options_are_the_public_calls_options_then_every_lever():
    """One field per option of `wavefront.attention` (but the arrays, out and stream), then
    one per kernel lever in `LEVERS`' order, each lever unchosen (None) by default: a lever
    declared in point.py is an option with no edit here."""
    import inspect
    api = inspect.signature(wavefront.api.attention).parameters
    options = [name for name in api if name not in ("q", "k", "v", "out", "stream", "levers")]
    assert list(CALL_OPTIONS) == options + [lever.name for lever in LEVERS]
    default = CallOptions()
    assert all(getattr(default, lever.name) is None for lever in LEVERS)
    assert default.values() == tuple(getattr(default, n) for n in CALL_OPTIONS)
    assert default.chose_nothing() and default.levers() == {}
    chosen = CallOptions(causal=True, tiles="128x128", cluster=2)
    assert chosen.levers() == {"cluster": 2} and not chosen.chose_nothing()
    assert CallOptions(*chosen.values()) == chosen  # the values are the fields, in order
    assert hash(chosen) == hash(CallOptions(causal=True, tiles="128x128", cluster=2))
    assert PLAIN_OPTIONS[True] == CallOptions(causal=True)
    with pytest.raises(Exception):  # frozen
        chosen.causal = False


@pytest.mark.parametrize("lever", LEVERS, ids=lambda lever: lever.name)
def test_each_lever_refuses_a_value_it_does_not_compile_by_name(lever):
    with pytest.raises(ValueError, match=re.escape(lever.name)):
        CallOptions(**{lever.name: 999})


def test_a_plan_of_shapes_prints_what_it_runs_and_what_the_model_predicts():
    """On the CPU: the H100 preset takes the committed table's H100 entry for the shape (what
    the public call would run there), and the print says schedule, tiles, CTAs, work items
    and the lock-step model's DRAM bytes, the same as the model computes them directly."""
    from wavefront.kernel.tuning import tuned_config
    from wavefront.model.fits import predict
    from wavefront.model.presets import gpu_preset
    from wavefront.point import SECTOR_BYTES
    plan = wavefront.plan(SHAPE, SHAPE, gpu="h100")
    assert isinstance(plan, Plan) and plan.launcher is None
    tuned = tuned_config(H100_TABLE_NAME, SHAPE, SHAPE, False)
    assert plan.source == "tuned" and plan.config == tuned
    assert plan.schedule == tuned["schedule"]
    assert plan.tiles == tuned["tiles"]
    h100 = gpu_preset("h100")
    direct = predict(plan.launch, h100, capacity_bytes=h100.l2_bytes / 2, partitions=2)
    assert plan.predicted_dram_bytes == direct.partitioned["dram_read_sectors"] * SECTOR_BYTES
    assert plan.predicted_dram_bytes >= direct.compulsory_read_bytes
    text, short = str(plan), repr(plan)
    for shown in (plan.schedule, plan.tiles, str(plan.ctas),
                  str(plan.work_items), f"{plan.predicted_dram_bytes / 1e6:,.1f} MB"):
        assert shown in text and shown in short, shown
    assert "(tuned)" in text and "H100" in short


def test_a_plan_of_shapes_refuses_to_run():
    plan = wavefront.plan(SHAPE, SHAPE, sms=132, l2_bytes=50 << 20, schedule="grouped+linear")
    assert plan.source == "caller" and plan.schedule == "grouped+linear"
    with pytest.raises(RuntimeError, match="made from shapes, for the model only"):
        plan.run(None, None, None)


def test_the_old_plan_call_is_the_plans_launch():
    """`wavefront.plan(q.shape, k.shape, sms=..., l2_bytes=..., ...)` returned the `Launch`;
    it now returns a Plan whose `.launch` is that Launch."""
    from wavefront.point import plan as point_plan
    old = point_plan(SHAPE, SHAPE, sms=132, l2_bytes=50 << 20, schedule="grouped+sawtooth",
                     causal=True)
    new = wavefront.plan(SHAPE, SHAPE, sms=132, l2_bytes=50 << 20, schedule="grouped+sawtooth",
                         causal=True).launch
    assert new == old
    assert (new.work_table == old.work_table).all()


def test_a_gpu_without_tuned_entries_plans_the_defaults():
    plan = wavefront.plan((1, 8, 1024, 64), (1, 8, 1024, 64), gpu="gb10")
    assert plan.source == "defaults" and plan.schedule == "persistent+linear"
    assert plan.gpu.sms == 48


@pytest.mark.parametrize("arguments, error, named", [
    ({"schedule": "zigzag+linear"}, ValueError, "cta schedule"),
    ({"schedule": "persistent+"}, ValueError, "schedule"),
    ({"tiles": "100x64"}, ValueError, "tiles"),
    ({"occupancy": 0}, ValueError, "occupancy"),
    ({"scale": -1.0}, ValueError, "scale"),
    ({"scale": float("nan")}, ValueError, "scale"),
    ({"causal": 1}, ValueError, "causal"),
    ({"return_lse": "yes"}, ValueError, "return_lse"),
    ({"ctas": 0}, ValueError, "ctas"),
    ({"chunk_tiles": -2}, ValueError, "chunk_tiles"),
    ({"l2_bytes": 1.5}, ValueError, "l2_bytes"),
    ({"cluster": 3}, ValueError, "cluster"),
    ({"warps": 8}, TypeError, "unknown kernel levers"),
    ({"gpu": "a100"}, ValueError, "gpu must be one of"),
    ({"gpu": 3}, ValueError, "gpu must be a preset name"),
    ({"gpu": None, "sms": 132}, ValueError, "sms and l2_bytes"),
    ({"dtype": "float32"}, ValueError, "dtype"),
    ({"stream": 7}, ValueError, "stream"),
])
def test_bad_arguments_to_plan_name_themselves(arguments, error, named):
    arguments = {"gpu": "h100", **arguments}
    with pytest.raises(error, match=re.escape(named)):
        wavefront.plan(SHAPE, SHAPE, **arguments)


def test_bad_shapes_and_arrays_to_plan_name_themselves():
    with pytest.raises(ValueError, match="q_shape must be 4 sizes"):
        wavefront.plan((1, 32, 128), SHAPE, gpu="h100")
    with pytest.raises(ValueError, match="k_shape must have q's batch"):
        wavefront.plan(SHAPE, (2, 32, 8192, 128), gpu="h100")
    with pytest.raises(ValueError, match="v must be k's shape"):
        wavefront.plan(SHAPE, SHAPE, (1, 32, 4096, 128), gpu="h100")
    with pytest.raises(ValueError, match="k must be a shape"):
        wavefront.plan(SHAPE, object(), gpu="h100")
    with pytest.raises(ValueError, match="gpu applies to a Plan of shapes"):
        wavefront.plan(object(), object(), object(), gpu="h100")
    with pytest.raises(ValueError, match="v must be given"):
        wavefront.plan(object(), object())


def test_without_a_gpu_a_plan_of_shapes_asks_for_one(monkeypatch):
    import wavefront.device
    monkeypatch.setattr(wavefront.device, "current_device", lambda: None)
    with pytest.raises(ValueError, match="gpu must name a preset"):
        wavefront.plan(SHAPE, SHAPE)


def test_a_big_launch_is_not_simulated_just_to_print(monkeypatch):
    """Printing a Plan whose launch would take the model long says how to ask for it."""
    import wavefront.kernel.plan as plan_module
    monkeypatch.setattr(plan_module, "PRINT_PREDICTION_ACCESSES", 10)
    plan = wavefront.plan(SHAPE, SHAPE, gpu="h100")
    assert "call plan.prediction()" in repr(plan) and plan._prediction is None


class _RecordingLauncher:
    """What `Plan.run` hands a launch to, recorded (no GPU)."""

    plain_ready = True

    def __init__(self, view):
        self.view, self.calls = view, []

    def launch_plain(self, q, k, v):
        self.calls.append(("plain", q))
        return "out"

    def launch_call(self, q, k, v, out=None, stream=None, vouched=True):
        self.calls.append(("call", q, out, stream, vouched))
        return "out"


def test_plan_run_vouches_only_for_the_arrays_it_was_made_from(monkeypatch):
    """`Plan.run` with q, k, v laid out as those the Plan was made from launches as the public
    call does (the plain call's one frame where nothing else is asked); q of other strides is
    checked against the Plan and launched unvouched (the launcher checks its layout); another
    shape is refused by name. CPU tensors and a recording launcher: only metadata is read."""
    torch = pytest.importorskip("torch")
    import wavefront.kernel.plan as plan_module
    from wavefront.kernel.arrays import _ArrayView, _call_key
    q = torch.zeros(1, 4, 64, 64, dtype=torch.bfloat16)
    k = torch.zeros(1, 2, 64, 64, dtype=torch.bfloat16)

    def view(x):
        return _ArrayView("torch", tuple(x.shape), "bfloat16", 0, tuple(x.stride()))
    monkeypatch.setattr(plan_module, "_check_inputs",
                        lambda q, k, v: (view(q), (q, k, v)))  # CPU tensors as if on the GPU
    base = wavefront.plan(tuple(q.shape), tuple(k.shape), gpu="h100")
    launcher = _RecordingLauncher(view(q))
    plan = Plan(base.launch, base.config, base.source, base.options, base.gpu, "bfloat16",
                tuple(k.shape), launcher, _call_key(q, k, k, ()))
    plan.run(q, k, k)
    plan.run(q, k, k, out="mine", stream=7)
    strided = q.transpose(1, 2).contiguous().transpose(1, 2)
    plan.run(strided, k, k)
    assert launcher.calls == [("plain", q), ("call", q, "mine", 7, True),
                              ("call", strided, None, None, False)]
    with pytest.raises(ValueError, match=re.escape("q shape must be this Plan's")):
        plan.run(q[:, :, :32], k, k)
    with pytest.raises(ValueError, match=re.escape("k shape must be this Plan's")):
        plan.run(q, k[:, :1], k[:, :1])
