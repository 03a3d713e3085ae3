"""A padding-free prefill through transformers' Llama (GPU host with transformers): sequences
packed in one row, position_ids restarting at each (or, with --padded, left padded to the
longest, one row each, as batched prompts are), its attention routed to wavefront (a
packed batch, `attention_varlen`) against transformers' SDPA path on the same row (which needs
the packed mask as a tensor) and against the sequences run one by one on the SDPA path.
On the packed row wavefront runs twice: with its own mask builder (`hf_mask`: the layers get
the sequences' bounds, the mask built and checked in blocks) and with SDPA's (the layers get
the T x T tensor, which the hook checks once a forward).

Medians of interleaved rounds of GPU ms per forward (`measure.rounds`; every token's logits), the
peak GPU memory a forward allocates beyond the model when it keeps only the last token's
logits (torch's allocator: a prefill step as `generate` runs it), and the logits' relative
error against the one-by-one SDPA run.

    python scripts/packed_prefill.py [--sequences 16 --tokens 16384 --rounds 7] [--padded]
                                     [--out DIR]
"""
import argparse
from pathlib import Path

import torch

from wavefront.measure.prefill import errors_and_peaks, report_cases, timed_forwards
from wavefront.measure.sink import JsonlSink
from wavefront.measure.varlen_bench import long_tailed_lengths


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sequences", type=int, default=16)
    parser.add_argument("--tokens", type=int, default=16384)
    parser.add_argument("--rounds", type=int, default=7, help="at least 6")
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--padded", action="store_true",
                        help="lay the sequences in a left-padded batch (one row each, the 2D "
                             "padding mask), not packed in one row")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    import transformers
    from transformers import LlamaConfig, LlamaForCausalLM

    import wavefront.torch as wft
    name = wft.register_with_transformers()
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask
    AttentionInterface.register("wavefront_sdpa_mask", wft.hf_attention_forward)
    AttentionMaskInterface.register("wavefront_sdpa_mask", sdpa_mask)
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=32000, hidden_size=2048, intermediate_size=5632,
                         num_hidden_layers=args.layers, num_attention_heads=16,
                         num_key_value_heads=4, max_position_embeddings=65536,
                         attn_implementation="sdpa")
    model = LlamaForCausalLM(config).to(device="cuda", dtype=torch.bfloat16).eval()
    model.set_attn_implementation(name)
    model.set_attn_implementation("sdpa")
    lengths = long_tailed_lengths(args.sequences, args.tokens, seed=args.sequences)
    g = torch.Generator(device="cuda").manual_seed(1)
    sequences = [torch.randint(0, 32000, (n,), device="cuda", generator=g) for n in lengths]
    ids = torch.cat(sequences)[None]
    position_ids = torch.cat([torch.arange(n, device="cuda") for n in lengths])[None]
    padding = None
    if args.padded:  # left padded, as batched prompts are: each row ends at its last token
        rows = max(lengths)
        padding = torch.zeros(len(lengths), rows, dtype=torch.long, device="cuda")
        padded_ids, padded_positions = torch.zeros_like(padding), torch.zeros_like(padding)
        for b, sequence in enumerate(sequences):
            padding[b, rows - len(sequence):] = 1
            padded_ids[b, rows - len(sequence):] = sequence
            padded_positions[b, rows - len(sequence):] = torch.arange(len(sequence),
                                                                      device="cuda")
        ids, position_ids = padded_ids, padded_positions
    layout = "padded batch" if args.padded else "packed row"

    def forward(case, logits_to_keep=0):
        """The logits of every token (0), or of the last `logits_to_keep` tokens of each model
        call (the packed row's, or each sequence's one by one)."""
        with torch.no_grad():
            if case == "sdpa, one sequence at a time":
                model.config._attn_implementation = "sdpa"
                return torch.cat([model(input_ids=s[None], use_cache=False,
                                        logits_to_keep=logits_to_keep).logits[0]
                                  for s in sequences])
            model.config._attn_implementation = implementations[case]
            logits = model(input_ids=ids, attention_mask=padding, position_ids=position_ids,
                           use_cache=False, logits_to_keep=logits_to_keep).logits
            if padding is None:
                return logits[0]
            return logits[:, -1] if logits_to_keep else logits[padding.bool()]  # real tokens

    implementations = {f"wavefront, {layout}": name,
                       f"sdpa, {layout} (mask tensor)": "sdpa"}
    if not args.padded:  # (the hook runs a mask tensor of one row only)
        implementations["wavefront, packed row, SDPA's mask tensor"] = "wavefront_sdpa_mask"
    cases = [*implementations, "sdpa, one sequence at a time"]
    # Memory as a prefill step takes it (generate keeps the last token's logits): all
    # tokens' logits would take more than the attention and its mask.
    errors, peak_gib = errors_and_peaks(
        cases, forward, peak_forward=lambda case: forward(case, logits_to_keep=1))
    timed = timed_forwards({case: lambda case=case: forward(case) for case in cases},
                           args.rounds)
    print(f"{torch.cuda.get_device_name()}: transformers {transformers.__version__} "
          f"LlamaForCausalLM, {args.layers} layers, hidden 2048, 16/4 heads, bf16; "
          f"{args.sequences} sequences of {args.tokens} tokens, "
          f"{'left padded to the longest' if args.padded else 'packed in one row'} "
          f"(lengths {min(lengths)}-{max(lengths)}); GPU ms per forward, median [95% interval] "
          f"of {args.rounds} interleaved rounds")
    records = f"{'padded' if args.padded else 'packed'}_prefill.jsonl"
    with JsonlSink(args.out, records) as sink:  # with a run manifest
        report_cases(sink, timed, f"sdpa, {layout} (mask tensor)", peak_gib, errors, "logits",
                     lengths=lengths, layers=args.layers, layout=layout,
                     transformers=transformers.__version__)

if __name__ == "__main__":
    main()
