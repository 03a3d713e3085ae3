"""Generation through transformers with wavefront (`wavefront.serving`) on a GPU: a small
random-weight Llama generates greedily with DynamicCache and StaticCache, the cached steps
going through `attention_with_kvcache`; with the SDPA path's tokens forced, its own greedy
choice agrees with them at nearly every step; and every attention call of such a generate
equals transformers' SDPA function on the inputs it got (`checked_generate`, which
tests/test_serving_generate.py runs on the CPU with references for the GPU calls). Skips
without transformers or the cache call."""
import pytest

pytestmark = pytest.mark.gpu
torch = pytest.importorskip("torch")


def _llama():
    from transformers import LlamaConfig, LlamaForCausalLM
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=1000, hidden_size=512, intermediate_size=1024,
                         num_hidden_layers=2, num_attention_heads=8, num_key_value_heads=2,
                         head_dim=64, max_position_embeddings=1024, attn_implementation="sdpa")
    return LlamaForCausalLM(config).to(device="cuda", dtype=torch.bfloat16).eval()


def _needs_the_cache_call():
    pytest.importorskip("transformers")
    import wavefront
    if not hasattr(wavefront, "attention_with_kvcache"):
        pytest.skip("no wavefront.attention_with_kvcache in this checkout")


# (StaticCache agreed at 0.625 of the steps on an H200 while the route took a StaticCache's
# mask-less prefill as bottom-right over all its slots: see wavefront.serving)
@pytest.mark.parametrize("cache", ["dynamic", "static"])
def test_a_llama_generates_through_the_cache_call(cache, monkeypatch):
    _needs_the_cache_call()
    import wavefront
    import wavefront.serving as wfs
    calls = []
    real = wavefront.attention_with_kvcache
    monkeypatch.setattr(wavefront, "attention_with_kvcache",
                        lambda *a, **kw: (calls.append(a[0].shape), real(*a, **kw))[1])
    model = _llama()
    ours = _llama()
    ours.set_attn_implementation(wfs.register_with_transformers("wavefront_serving_test"))
    ids = torch.randint(3, 1000, (2, 100), device="cuda",
                        generator=torch.Generator(device="cuda").manual_seed(1))
    kw = dict(max_new_tokens=16, min_new_tokens=16, do_sample=False, pad_token_id=0,
              attention_mask=torch.ones_like(ids))
    if cache == "static":
        kw.update(cache_implementation="static", disable_compile=True)  # eager: the mask checked
    with torch.no_grad():
        reference = model.generate(ids, **kw)[:, 100:]
        out = ours.generate(ids, **kw, return_dict_in_generate=True, output_logits=True,
                            prefix_allowed_tokens_fn=lambda row, so_far:
                            [int(reference[row, len(so_far) - 100])])
    assert torch.equal(out.sequences[:, 100:], reference)
    choice = torch.stack(out.logits).argmax(-1).T
    agreement = float((choice == reference).float().mean())
    assert agreement >= 0.9, agreement
    # every step after the prefill (and, with a static cache, the prefill too) went through
    # the cache call, one call per layer
    steps = 15 if cache == "dynamic" else 16
    assert len(calls) == 2 * steps, len(calls)
    assert all(shape[1] == 1 for shape in calls[-2 * 15:])


@pytest.mark.parametrize("cache", ["dynamic", "static"])
def test_every_attention_call_of_a_generate_equals_sdpas_on_its_inputs(cache):
    _needs_the_cache_call()
    from test_serving_generate import checked_generate, expected_routes

    from wavefront.results.measurement import CORRECTNESS_TOLERANCE
    want, got, calls = checked_generate(cache, "cuda", torch.bfloat16)
    assert [c["route"] for c in calls] == expected_routes(cache)
    worst = max(calls, key=lambda c: c["error"])
    assert worst["error"] < CORRECTNESS_TOLERANCE, worst
