"""Greedy generation on a saved model: rows per batch as the scoring batch (the old rule) against the token
budget of ``GENERATE_BATCH_FACTOR`` (now), on the same Names2IDs-style PII prompts, with a check that both
return the same texts. Not a test: run it on an otherwise idle machine and record the output in
docs/benchmarks.md.

    python scripts/bench_generation_rows.py MODEL_DIR [--prompts 400] [--new-tokens 11] [--batch-size 8]
"""

from __future__ import annotations

import argparse
import random
import time

import torch


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model_dir")
    ap.add_argument("--prompts", type=int, default=400)
    ap.add_argument("--new-tokens", type=int, default=11)
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--max-length", type=int, default=128)
    a = ap.parse_args()

    from bench.device import set_threads
    from bench.lm import GENERATE_BATCH_FACTOR, HFLanguageModel, SignalCache
    from bench.modeling import load_model

    set_threads()
    model, tok = load_model(a.model_dir, device=torch.device("cpu"))
    model.eval()
    rng = random.Random(0)
    first = ["Ada", "Bo", "Carmen", "Dmitri", "Eun-ji", "Farah", "Giovanni", "Hiroshi", "Ines", "Jakub"]
    last = ["Okafor", "Lindqvist", "Nakamura", "Petrov", "Quispe", "Rahman", "Schmidt", "Tanaka", "Uchenna"]
    prompts = [f"Name: {rng.choice(first)} {rng.choice(last)}{'-' + rng.choice(last) if i % 3 == 0 else ''}, ID:"
               for i in range(a.prompts)]

    def run(rows_rule: str) -> tuple[list[str], float]:
        lm = HFLanguageModel(model, tok, fingerprint=f"rows-{rows_rule}", max_length=a.max_length,
                             batch_size=a.batch_size, cache=SignalCache(None))
        if rows_rule == "scoring batch":
            lm._generation_rows = lambda length, new: a.batch_size
        t0 = time.perf_counter()
        with torch.no_grad():
            out = lm.generate(prompts, a.new_tokens)
        return out, time.perf_counter() - t0

    old, t_old = run("scoring batch")
    new, t_new = run("token budget")
    n_lengths = len({len(tok(p)["input_ids"]) for p in prompts})
    print(f"{a.model_dir}: {len(prompts)} prompts ({len(set(prompts))} distinct, {n_lengths} lengths), "
          f"{a.new_tokens} new tokens, {torch.get_num_threads()} threads")
    print(f"  rows = scoring batch ({a.batch_size}):            {len(set(prompts)) / t_old:7.1f} prompts/s")
    print(f"  rows = {GENERATE_BATCH_FACTOR} x batch x max_length / length:  "
          f"{len(set(prompts)) / t_new:7.1f} prompts/s ({t_old / t_new:.1f}x)")
    print(f"  same text: {sum(x == y for x, y in zip(old, new))} of {len(prompts)}")


if __name__ == "__main__":
    main()
