"""Why the eager signal statistics reduce with ``torch.linalg.vecdot`` and not a BLAS dot product: the error and
speed of both ways of forming μ = Σ p log p and σ² = Σ p (log p − μ)² over the vocabulary, against float64, on
random logits of the embedded models' vocabulary (8,192) and SmolLM2-135M's (49,152). The signals promise fp32
results within 1e-5 (tests/test_logit_stats.py); a reduction that is faster but errs by more cannot be used.
Not a test: run it on an otherwise idle machine and record the output in docs/benchmarks.md.

    python scripts/moment_reductions.py [--rows 1024] [--repeats 5]
"""

from __future__ import annotations

import argparse
import time

import torch


def bmm_dot(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Row-wise dot products as one batched matrix product (BLAS accumulation order)."""
    v = a.shape[-1]
    return torch.bmm(a.reshape(-1, 1, v), b.reshape(-1, v, 1)).reshape(a.shape[:-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, default=1024, help="positions (batch × length), e.g. 8 × 128")
    ap.add_argument("--repeats", type=int, default=5)
    a = ap.parse_args()

    from bench.device import set_threads
    set_threads()
    g = torch.Generator().manual_seed(0)
    print(f"{a.rows} positions, {torch.get_num_threads()} threads; error = largest |fp32 − float64|")
    for vocab in (8192, 49152):
        for scale in (0.01, 3.0, 10.0):  # near-uniform, typical, peaked
            logp = torch.log_softmax(torch.randn(a.rows, vocab, generator=g) * scale, -1)
            p = logp.exp()
            mu_ref = (p.double() * logp.double()).sum(-1)
            d64 = logp.double() - mu_ref.unsqueeze(-1)
            sigma2_ref = (p.double() * d64 * d64).sum(-1)
            line = f"  V={vocab:6d} scale={scale:<5}"
            for name, dot in (("vecdot", torch.linalg.vecdot), ("bmm", bmm_dot)):
                t0 = time.perf_counter()
                for _ in range(a.repeats):
                    mu = dot(p, logp)
                    d = logp - mu.unsqueeze(-1)
                    sigma2 = dot(p * d, d)
                seconds = (time.perf_counter() - t0) / a.repeats
                line += (f"  {name}: μ err {float((mu.double() - mu_ref).abs().max()):.1e}, "
                         f"σ² err {float((sigma2.double() - sigma2_ref).abs().max()):.1e}, {seconds * 1e3:6.1f} ms")
            print(line)


if __name__ == "__main__":
    main()
