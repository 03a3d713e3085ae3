"""End to end: prefill through a Llama-architecture model that nobody in this project wrote.

With Hugging Face transformers: `LlamaForCausalLM` built from a config with random weights
(nothing downloaded), its attention routed to wavefront through transformers' attention
registry (`wavefront.torch.register_with_transformers`), against the same model on its SDPA
path. Where transformers is missing, a Llama-style block stack in plain torch (RMSNorm, rotary
embeddings, grouped-query attention, SwiGLU) stands in, with the attention function swapped;
the result says which ran.

Reported: the largest logit difference and the relative error of the logits between the two
paths, how often their next-token choice agrees, and prefill tokens/s of each, timed in
interleaved rounds (`measure.rounds`).
"""
from __future__ import annotations

from dataclasses import asdict, dataclass


@dataclass(frozen=True)
class ModelShape:
    layers: int = 8
    hidden: int = 2048
    heads: int = 16
    kv_heads: int = 4
    intermediate: int = 5632
    vocab: int = 32000

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads


def _transformers_llama(shape: ModelShape, max_positions: int, seed: int, ours):
    import torch
    import transformers
    from transformers import LlamaConfig, LlamaForCausalLM
    calls = [0]

    def counted(*args, **kwargs):  # proof that the model's attention really came to us
        calls[0] += 1
        return ours.hf_attention_forward(*args, **kwargs)
    name = ours.register_with_transformers(forward=counted)
    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=shape.vocab, hidden_size=shape.hidden,
                         intermediate_size=shape.intermediate,
                         num_hidden_layers=shape.layers, num_attention_heads=shape.heads,
                         num_key_value_heads=shape.kv_heads,
                         max_position_embeddings=max_positions, attn_implementation="sdpa")
    model = LlamaForCausalLM(config).to(device="cuda", dtype=torch.bfloat16).eval()
    names = {"wavefront": name, "sdpa": "sdpa", "eager": "eager"}
    for implementation in names.values():  # validated once by transformers itself
        if hasattr(model, "set_attn_implementation"):
            model.set_attn_implementation(implementation)

    def run(ids, implementation):
        # Every attention module reads the shared config's choice on each call: switching it
        # costs nothing, where set_attn_implementation walks the model.
        model.config._attn_implementation = names[implementation]
        before = calls[0]
        logits = model(input_ids=ids, use_cache=False).logits
        routed = calls[0] - before
        if routed != (shape.layers if implementation == "wavefront" else 0):
            raise RuntimeError(f"{implementation}: {routed} attention calls came to wavefront "
                               f"in a {shape.layers}-layer forward")
        return logits
    return run, f"transformers {transformers.__version__} LlamaForCausalLM"


class _StandInBlock:
    """One Llama-style decoder block in plain torch: RMSNorm, rotary embeddings, GQA, SwiGLU."""

    def __init__(self, shape: ModelShape, gen):
        import torch
        d, kvd = shape.hidden, shape.kv_heads * shape.head_dim

        def w(*size):
            return (torch.randn(*size, device="cuda", generator=gen) / size[-1] ** 0.5).to(
                torch.bfloat16)
        self.shape = shape
        self.wq, self.wk, self.wv, self.wo = w(d, d), w(kvd, d), w(kvd, d), w(d, d)
        self.w1, self.w3 = w(shape.intermediate, d), w(shape.intermediate, d)
        self.w2 = w(d, shape.intermediate)

    def __call__(self, x, cos, sin, attend):
        import torch
        import torch.nn.functional as F
        s, b, n = self.shape, x.shape[0], x.shape[1]

        def norm(t):
            return (t.float() * (t.float().pow(2).mean(-1, keepdim=True) + 1e-6).rsqrt()).to(
                t.dtype)

        def rotate(t):
            half = t.shape[-1] // 2
            rotated = torch.cat((-t[..., half:], t[..., :half]), dim=-1)
            return (t * cos + rotated * sin).to(t.dtype)
        h = norm(x)
        q = F.linear(h, self.wq).view(b, n, s.heads, s.head_dim).transpose(1, 2)
        k = F.linear(h, self.wk).view(b, n, s.kv_heads, s.head_dim).transpose(1, 2)
        v = F.linear(h, self.wv).view(b, n, s.kv_heads, s.head_dim).transpose(1, 2)
        q, k = rotate(q).contiguous(), rotate(k).contiguous()
        y = attend(q, k, v.contiguous()).transpose(1, 2).reshape(b, n, -1)
        x = x + F.linear(y, self.wo)
        h = norm(x)
        return x + F.linear(F.silu(F.linear(h, self.w1)) * F.linear(h, self.w3), self.w2)


