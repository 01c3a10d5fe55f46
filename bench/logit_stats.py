"""Per-position statistics of next-token distributions in as few passes over the vocabulary as possible.

Scoring a batch yields a (batch × T × V) tensor of logits; the signals need, per position, log p of the
target, the mean μ and variance σ² of log p under the model's own distribution (Min-K%++'s normalisers,
Zhang et al. 2024), the greedy token and its log-probability. Written naively these are about ten sweeps over
the vocabulary with five full-size temporaries, which made scoring cost 1.3× a bare forward + log-softmax on
the micro model. Here:

* eager (default): one ``log_softmax``, one ``exp``, one ``max`` and two dot products (``torch.linalg.vecdot``);
  σ² keeps the centred form E[(log p − μ)²], which avoids the cancellation of E[log p²] − μ² when the
  distribution is near-uniform (log p ≈ −log V, σ² ≈ 0). The passes run block by block (about
  :data:`BLOCK_ELEMENTS` logits at a time), so each block's log-probabilities and temporaries are still in the
  CPU's cache for the next pass instead of going out to memory and back five times. Blocking changes no bit:
  every statistic is a per-position reduction over the vocabulary, computed by the same kernels on the same
  values (tests/test_logit_stats.py checks equality with the unblocked passes). On a GPU the blocks are 128
  times larger (:data:`CUDA_BLOCK_ELEMENTS`): there they only bound the memory of the temporaries.
* compiled (``PRIVBENCH_COMPILE=1``): the statistics from the logits in one ``torch.compile`` kernel of two
  sweeps over the vocabulary (the arg-max, then the sum of exp and the first two moments of the shifted
  logits, accumulated in float64: :func:`_fused`); the first call in a process compiles for about 20 s on the
  2-core machine, so it pays off only for long scoring runs.

Both agree with the naive formulas in float64 to about 5e-6 (tests/test_logit_stats.py).
"""

from __future__ import annotations

import os

import torch

_compiled = None

#: logits per block of the eager passes: 4 MB of fp32, which keeps a block's temporaries in cache on the 2-core
#: CPU (8 × 127 positions, 2 threads: 12.7 → 10.1 ms at V = 8,192, 78.3 → 60.8 ms at V = 49,152;
#: scripts/stats_blocks.py, and scripts/benchmark.py for whole scoring runs; docs/benchmarks.md)
BLOCK_ELEMENTS = 1 << 20
#: logits per block on a GPU: there the blocks bound the temporaries' memory (about 4 × 512 MiB at fp32) instead of
#: fitting a cache, and a CPU-sized block would cost thousands of kernel launches per batch
CUDA_BLOCK_ELEMENTS = 1 << 27


def block_elements(device: torch.device) -> int:
    """Logits per block of the eager passes on ``device``."""
    return CUDA_BLOCK_ELEMENTS if device.type == "cuda" else BLOCK_ELEMENTS


def compile_enabled() -> bool:
    """Whether ``PRIVBENCH_COMPILE=1`` asks for the compiled kernel."""
    return os.environ.get("PRIVBENCH_COMPILE", "0").strip().lower() in ("1", "true", "yes")


