"""A Plan users hold, on the GPU: `wavefront.plan(q, k, v, ...)` is the Plan the public call
caches, and `plan.run` gives what `wavefront.attention` gives, bit for bit, and what a float32
reference gives; the torch op is `Plan.run` behind torch's dispatcher. Outputs poisoned with
NaN first; fresh random inputs."""
import pytest

pytestmark = pytest.mark.gpu
torch = pytest.importorskip("torch")

from wavefront.results.measurement import CORRECTNESS_TOLERANCE as TOLERANCE  # noqa: E402


def _inputs(seed, batch=2, heads=4, kv_heads=2, seqlen=700, head_dim=64):
    g = torch.Generator(device="cuda").manual_seed(seed)
    return tuple(torch.randn(batch, h, seqlen, head_dim, device="cuda", dtype=torch.bfloat16,
                             generator=g) for h in (heads, kv_heads, kv_heads))


def _reference(q, k, v, causal, scale=None):
    rep = q.shape[1] // k.shape[1]
    k, v = (x.float().repeat_interleave(rep, dim=1) for x in (k, v))
    return torch.nn.functional.scaled_dot_product_attention(q.float(), k, v, is_causal=causal,
                                                            scale=scale)


def _error(out, ref):
    assert torch.isfinite(out).all(), "output elements left unwritten"
    return float((out.float() - ref).norm() / ref.norm())


def _bits(x):
    return x.view(torch.int16)


@pytest.mark.parametrize("options", [{"causal": False}, {"causal": True},
                                     {"causal": True, "schedule": "persistent+sawtooth"},
                                     {"causal": False, "schedule": "persistent+tiled",
                                      "chunk_tiles": 2}])
def test_plan_run_is_the_public_call_bit_for_bit(options):
    import wavefront
    from wavefront.kernel import call
    call.clear_launcher_cache()
    q, k, v = _inputs(1)
    plan = wavefront.plan(q, k, v, **options)
    assert plan.launcher is not None and plan in call._plans.values()  # the cached Plan
    ref = _reference(q, k, v, options["causal"])
    for _ in range(3):  # the launcher's first launches, then (later) prepared ones alike
        mine = torch.full_like(q, float("nan"))
        theirs = torch.full_like(q, float("nan"))
        plan.run(q, k, v, out=mine)
        wavefront.attention(q, k, v, out=theirs, **options)
        torch.cuda.synchronize()
        assert _error(mine, ref) < TOLERANCE
        assert torch.equal(_bits(mine), _bits(theirs))
    assert len(call._plans) == 1  # attention found the Plan that plan() made


def test_plan_run_on_a_stream_with_the_lse_and_other_strides():
    import wavefront
    q, k, v = _inputs(2, seqlen=513)
    plan = wavefront.plan(q, k, v, causal=True, return_lse=True)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    out, lse = plan.run(q, k, v, stream=side)
    side.synchronize()
    ref = _reference(q, k, v, True)
    assert _error(out, ref) < TOLERANCE and torch.isfinite(lse).all()
    same_out, same_lse = wavefront.attention(q, k, v, causal=True, return_lse=True)
    torch.cuda.synchronize()
    assert torch.equal(_bits(out), _bits(same_out)) and torch.equal(lse, same_lse)
    # q with its heads and sequence transposed in memory: other strides, the same shape
    strided = q.transpose(1, 2).contiguous().transpose(1, 2)
    other, _ = plan.run(strided, k, v)
    torch.cuda.synchronize()
    assert _error(other, ref) < TOLERANCE


def test_plan_run_refuses_arrays_of_another_problem_by_name():
    import wavefront
    q, k, v = _inputs(3)
    plan = wavefront.plan(q, k, v)
    shorter = _inputs(4, seqlen=600)
    with pytest.raises(ValueError, match="q shape must be this Plan's"):
        plan.run(*shorter)
    with pytest.raises(ValueError, match="q dtype must be this Plan's"):
        plan.run(q.half(), k.half(), v.half())
    with pytest.raises(ValueError, match="k shape must be this Plan's"):
        plan.run(q, k[:, :, :500], v[:, :, :500])


def test_the_torch_op_is_plan_run():
    import wavefront
    import wavefront.torch  # noqa: F401  (registers torch.ops.wavefront.attention)
    q, k, v = _inputs(5)
    plan = wavefront.plan(q, k, v, causal=True, scale=0.1)
    ours = plan.run(q, k, v)
    op = torch.ops.wavefront.attention(q, k, v, True, 0.1, None, None)
    torch.cuda.synchronize()
    assert torch.equal(_bits(ours), _bits(op))
    assert _error(op, _reference(q, k, v, True, scale=0.1)) < TOLERANCE


def test_a_bound_plan_prints_its_binary_and_the_models_prediction():
    import wavefront
    q, k, v = _inputs(6)
    plan = wavefront.plan(q, k, v)
    text = str(plan)
    assert "work table of" in text and f"cuda:{q.device.index}" in text
    assert f"{plan.predicted_dram_bytes / 1e6:,.1f} MB" in text and "bound>" in repr(plan)
