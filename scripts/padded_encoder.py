"""A padded batch through an encoder (GPU host with transformers): transformers' `BertModel`
(BERT-base's shape, random weights, bf16) on sequences of long-tailed lengths right padded to
the longest, its attention routed to wavefront (`hf_mask` hands the layers the real tokens'
sequences, run as one packed batch) against transformers' SDPA path on the same batch (the
padding mask as a tensor) and against the sequences run one at a time on the SDPA path.

Medians of interleaved rounds of GPU ms per forward (`measure.rounds`), the peak GPU memory a
forward allocates beyond the model, and the last hidden states' relative error at real tokens
against the one-by-one SDPA run.

    python scripts/padded_encoder.py [--sequences 64 --longest 512 --rounds 7] [--out DIR]
"""
import argparse
from pathlib import Path

import numpy
import torch

from wavefront.measure.prefill import errors_and_peaks, report_cases, timed_forwards
from wavefront.measure.sink import JsonlSink


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sequences", type=int, default=64)
    parser.add_argument("--longest", type=int, default=512)
    parser.add_argument("--rounds", type=int, default=7, help="at least 6")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    import transformers
    from transformers import BertConfig, BertModel

    import wavefront.torch as wft
    name = wft.register_with_transformers()
    torch.manual_seed(0)
    config = BertConfig(max_position_embeddings=args.longest, attn_implementation="sdpa")
    model = BertModel(config).to(device="cuda", dtype=torch.bfloat16).eval()
    model.set_attn_implementation(name)
    model.set_attn_implementation("sdpa")
    # log-normal lengths around a quarter of the longest, clipped to [8, longest], one of them
    # the longest (the padded length)
    rng = numpy.random.default_rng(args.sequences)
    lengths = numpy.clip(rng.lognormal(numpy.log(args.longest / 4), 0.8, args.sequences), 8,
                         args.longest).astype(int)
    lengths[0] = args.longest
    lengths = lengths.tolist()
    rows = max(lengths)
    g = torch.Generator(device="cuda").manual_seed(1)
    ids = torch.randint(1, config.vocab_size, (len(lengths), rows), device="cuda", generator=g)
    padding = torch.zeros_like(ids)
    for b, n in enumerate(lengths):
        padding[b, :n] = 1
    real = padding.bool()

    def forward(case):
        with torch.no_grad():
            if case == "sdpa, one sequence at a time":
                model.config._attn_implementation = "sdpa"
                return torch.cat([model(input_ids=ids[b:b + 1, :n]).last_hidden_state[0]
                                  for b, n in enumerate(lengths)])
            model.config._attn_implementation = name if case.startswith("wavefront") else "sdpa"
            return model(input_ids=ids, attention_mask=padding).last_hidden_state[real]

    cases = ["wavefront, padded batch", "sdpa, padded batch (mask tensor)",
             "sdpa, one sequence at a time"]
    errors, peak_gib = errors_and_peaks(cases, forward)
    timed = timed_forwards({case: lambda case=case: forward(case) for case in cases},
                           args.rounds)
    print(f"{torch.cuda.get_device_name()}: transformers {transformers.__version__} BertModel "
          f"(12 layers, hidden 768, 12 heads), bf16; {len(lengths)} sequences of "
          f"{min(lengths)}-{rows} tokens ({sum(lengths)} in all) right padded to {rows}; GPU ms "
          f"per forward, median [95% interval] of {args.rounds} interleaved rounds")
    with JsonlSink(args.out, "padded_encoder.jsonl") as sink:  # with a run manifest
        report_cases(sink, timed, cases[1], peak_gib, errors, "hidden", lengths=lengths,
                     transformers=transformers.__version__)

if __name__ == "__main__":
    main()
