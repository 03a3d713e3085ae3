"""Generation through transformers with wavefront's route (`wavefront.serving`) on the CPU: the
small random Llama of tests/test_gpu_serving.py (head_dim 64, 8 heads, 2 KV heads) generates
greedily with a DynamicCache and a StaticCache, the GPU calls replaced by float32 references of
their semantics (`fake_cache_call`); every attention call's output is compared with
transformers' own SDPA function on the same query, key, value and mask, and the tokens with
the SDPA model's; and the attention hook alone (`wavefront.torch`) at a StaticCache's
prefill. Skips without transformers (CI has none). `checked_generate` also serves the
GPU test, which runs the real calls (tests/test_gpu_serving.py)."""
import pytest

from test_serving_experiments import _causal_cache_attention, fake_cache_call  # noqa: F401

PROMPT, NEW = 100, 16


def llama(device, dtype):
    """The random Llama (seeded: two calls give the same weights)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=1000, hidden_size=512, intermediate_size=1024,
                         num_hidden_layers=2, num_attention_heads=8, num_key_value_heads=2,
                         head_dim=64, max_position_embeddings=1024, attn_implementation="sdpa")
    return LlamaForCausalLM(config).to(device=device, dtype=dtype).eval()


def generate_kwargs(cache, ids):
    kw = dict(max_new_tokens=NEW, min_new_tokens=NEW, do_sample=False, pad_token_id=0,
              attention_mask=__import__("torch").ones_like(ids))
    if cache == "static":
        kw.update(cache_implementation="static", disable_compile=True)  # eager: mask checked
    return kw


def checked_attention(calls: list):
    """An attention function for transformers' registry: the serving hook, each call noted in
    `calls` with its route, shapes and the relative error of its output against
    transformers' SDPA function on the very inputs it got."""
    import torch
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    import wavefront.serving as wfs

    def checked(module, query, key, value, attention_mask, scaling=None, dropout=0.0,
                **kwargs):
        decision = wfs.route(query.shape, key.shape, attention_mask)
        out, _ = wfs.hf_cache_attention_forward(module, query, key, value, attention_mask,
                                                scaling, dropout, **kwargs)
        want, _ = sdpa_attention_forward(module, query, key, value, attention_mask,
                                         scaling=scaling, dropout=dropout, **kwargs)
        error = torch.linalg.norm(out.float() - want.float()) / torch.linalg.norm(want.float())
        calls.append({"route": (decision.kind, decision.lengths), "s_q": query.shape[2],
                      "s_kv": key.shape[2], "mask": attention_mask is not None,
                      "error": float(error)})
        return out, None
    return checked


def checked_generate(cache, device, dtype):
    """The SDPA model's greedy tokens, ours (free-running: nothing forced), and one record per
    attention call of ours (`checked_attention`)."""
    import torch

    import wavefront.torch as wft
    calls = []
    name = wft.register_with_transformers("wavefront_checked", forward=checked_attention(calls))
    reference, ours = llama(device, dtype), llama(device, dtype)
    ours.set_attn_implementation(name)
    ids = torch.randint(3, 1000, (2, PROMPT), generator=torch.Generator().manual_seed(1))
    ids = ids.to(device)
    kw = generate_kwargs(cache, ids)
    with torch.no_grad():
        want = reference.generate(ids, **kw)[:, PROMPT:]
        got = ours.generate(ids, **kw)[:, PROMPT:]
    return want, got, calls


def expected_routes(cache, layers=2):
    """Where each call of the generate goes: a DynamicCache's prefill to the attention call,
    its steps (no mask) to the cache call with every key; a StaticCache's prefill (no mask:
    torch's top-left is_causal over its empty slots) to the cache call with the first S_q
    keys, its steps with the lengths of the mask."""
    prefill, step = ((("prefill", None), ("cache", "key")) if cache == "dynamic"
                     else (("cache", "query"), ("cache", "mask")))
    return [prefill] * layers + [step] * layers * (NEW - 1)


def _attention_on_the_cpu(q, k, v, causal, scale, causal_alignment="top_left"):
    """The attention call (B, H, S, D) on the CPU for a decoder (causal): the cache call's
    reference with the key's length (bottom-right) or the query's (top-left)."""
    import torch
    assert causal, "the Llama's prefill is causal"
    lengths = k.shape[2] if causal_alignment == "bottom_right" else q.shape[2]
    out = _causal_cache_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                  torch.full((q.shape[0],), lengths), True, scale)
    return out.transpose(1, 2)