def _stand_in_llama(shape: ModelShape, max_positions: int, seed: int, ours):
    import torch
    import torch.nn.functional as F
    gen = torch.Generator(device="cuda").manual_seed(seed)
    embed = torch.randn(shape.vocab, shape.hidden, device="cuda", generator=gen).to(
        torch.bfloat16)
    blocks = [_StandInBlock(shape, gen) for _ in range(shape.layers)]
    attend = {
        "wavefront": lambda q, k, v: ours.scaled_dot_product_attention(
            q, k, v, is_causal=True, enable_gqa=True),
        "sdpa": lambda q, k, v: F.scaled_dot_product_attention(
            q, k, v, is_causal=True, enable_gqa=True)}

    def run(ids, implementation):
        n = ids.shape[1]
        pos = torch.arange(n, device="cuda", dtype=torch.float32)
        inv = 10000.0 ** (-torch.arange(0, shape.head_dim, 2, device="cuda") / shape.head_dim)
        angles = torch.cat([pos[:, None] * inv[None, :]] * 2, dim=-1)
        cos, sin = angles.cos(), angles.sin()
        x = embed[ids]
        for block in blocks:
            x = block(x, cos, sin, attend[implementation])
        return F.linear(x, embed)
    return run, "plain-torch Llama-style stand-in (transformers not installed)"


def build(shape: ModelShape, max_positions: int, ours, seed: int = 0,
          prefer_transformers=True):
    """-> (run(ids, "wavefront" | "sdpa") -> logits, description of what ran). `ours`: the
    `wavefront.torch` module (the layer above passes it in)."""
    if prefer_transformers:
        try:
            import transformers  # noqa: F401
        except ImportError:
            prefer_transformers = False
    if prefer_transformers:
        return _transformers_llama(shape, max_positions, seed, ours)
    return _stand_in_llama(shape, max_positions, seed, ours)


def compare(shape: ModelShape, batch: int, seqlen: int, ours, *, rounds: int = 8,
            seed: int = 0, prefer_transformers: bool = True) -> dict:
    """Logits of both paths on the same random token ids, then prefill timed in rounds."""
    import torch

    run, what = build(shape, seqlen, ours, seed, prefer_transformers)
    ids = torch.randint(0, shape.vocab, (batch, seqlen), device="cuda",
                        generator=torch.Generator(device="cuda").manual_seed(seed + 1))
    with torch.inference_mode():
        theirs = run(ids, "sdpa").float()
        mine = run(ids, "wavefront").float()
        diff = (mine - theirs).abs()
        result = {
            "model": what, "shape": asdict(shape), "batch": batch, "seqlen": seqlen,
            "max_abs_logit_diff": float(diff.max()),
            "max_abs_logit": float(theirs.abs().max()),
            "logits_rel_error": float((mine - theirs).norm() / theirs.norm()),
            "next_token_agreement": float((mine.argmax(-1) == theirs.argmax(-1)).float().mean()),
        }
        del mine, diff
        if "transformers" in what and seqlen <= 8192:
            # The yardstick: two bfloat16 attention paths of transformers' own (eager, SDPA)
            # differ this much too.
            eager = run(ids, "eager").float()
            result["eager_vs_sdpa_rel_error"] = float((eager - theirs).norm() / theirs.norm())
            result["eager_vs_sdpa_max_abs_diff"] = float((eager - theirs).abs().max())
            result["eager_vs_sdpa_agreement"] = float(
                (eager.argmax(-1) == theirs.argmax(-1)).float().mean())
            del eager
        del theirs
        by = timed_forwards({name: lambda name=name: run(ids, name)
                             for name in ("wavefront", "sdpa")}, rounds, warmup=2)
    for r in by.values():
        result[f"{r.name}_ms"] = r.median_ms
        result[f"{r.name}_ms_ci95"] = r.ci95_ms
        result[f"{r.name}_tokens_per_s"] = batch * seqlen / (r.median_ms * 1e-3)
        result[f"{r.name}_throttled_rounds"] = r.throttled_rounds
    from wavefront.measure.rounds import paired_speedup
    result["speedup_vs_sdpa"], *result["speedup_vs_sdpa_ci95"] = paired_speedup(
        by["sdpa"], by["wavefront"])
    return result


