"""How far batching moves a saved model's greedy-step logits, next to GREEDY_TIE_MARGIN: every prompt is generated
in the left-padded, length-sorted batch ``HFLanguageModel.generate`` puts it in and on its own, and the script
reports the largest logit difference at any step (while the two continuations agree), how many continuations
differ, and how many steps have a top-two gap under a few margins. ``HFLanguageModel.generate`` generates a batched
row again alone, through its last close call, when its gap falls under the margin, so the margin must stay above
the shift this reports; the rows it sends back are the cost, which the script also reports (batched prompts/s,
seconds per row alone, rows whose batched gap falls under the margin, the new tokens their alone runs take). Not a
test: run it on an otherwise idle machine and record the output in docs/benchmarks.md.

    python scripts/generation_tie_margin.py MODEL_DIR [--prompts 150] [--new-tokens 11] [--batch-size 8]
        [--max-length 256]

``--batch-size`` and ``--max-length`` are the model spec's scoring batch and context length (SmolLM2-135M's by
default); generation batches hold ``GENERATE_BATCH_FACTOR`` times their tokens.

Prompts are Names2IDs PII prompts ("Name: <name>, ID:") of people no track trains on (seed 11).
"""

from __future__ import annotations

import argparse
import time

import torch


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model_dir")
    ap.add_argument("--prompts", type=int, default=150)
    ap.add_argument("--new-tokens", type=int, default=11)
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--max-length", type=int, default=256)
    a = ap.parse_args()

    from bench.lm import GREEDY_TIE_MARGIN, generation_rows, length_sorted_batches
    from greedy_probe import greedy, load_probe

    model, tok, enc = load_probe(a.model_dir, a.prompts)
    batches = length_sorted_batches([len(e) for e in enc],
                                    lambda length: generation_rows(a.batch_size, a.max_length, length, a.new_tokens))

    worst, differ, gaps, sent_back, t_batched, t_alone = 0.0, 0, [], 0, 0.0, 0.0
    steps_full = steps_to_close = 0
    for group in ([enc[i] for i in b] for b in batches):
        t0 = time.perf_counter()
        seq_batched, scores_batched = greedy(model, tok, group, a.new_tokens)
        t_batched += time.perf_counter() - t0
        if len(group) > 1:  # the fallback's test: a batched row's smallest top-two gap up to its first EOS
            top = scores_batched.topk(2, dim=-1).values
            row_gaps = top[..., 0] - top[..., 1]
            for r, row in enumerate(seq_batched):
                close = (row_gaps[r, :len(row)] < GREEDY_TIE_MARGIN).nonzero()
                if len(close):  # generated alone through its last close call, not to the end
                    sent_back += 1
                    steps_full, steps_to_close = steps_full + len(row), steps_to_close + int(close[-1]) + 1
        for r in range(len(group)):
            t0 = time.perf_counter()
            seq_alone, scores_alone = greedy(model, tok, group[r:r + 1], a.new_tokens)
            t_alone += time.perf_counter() - t0
            for t in range(scores_alone.shape[1]):
                worst = max(worst, float((scores_batched[r, t] - scores_alone[0, t]).abs().max()))
                top = scores_alone[0, t].topk(2).values
                gaps.append(float(top[0] - top[1]))
                if t >= len(seq_batched[r]) or seq_batched[r][t] != seq_alone[0][t]:
                    differ += 1
                    break
    g = torch.tensor(gaps)
    print(f"{a.model_dir}: {len(enc)} prompts of {len({len(e) for e in enc})} lengths in {len(batches)} batches, "
          f"{a.new_tokens} new tokens, {torch.get_num_threads()} threads")
    print(f"  batching moved a step's logits by at most {worst:.2e} (GREEDY_TIE_MARGIN = {GREEDY_TIE_MARGIN:g}); "
          f"continuations that differ: {differ} of {len(enc)}")
    print(f"  batched: {len(enc) / t_batched:.1f} prompts/s; one row alone: {t_alone / len(enc):.2f} s; rows "
          f"the fallback sends back: {sent_back} of {len(enc)} (about {sent_back * t_alone / len(enc):.0f} s run to "
          f"the end); new tokens they generate alone, through their last close call: {steps_to_close} of "
          f"{steps_full}")
    for m in (1e-5, 1e-4, 1e-3, 1e-2):
        print(f"  steps with a top-two gap under {m:g}: {int((g < m).sum())} of {len(g)}")


if __name__ == "__main__":
    main()