@pytest.mark.parametrize("cache", ["dynamic", "static"])
def test_every_attention_call_of_a_generate_equals_sdpas_on_its_inputs(cache, fake_cache_call,
                                                                       monkeypatch):
    pytest.importorskip("transformers")
    torch, wfs, fake, fake_calls = fake_cache_call
    import wavefront.torch as wft
    monkeypatch.setattr(wft, "_attention", _attention_on_the_cpu)
    want, got, calls = checked_generate(cache, "cpu", torch.float32)
    worst = max(calls, key=lambda c: c["error"])
    assert worst["error"] < 1e-5, worst
    assert torch.equal(got, want)
    assert [c["route"] for c in calls] == expected_routes(cache)
    if cache == "static":
        assert calls[0]["s_q"] == PROMPT and calls[0]["s_kv"] == PROMPT + NEW - 1
        assert not calls[0]["mask"]  # transformers skipped it: SDPA runs is_causal, top-left
        assert fake_calls[0]["cache_seqlens"] == [PROMPT, PROMPT]


@pytest.mark.parametrize("cache", ["dynamic", "static"])
def test_a_prefill_in_chunks_then_a_step_equal_sdpas_on_their_inputs(cache, fake_cache_call,
                                                                     monkeypatch):
    """A prompt in two chunks (the second against the cache the first filled: transformers
    builds its mask) and one step: every call and the logits as SDPA's."""
    pytest.importorskip("transformers")
    torch, wfs, fake, fake_calls = fake_cache_call
    from transformers import DynamicCache, StaticCache

    import wavefront.torch as wft
    monkeypatch.setattr(wft, "_attention", _attention_on_the_cpu)
    calls = []
    name = wft.register_with_transformers("wavefront_chunks", forward=checked_attention(calls))
    reference, ours = llama("cpu", torch.float32), llama("cpu", torch.float32)
    ours.set_attn_implementation(name)
    ids = torch.randint(3, 1000, (2, PROMPT + 1), generator=torch.Generator().manual_seed(2))
    logits = []
    with torch.no_grad():
        for model in (reference, ours):
            kv = (DynamicCache(config=model.config) if cache == "dynamic"
                  else StaticCache(config=model.config, max_cache_len=PROMPT + NEW))
            logits.append(torch.cat([model(ids[:, first:last], past_key_values=kv,
                                           attention_mask=torch.ones_like(ids[:, :last])).logits
                                     for first, last in ((0, 40), (40, PROMPT),
                                                         (PROMPT, PROMPT + 1))], dim=1))
    assert [c["route"][1] for c in calls] == (
        [None, None, "mask", "mask", "key", "key"] if cache == "dynamic"
        else ["query", "query", "mask", "mask", "mask", "mask"])
    assert max(c["error"] for c in calls) < 1e-5, calls
    want, got = logits
    assert float(torch.linalg.norm(got - want) / torch.linalg.norm(want)) < 1e-5


def test_the_attention_hook_alone_runs_a_static_caches_prefill_as_sdpa(monkeypatch):
    """`wavefront.torch`'s hook without the serving route, at the prefill of an empty
    StaticCache (no mask: transformers' SDPA function runs torch's top-left is_causal over
    the cache's slots): the logits are SDPA's."""
    pytest.importorskip("transformers")
    import torch
    from transformers import StaticCache

    import wavefront.torch as wft
    monkeypatch.setattr(wft, "_attention", _attention_on_the_cpu)
    reference, ours = llama("cpu", torch.float32), llama("cpu", torch.float32)
    ours.set_attn_implementation(wft.register_with_transformers("wavefront_hook_alone"))
    ids = torch.randint(3, 1000, (2, PROMPT), generator=torch.Generator().manual_seed(1))
    logits = []
    with torch.no_grad():
        for model in (reference, ours):
            cache = StaticCache(config=model.config, max_cache_len=PROMPT + NEW)
            logits.append(model(ids, attention_mask=torch.ones_like(ids),
                                past_key_values=cache).logits)
    want, got = logits
    assert float(torch.linalg.norm(got - want) / torch.linalg.norm(want)) < 1e-5