def stats_from_logprobs(logp: torch.Tensor, tgt: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """(log p of ``tgt``, μ, σ², greedy == ``tgt``, greedy log p) per position from fp32 log-probabilities."""
    top1_lp, arg = logp.max(-1)
    tok_lp = logp.gather(-1, tgt.unsqueeze(-1)).squeeze(-1)
    p = logp.exp()
    mu = torch.linalg.vecdot(p, logp)
    d = logp - mu.unsqueeze(-1)
    sigma2 = torch.linalg.vecdot(p.mul_(d), d)
    return tok_lp, mu, sigma2, arg == tgt, top1_lp


def _fused(logits: torch.Tensor, tgt: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """The compiled kernel's formulas: two sweeps over the vocabulary instead of four.

    With d = z − max z ≤ 0 and e = exp d, s = Σe: log p = d − log s, so μ = E_p[d] − log s and σ² = Var_p(d) =
    E_p[d²] − E_p[d]², and E_p[d], E_p[d²] are sums in the same sweep as s. The centred form that the eager passes
    keep needs μ before the sweep that computes σ² (four sweeps, as inductor schedules them); the uncentred one
    loses digits to cancellation when E_p[d]² ≫ σ² (mass far below the arg-max), up to 2e-5 in fp32, so the three
    sums accumulate in float64. That is more exact than the centred form in fp32 (tests/test_logit_stats.py) and
    faster (docs/benchmarks.md, "GPU: NVIDIA H200")."""
    z = logits.float()
    zmax, arg = z.max(-1)
    d = z - zmax.unsqueeze(-1)
    e = d.exp()
    d64, e64 = d.double(), e.double()
    s = e64.sum(-1)
    m1 = (e64 * d64).sum(-1) / s
    m2 = (e64 * d64.square()).sum(-1) / s
    log_s = s.log()
    tok_lp = d.gather(-1, tgt.unsqueeze(-1)).squeeze(-1) - log_s
    return (tok_lp.float(), (m1 - log_s).float(), (m2 - m1.square()).float(), arg == tgt, (-log_s).float())


def _blocks(batch: int, length: int, vocab: int, elements: int | None = None) -> list[tuple[slice, slice]]:
    """(rows, positions) slices that tile a batch × length grid of positions, about ``elements`` logits each
    (default :data:`BLOCK_ELEMENTS`). No block holds a single position unless the grid does: over a large
    vocabulary a lone row's reduction is split between threads, which sums in another order than the rows of a
    larger tensor."""
    per_block = max(2, (elements or BLOCK_ELEMENTS) // max(vocab, 1))
    if length >= per_block:  # split each row's positions
        starts = list(range(0, length, per_block))
        if len(starts) > 1 and length - starts[-1] < 2:
            starts.pop()
        cuts = starts[1:] + [length]
        return [(slice(b, b + 1), slice(s, e)) for b in range(batch) for s, e in zip(starts, cuts)]
    rows = max(1, per_block // max(length, 1))  # whole rows, several at a time
    starts = list(range(0, batch, rows))
    if len(starts) > 1 and (batch - starts[-1]) * length < 2:
        starts.pop()
    cuts = starts[1:] + [batch]
    return [(slice(s, e), slice(0, length)) for s, e in zip(starts, cuts)]


def _eager(logits: torch.Tensor, tgt: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """:func:`stats_from_logprobs` of fp32 log-softmaxed ``logits`` (batch × length × vocabulary), block by block."""
    batch, length, vocab = logits.shape
    blocks = _blocks(batch, length, vocab, block_elements(logits.device))
    if len(blocks) == 1:
        return stats_from_logprobs(torch.log_softmax(logits.float(), dim=-1), tgt)
    dtypes = (torch.float32, torch.float32, torch.float32, torch.bool, torch.float32)  # stats_from_logprobs' order
    out = tuple(torch.empty(batch, length, dtype=d, device=logits.device) for d in dtypes)
    for rows, positions in blocks:
        part = stats_from_logprobs(torch.log_softmax(logits[rows, positions].float(), dim=-1), tgt[rows, positions])
        for o, x in zip(out, part):
            o[rows, positions] = x
    return out


def stats_from_logits(logits: torch.Tensor, tgt: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """As :func:`stats_from_logprobs` from raw logits (batch × length × vocabulary, any float dtype, computed in
    fp32); compiled when :func:`compile_enabled`.

    A compiled run that cannot compile stops with an error rather than falling back to the eager kernel: its
    signals are cached and stored under the compiled fingerprint (bench.keys.scoring_fingerprint), and eager
    numbers must never sit there."""
    global _compiled
    if compile_enabled():
        if _compiled is None:
            _compiled = torch.compile(_fused, dynamic=True)
        try:
            return _compiled(logits, tgt)
        except Exception as exc:  # no C++ toolchain, unsupported backend
            from bench.device import is_oom
            from bench.errors import ConfigError
            if is_oom(exc):  # not a compile failure: the caller's batch back-off handles it
                raise
            raise ConfigError(f"PRIVBENCH_COMPILE=1 but torch.compile of the signal kernel failed "
                              f"({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}): install a C++ "
                              f"compiler for inductor, or unset PRIVBENCH_COMPILE to score with the eager "
                              f"kernel") from exc
    return _eager(logits, tgt)
