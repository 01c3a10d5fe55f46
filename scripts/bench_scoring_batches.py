"""What joining chunks of one padded length buys scoring (``bench.lm.scoring_batches``): the exposure attack's
texts (random-word canaries and 128 fresh references each, about 8 tokens) and longer records scored with a cached
model, in fixed ``batch_size`` chunks (as before) against joined batches, interleaved, with a check that every
signal is the same bits. Not a test: run it on an otherwise idle machine and record the output in
docs/benchmarks.md.

    python scripts/bench_scoring_batches.py CACHE/pretrained/KEY [--task random_word_canaries|names2ids]
        [--targets 200] [--references 128] [--rounds 2]

KEY is a θ of the canaries track (nano) or of the realistic track (SmolLM2-135M, with ``--task names2ids``: its
records, no references), as ``bash scripts/time_tracks.sh`` leaves them under WORKDIR/cache-TRACK.
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
import torch

FIELDS = ("token_ids", "logprobs", "mu", "sigma2", "top1", "top1_logprob")


def texts_of(task: str, n_targets: int, n_references: int) -> list[str]:
    """The targets of a track's task, their exposure references, and some longer records of the same task."""
    import bench.plugin  # noqa: F401  (registers the built-in plugins)
    from bench.registry import TASKS
    if task == "random_word_canaries":
        from tasks.canaries import random_word_references_for
        data = TASKS.get(task)(repeats=3, n_canaries=600, adapt_domain="wiki", max_chars_per_source=1500000).build(None)
        targets = [t.text for t in data.targets][:n_targets]
        refs = [r for t in targets for r in random_word_references_for(data.public_format, t, n=n_references, seed=0)]
        return targets + refs + list(data.heldout[:300]) + list(data.adapt[:300])
    data = TASKS.get(task)(n_people=1600, heldout_fraction=0.1, max_chars_per_source=400000).build(None)
    return [t.text for t in data.targets][:n_targets] + list(data.adapt[:300])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model_dir")
    ap.add_argument("--task", default="random_word_canaries", choices=("random_word_canaries", "names2ids"))
    ap.add_argument("--targets", type=int, default=200)
    ap.add_argument("--references", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=2)
    a = ap.parse_args()

    import bench.lm as lm_module
    from bench.allocator import tune_allocator
    from bench.device import set_threads
    from bench.modeling import load_model
    set_threads()
    tune_allocator()
    texts = texts_of(a.task, a.targets, a.references)
    model, tok = load_model(a.model_dir, device=torch.device("cpu"))
    max_length = model.config.max_position_embeddings if a.task == "random_word_canaries" else 256
    lengths = [len(x) for x in tok(texts)["input_ids"]]
    print(f"{len(texts)} texts, {np.mean(lengths):.1f} tokens on average, max_length {max_length}, batch_size 8, "
          f"{torch.get_num_threads()} threads")
    joined = lm_module.scoring_batches

    def fixed(order, lengths, batch_size, max_tokens):
        return [list(order[i:i + batch_size]) for i in range(0, len(order), batch_size)]

    seconds: dict[str, list[float]] = {"fixed chunks": [], "joined": []}
    out = {}
    keys = [str(i) for i in range(len(texts))]
    for _ in range(a.rounds):
        for name, fn in (("fixed chunks", fixed), ("joined", joined)):
            lm_module.scoring_batches = fn
            lm = lm_module.HFLanguageModel(model, tok, fingerprint=name, max_length=max_length, batch_size=8)
            t0 = time.perf_counter()
            out[name] = lm._compute_signals(keys, texts)
            seconds[name].append(time.perf_counter() - t0)
    lm_module.scoring_batches = joined
    for name, s in seconds.items():
        print(f"{name}: {' / '.join(f'{x:.2f}' for x in s)} s (median {statistics.median(s):.2f} s)")
    print(f"speed-up: {statistics.median(seconds['fixed chunks']) / statistics.median(seconds['joined']):.2f}x")
    same = all(getattr(out["joined"][k], f).tobytes() == getattr(out["fixed chunks"][k], f).tobytes()
               for k in keys for f in FIELDS)
    print(f"every signal bit-identical: {same}")


if __name__ == "__main__":
    main()
