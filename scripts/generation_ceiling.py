"""How close greedy generation on a saved model runs to the CPU's matrix-multiply ceiling, and what batching
prompts of mixed lengths (left-padded, length-sorted, as ``HFLanguageModel.generate`` does) buys over one batch per
prompt length. Each Names2IDs PII prompt is generated alone (the reference every batched continuation must equal), in
equal-length batches, and in length-sorted mixed batches of several sizes; the script reports prompts/s, the
continuations that differ from the alone ones, the largest logit shift, the rows whose batched top-two gap falls
under ``GREEDY_TIE_MARGIN`` (which the fallback would generate again), the arithmetic rate the equal-length batches
reach, and an fp32 and a bf16 matrix product of the model's shapes for comparison. With ``--thread-layouts`` it
also generates on one intra-op thread and as two one-thread workers side by side (the prompts alone, and the
equal-length batches), against the default of one worker on every thread. Not a test: run it on an otherwise idle
machine and record the output in docs/benchmarks.md.

    python scripts/generation_ceiling.py MODEL_DIR [--prompts 400] [--new-tokens 11] [--thread-layouts]

The arithmetic counts the linear layers only (2 × non-embedding parameters per position, plus the output layer
for each new token); attention over these short sequences adds a few percent.
"""

from __future__ import annotations

import argparse
import time
from collections import defaultdict

import torch


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model_dir")
    ap.add_argument("--prompts", type=int, default=400)
    ap.add_argument("--new-tokens", type=int, default=11)
    ap.add_argument("--thread-layouts", action="store_true")
    a = ap.parse_args()

    from bench.allocator import tune_allocator
    from bench.lm import GREEDY_TIE_MARGIN
    from greedy_probe import agreement, greedy, load_probe

    model, tok, enc = load_probe(a.model_dir, a.prompts)
    tune_allocator()
    n = len(enc)

    def generate(rows: list[list[int]]) -> tuple[list[list[int]], torch.Tensor]:
        return greedy(model, tok, rows, a.new_tokens)

    t0 = time.perf_counter()
    alone = [generate([e]) for e in enc]
    t_alone = time.perf_counter() - t0
    print(f"{a.model_dir}: {n} prompts, {a.new_tokens} new tokens, {torch.get_num_threads()} threads")
    print(f"  alone: {n / t_alone:.2f} prompts/s")

    def batched(name: str, batches: list[list[int]]) -> float:
        t0 = time.perf_counter()
        got: dict[int, tuple[list[int], torch.Tensor]] = {}
        for b in batches:
            seqs, scores = generate([enc[i] for i in b])
            for j, i in enumerate(b):
                got[i] = (seqs[j], scores[j])
        seconds = time.perf_counter() - t0
        differ, shift, back = 0, 0.0, 0
        for i in range(n):
            seq, scores = got[i]
            differs, step_shift = agreement(seq, scores, alone[i][0][0], alone[i][1][0])
            differ, shift = differ + differs, max(shift, step_shift)
            top = scores[:len(seq)].topk(2, -1).values
            back += float((top[:, 0] - top[:, 1]).min()) < GREEDY_TIE_MARGIN
        print(f"  {name}: {n / seconds:.1f} prompts/s; continuations that differ from alone: {differ}; largest logit "
              f"shift {shift:.2e}; rows under the margin: {back}")
        return seconds

    by_length: dict[int, list[int]] = defaultdict(list)
    for i, e in enumerate(enc):
        by_length[len(e)].append(i)
    seconds = batched(f"equal-length batches (one per each of {len(by_length)} lengths)",
                      [g for _, g in sorted(by_length.items())])
    order = sorted(range(n), key=lambda i: len(enc[i]))
    for rows in (64, 128, 256):
        batched(f"mixed lengths, left-padded, {rows} rows", [order[i:i + rows] for i in range(0, n, rows)])

    emb = model.get_input_embeddings().weight
    d_model, vocab = emb.shape[1], emb.shape[0]
    body = sum(p.numel() for p in model.parameters()) - emb.numel()
    positions = sum(len(e) + a.new_tokens - 1 for e in enc)
    flops = 2 * body * positions + 2 * d_model * vocab * a.new_tokens * n
    print(f"  equal-length batches reach {flops / seconds / 1e9:.0f} GFLOP/s in the linear layers")
    mlp = getattr(model.config, "intermediate_size", 4 * d_model)
    for dtype in (torch.float32, torch.bfloat16):
        x, w = torch.randn(2048, d_model, dtype=dtype), torch.randn(d_model, mlp, dtype=dtype)
        x @ w
        t0 = time.perf_counter()
        for _ in range(20):
            x @ w
        rate = 2 * 2048 * d_model * mlp * 20 / (time.perf_counter() - t0) / 1e9
        print(f"  a {dtype} matrix product (2048 × {d_model}) × ({d_model} × {mlp}): {rate:.0f} GFLOP/s")
    if a.thread_layouts:
        thread_layouts(generate, enc, [g for _, g in sorted(by_length.items())], alone)


def thread_layouts(generate, enc: list[list[int]], groups: list[list[int]], alone: list) -> None:
    """Prompts alone and equal-length batches on one intra-op thread, and as two one-thread workers side by side
    (each op then runs in its caller's thread), against ``alone`` (every thread, one worker): speed, and whether
    the logits are the same bits."""
    import threading

    from greedy_probe import agreement

    def side_by_side(jobs: list[list[int]]) -> tuple[list, float]:
        out: list = [None] * len(jobs)
        half: list[list[int]] = [[], []]
        rows = [0, 0]
        for i in sorted(range(len(jobs)), key=lambda i: -len(jobs[i])):  # balance rows between the two workers
            k = int(rows[1] < rows[0])
            half[k].append(i)
            rows[k] += len(jobs[i])

        def work(mine: list[int]) -> None:
            for i in mine:
                out[i] = generate([enc[k] for k in jobs[i]])

        t0 = time.perf_counter()
        workers = [threading.Thread(target=work, args=(h,)) for h in half]
        for w in workers:
            w.start()
        for w in workers:
            w.join()
        return out, time.perf_counter() - t0

    threads = torch.get_num_threads()
    n = len(enc)
    t0 = time.perf_counter()
    batched_all = [generate([enc[k] for k in g]) for g in groups]
    t_batched = time.perf_counter() - t0
    torch.set_num_threads(1)
    try:
        t0 = time.perf_counter()
        one = [generate([e]) for e in enc]
        t_one = time.perf_counter() - t0
        pair, t_pair = side_by_side([[i] for i in range(n)])
        batched_pair, t_batched_pair = side_by_side(groups)
    finally:
        torch.set_num_threads(threads)
    differ, shift = 0, 0.0
    for (seq, scores), (ref, ref_scores) in zip(one, alone):
        differs, step_shift = agreement(seq[0], scores[0], ref[0], ref_scores[0])
        differ, shift = differ + differs, max(shift, step_shift)
    print(f"  alone on 1 thread: {t_one / n:.3f} s/row; continuations that differ from {threads} threads: {differ}; "
          f"largest logit difference while they agree {shift:.2e}")
    print(f"  alone, two 1-thread workers: {t_pair / n:.3f} s/row; logits as 1 thread alone, bit for bit: "
          f"{all(torch.equal(x[1], y[1]) for x, y in zip(pair, one))}")
    print(f"  equal-length batches on {threads} threads: {n / t_batched:.1f} prompts/s; two 1-thread workers: "
          f"{n / t_batched_pair:.1f} prompts/s, same continuations: "
          f"{all(x[0] == y[0] for x, y in zip(batched_pair, batched_all))}")


if __name__ == "__main__":
    main()
