"""The backward's PyTorch ops on the CPU: their fake implementations' shapes, and the joint
forward-backward graph torch traces through them (meta tensors: no GPU), with the autograd
formulas calling `wavefront::attention_bwd`."""
import pytest

torch = pytest.importorskip("torch")

from torch.fx.experimental.proxy_tensor import make_fx  # noqa: E402

import wavefront.torch as wft  # noqa: E402


def _meta(*shape, dtype=torch.bfloat16):
    return torch.empty(*shape, dtype=dtype, device="meta")


def _ops(graph) -> list[str]:
    return [str(n.target) for n in graph.graph.nodes
            if n.op == "call_function" and "wavefront" in str(n.target)]


def test_fake_shapes():
    from torch._subclasses.fake_tensor import FakeTensorMode
    with FakeTensorMode():
        q, k = _meta(2, 8, 100, 64), _meta(2, 2, 130, 64)
        out, lse = torch.ops.wavefront.attention_fwd_lse(q, k, k, True, None, None, None)
        assert out.shape == q.shape and out.dtype == q.dtype
        assert lse.shape == (2, 8, 100) and lse.dtype == torch.float32
        dq, dk, dv = torch.ops.wavefront.attention_bwd(out, q, k, k, out, lse, True, None, False)
        assert (dq.shape, dk.shape, dv.shape) == (q.shape, k.shape, k.shape)
        assert dq.dtype == dk.dtype == dv.dtype == q.dtype


@pytest.mark.parametrize("entry", ["sdpa", "op"])
def test_the_joint_graph_runs_the_backward_op(entry):
    """Gradients of q, k, v traced (make_fx, fake tensors): the SDPA-shaped entry runs the
    forward that keeps its LSE and hands it to the backward op; the plain op recomputes it."""
    def step(q, k, v, do):
        q, k, v = (x.detach().requires_grad_() for x in (q, k, v))
        if entry == "sdpa":
            out = wft.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        else:
            out = torch.ops.wavefront.attention(q, k, v, True, 0.1, None, None)
        return torch.autograd.grad(out, (q, k, v), do)
    args = (_meta(2, 4, 100, 64), _meta(2, 2, 100, 64), _meta(2, 2, 100, 64),
            _meta(2, 4, 100, 64))
    graph = make_fx(step, tracing_mode="fake")(*args)
    ops = _ops(graph)
    if entry == "sdpa":
        assert ops == ["wavefront.attention_fwd_lse.default", "wavefront.attention_bwd.default"]
    else:
        assert ops == ["wavefront.attention.default", "wavefront.attention_fwd_lse.default",
                       "wavefront.attention_bwd.default"]
    bwd = next(n for n in graph.graph.nodes if "attention_bwd" in str(n.target))
    assert bwd.args[6] is True  # causal reaches the backward
    shapes = [tuple(n.meta["val"].shape) for n in graph.graph.nodes if n.op == "output"
              for n in n.args[0]]
    assert shapes == [(2, 4, 100, 64), (2, 2, 100, 64), (2, 2, 100, 64)]


def test_without_grad_the_forward_keeps_no_lse(monkeypatch):
    """Inference (no input requires grad) keeps the op without the LSE, as traced under
    torch.compile (`is_compiling`: the eager call skips the op's dispatch)."""
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)

    def step(q):
        return wft.scaled_dot_product_attention(q, q, q)
    assert _ops(make_fx(step, tracing_mode="fake")(_meta(1, 2, 64, 64))) == [
        "wavefront.attention.default"]


def test_the_varlen_op_has_a_backward():
    def step(q, k, v, cu, do):
        q, k, v = (x.detach().requires_grad_() for x in (q, k, v))
        out = torch.ops.wavefront.attention_varlen(q, k, v, cu, cu, 64, 64, True, None, None,
                                                   None)
        return torch.autograd.grad(out, (q, k, v), do)
    args = (_meta(100, 4, 64), _meta(100, 2, 64), _meta(100, 2, 64),
            _meta(3, dtype=torch.int32), _meta(100, 4, 64))
    graph = make_fx(step, tracing_mode="fake")(*args)
    assert _ops(graph) == ["wavefront.attention_varlen.default",
                           "wavefront.attention_varlen_bwd.default"]