def timed_forwards(forwards: dict, rounds: int, warmup: int = 1) -> dict:
    """GPU time of whole model calls: `forwards` (name -> function of no arguments) one call
    each per round, in interleaved rounds (`measure.rounds.run_rounds`). -> name -> its
    `RoundsResult`."""
    from wavefront.measure.rounds import Contender, run_rounds
    contenders = [Contender(name, lambda i, forward=forward: forward(), 0.0)
                  for name, forward in forwards.items()]
    return {r.name: r for r in run_rounds(contenders, rounds=rounds, per_round=1,
                                          warmup=warmup)}


def errors_and_peaks(cases: list, forward, peak_forward=None) -> tuple[dict, dict]:
    """For each case: the relative error of `forward(case)` against `forward` of the last
    case (the reference), and the GiB its peak allocates (`peak_allocated_gib` of
    `peak_forward(case)`, default `forward(case)`). -> (errors, peak GiB), by case."""
    peak_forward = peak_forward or forward
    reference = forward(cases[-1]).float()
    errors, peak_gib = {}, {}
    for case in cases:
        got = forward(case).float()
        errors[case] = float((got - reference).norm() / reference.norm())
        del got
        peak_gib[case] = peak_allocated_gib(lambda case=case: peak_forward(case))
    return errors, peak_gib


def peak_allocated_gib(run) -> float:
    """GiB of GPU memory `run()` allocates at its peak beyond what was allocated before it
    (torch's caching allocator, the GPU synchronised around it)."""
    import torch
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    run()
    torch.cuda.synchronize()
    return (torch.cuda.max_memory_allocated() - before) / 2**30


def report_cases(sink, timed: dict, base: str, peak_gib: dict, errors: dict, error_of: str,
                 **fields) -> None:
    """Print a line per case of `timed` (`timed_forwards`: median GPU ms [95% interval], speed
    against case `base`, peak GiB, relative error of `error_of`) and write its record to
    `sink` with `fields`."""
    import torch
    gpu = torch.cuda.get_device_name()
    for case, result in timed.items():
        low, high = result.ci95_ms
        print(f"  {case:42s} {result.median_ms:8.2f} [{low:.2f}, {high:.2f}]  "
              f"x{timed[base].median_ms / result.median_ms:.2f} vs {base}  "
              f"peak {peak_gib[case]:5.2f} GiB  {error_of} rel. error {errors[case]:.2e}")
        sink.write({"gpu": gpu, "case": case, "ms": result.samples_ms,
                    "ms_ci95": result.ci95_ms, "throttled_rounds": result.throttled_rounds,
                    "peak_allocated_gib": peak_gib[case],
                    f"{error_of}_rel_error_vs_one_by_one_sdpa": errors[case], **fields})
