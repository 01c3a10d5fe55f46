"""What blocking buys the eager signal statistics: ``stats_from_logits`` on a scoring batch of random logits
(the embedded models' vocabulary, 8,192, and SmolLM2-135M's, 49,152), whole-tensor passes against blocks of
several sizes (``bench.logit_stats.BLOCK_ELEMENTS``), with a check that every block size gives the same bits.
Not a test: run it on an otherwise idle machine and record the output in docs/benchmarks.md.

    python scripts/stats_blocks.py [--batch 8] [--length 127] [--repeats 9]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--length", type=int, default=127, help="positions per row (a 128-token context, shifted)")
    ap.add_argument("--repeats", type=int, default=9)
    a = ap.parse_args()

    import bench.logit_stats as ls
    from bench.allocator import tune_allocator
    from bench.device import set_threads
    set_threads()
    tune_allocator()
    default = ls.BLOCK_ELEMENTS
    g = torch.Generator().manual_seed(0)
    print(f"{a.batch} × {a.length} positions, {torch.get_num_threads()} threads, median of {a.repeats}; "
          f"default block {default:,} logits")
    for vocab in (8192, 49152):
        logits = (torch.randn(a.batch, a.length + 1, vocab, generator=g) * 3)[:, :-1]  # as scoring slices them
        tgt = torch.randint(0, vocab, (a.batch, a.length), generator=g)
        ref = None
        line = f"  V={vocab:6d}"
        for label, block in (("whole", 1 << 40), ("2^18", 1 << 18), ("2^19", 1 << 19), ("2^20", 1 << 20),
                             ("2^21", 1 << 21)):
            ls.BLOCK_ELEMENTS = block
            out = ls.stats_from_logits(logits, tgt)
            ref = ref if ref is not None else out
            same = all(torch.equal(x, y) for x, y in zip(out, ref))
            times = []
            for _ in range(a.repeats):
                t0 = time.perf_counter()
                ls.stats_from_logits(logits, tgt)
                times.append(time.perf_counter() - t0)
            line += f"  {label}: {statistics.median(times) * 1e3:6.1f} ms{'' if same else ' (BITS DIFFER)'}"
        ls.BLOCK_ELEMENTS = default
        print(line)


if __name__ == "__main__":
    main()