def test_packed_sequences_of_the_transformers_hook_carry_gradients():
    """A padded batch's `SequencesMask` runs the varlen op when its inputs require grad, so
    the projections before it get gradients (a direct call's output would carry none)."""
    def step(q, k, v, cu, do):
        q, k, v = (x.detach().requires_grad_() for x in (q, k, v))
        out = wft.SequencesMask(cu, 2, 50).run(q, k, v, None)
        return torch.autograd.grad(out, (q, k, v), do)
    args = (_meta(2, 4, 50, 64), _meta(2, 2, 50, 64), _meta(2, 2, 50, 64),
            _meta(3, dtype=torch.int32), _meta(2, 50, 4, 64))
    graph = make_fx(step, tracing_mode="fake")(*args)
    assert _ops(graph) == ["wavefront.attention_varlen.default",
                           "wavefront.attention_varlen_bwd.default"]


@pytest.mark.parametrize("entry", ["op", "op_lse"])
@pytest.mark.parametrize("seqlens", [(60, 100), (100, 60)])
def test_a_bottom_right_mask_trains_with_its_alignment(entry, seqlens):
    """A bottom-right causal mask with S_q != S_kv (once refused for training) is
    differentiated with its own alignment: the joint graph's forward (which keeps the LSE)
    and backward ops both carry "bottom_right"."""
    sq, skv = seqlens

    def step(q, k, v, do):
        q, k, v = (x.detach().requires_grad_() for x in (q, k, v))
        if entry == "op":
            out = torch.ops.wavefront.attention(q, k, v, True, None, None, None, "bottom_right")
        else:
            out = wft._attention(q, k, v, True, None, "bottom_right")
        return torch.autograd.grad(out, (q, k, v), do)
    args = (_meta(2, 4, sq, 64), _meta(2, 2, skv, 64), _meta(2, 2, skv, 64), _meta(2, 4, sq, 64))
    graph = make_fx(step, tracing_mode="fake")(*args)
    nodes = {str(n.target): n for n in graph.graph.nodes if "wavefront" in str(n.target)}
    assert set(nodes) >= {"wavefront.attention_fwd_lse.default",
                          "wavefront.attention_bwd.default"}
    assert nodes["wavefront.attention_fwd_lse.default"].args[7] == "bottom_right"
    assert nodes["wavefront.attention_bwd.default"].args[9] == "bottom_right"
    shapes = [tuple(n.meta["val"].shape) for n in graph.graph.nodes if n.op == "output"
              for n in n.args[0]]
    assert shapes == [(2, 4, sq, 64), (2, 2, skv, 64), (2, 2, skv, 64)]


def test_a_bottom_right_packed_batch_trains_with_its_alignment():
    def step(q, k, v, cu_q, cu_k, do):
        q, k, v = (x.detach().requires_grad_() for x in (q, k, v))
        out = torch.ops.wavefront.attention_varlen(q, k, v, cu_q, cu_k, 64, 64, True, None,
                                                   None, None, "bottom_right")
        return torch.autograd.grad(out, (q, k, v), do)
    args = (_meta(100, 4, 64), _meta(130, 2, 64), _meta(130, 2, 64),
            _meta(3, dtype=torch.int32), _meta(3, dtype=torch.int32), _meta(100, 4, 64))
    graph = make_fx(step, tracing_mode="fake")(*args)
    bwd = next(n for n in graph.graph.nodes if "attention_varlen_bwd" in str(n.target))
    assert bwd.args[10] == "bottom_right"


def test_the_backward_ops_refuse_a_bad_alignment_by_name():
    from torch._subclasses.fake_tensor import FakeTensorMode
    with FakeTensorMode():
        q, k = _meta(2, 8, 100, 64), _meta(2, 2, 130, 64)
        with pytest.raises(ValueError, match="causal_alignment must be one of"):
            torch.ops.wavefront.attention_fwd_lse(q, k, k, True, None, None, None, "bottom")
        lse = _meta(2, 8, 100, dtype=torch.float32)
        with pytest.raises(ValueError, match="causal_alignment must be one of"):
            torch.ops.wavefront.attention_bwd(q, q, k, k, q, lse, True, None, True, "right")
