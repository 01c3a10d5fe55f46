"""The one-pass signal statistics against the naive formulas they replace (fp32, within 1e-5)."""

from __future__ import annotations

import pytest
import torch

from bench.logit_stats import stats_from_logits, stats_from_logprobs


def _naive(logits: torch.Tensor, tgt: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """The formulas privbench used before (one temporary per step), in float64 as the reference."""
    logp = torch.log_softmax(logits.double(), dim=-1)
    p = logp.exp()
    mu = (p * logp).sum(-1)
    sigma2 = (p * (logp - mu.unsqueeze(-1)).square()).sum(-1)
    return (logp.gather(-1, tgt.unsqueeze(-1)).squeeze(-1), mu, sigma2, logp.argmax(-1) == tgt, logp.amax(-1))


@pytest.mark.parametrize("scale", [0.01, 1.0, 8.0, None])  # near-uniform (σ² ≈ 0), typical, peaked; None: mass
@pytest.mark.parametrize("compiled", [False, True])           # far below the arg-max
def test_stats_match_the_naive_formulas(scale, compiled, monkeypatch):
    monkeypatch.setenv("PRIVBENCH_COMPILE", "1" if compiled else "0")
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(3, 17, 4096, generator=g) * scale if scale else _mass_far_below_the_argmax(3, 17, 4096)
    tgt = torch.randint(0, 4096, (3, 17), generator=g)
    tgt[0, :5] = logits[0, :5].argmax(-1)  # some positions where the target is the greedy token
    ref = _naive(logits, tgt)
    for got in (stats_from_logits(logits, tgt), stats_from_logprobs(torch.log_softmax(logits, -1), tgt)):
        for name, a, b in zip(("logp", "mu", "sigma2", "top1", "top1_logp"), got, ref):
            assert a.shape == b.shape, name
            if a.dtype == torch.bool:
                assert torch.equal(a, b), name
            else:
                assert a.dtype == torch.float32, name
                assert (a.double() - b).abs().max() <= 1e-5, (name, float((a.double() - b).abs().max()))
    assert bool(ref[3][0, :5].all()) and not bool(ref[3].all())


def _mass_far_below_the_argmax(batch: int = 2, length: int = 33, vocab: int = 32_000) -> torch.Tensor:
    """One arg-max logit 5 above 31,999 others: nearly all mass sits 5 nats below the maximum, E_p[d]² ≈ 25 ≫
    σ² ≈ 0.18, where the uncentred variance loses digits to cancellation."""
    g = torch.Generator().manual_seed(1)
    logits = torch.full((batch, length, vocab), -5.0) + 0.1 * torch.randn(batch, length, vocab, generator=g)
    logits[..., 0] = 0.0
    return logits


def test_compiled_variance_keeps_its_digits_where_the_uncentred_form_loses_them(monkeypatch):
    """The compiled kernel's one-sweep moments accumulate in float64 (bench.logit_stats._fused): the same
    formula accumulated in fp32 misses σ² by more than the 1e-5 every statistic must meet."""
    monkeypatch.setenv("PRIVBENCH_COMPILE", "1")
    logits = _mass_far_below_the_argmax()
    tgt = torch.zeros(2, 33, dtype=torch.long)
    ref = _naive(logits, tgt)[2]
    got = stats_from_logits(logits, tgt)[2]
    assert (got.double() - ref).abs().max() <= 1e-6
    d = logits - logits.amax(-1, keepdim=True)
    e = d.exp()
    s = e.sum(-1)
    m1, m2 = (e * d).sum(-1) / s, (e * d * d).sum(-1) / s
    assert (m2 - m1 * m1 - ref).abs().max() > 1e-5  # the fp32 accumulation this guards against


@pytest.mark.parametrize("shape", [(8, 127, 8192), (3, 40, 4096), (2, 43, 49152), (2, 45, 49152), (26, 1, 40960),
                                   (27, 1, 40960)])
def test_blocked_passes_change_no_bit(shape, monkeypatch):
    """The eager kernel runs block by block for cache locality; every statistic must equal, bit for bit, the same
    passes over the whole tensor (a non-contiguous slice of the logits, as scoring hands it over). The shapes give
    blocks of whole rows, blocks of positions with a one-position tail (merged into the block before), and
    vocabularies past the size where a lone row's reduction would be split between threads."""
    monkeypatch.delenv("PRIVBENCH_COMPILE", raising=False)
    batch, length, vocab = shape
    g = torch.Generator().manual_seed(1)
    logits = (torch.randn(batch, length + 1, vocab, generator=g) * 3)[:, :-1]
    tgt = torch.randint(0, vocab, (batch, length), generator=g)
    blocked = stats_from_logits(logits, tgt)
    whole = stats_from_logprobs(torch.log_softmax(logits, dim=-1), tgt)
    for name, a, b in zip(("logp", "mu", "sigma2", "top1", "top1_logp"), blocked, whole):
        assert a.dtype == b.dtype and torch.equal(a, b), name


@pytest.mark.parametrize("grid", [(8, 127, 8192), (8, 127, 49152), (8, 3, 8192), (3, 1, 1 << 20), (1, 1, 50)])
def test_blocks_tile_the_grid_once_and_never_leave_a_lone_position(grid):
    from bench.logit_stats import _blocks
    batch, length, vocab = grid
    seen = torch.zeros(batch, length, dtype=torch.int64)
    blocks = _blocks(batch, length, vocab)
    for rows, positions in blocks:
        seen[rows, positions] += 1
        n = (rows.stop - rows.start) * (positions.stop - positions.start)
        assert n >= 2 or batch * length == 1
    assert bool((seen == 1).all())


def test_a_compiled_run_that_cannot_compile_stops_instead_of_storing_eager_signals(monkeypatch):
    """Compiled signals are cached under a fingerprint of their own; an eager fallback there would mix numbers."""
    import bench.logit_stats as ls
    from bench.errors import ConfigError

    def broken(*args, **kwargs):
        raise RuntimeError("no C++ compiler found")

    monkeypatch.setenv("PRIVBENCH_COMPILE", "1")
    monkeypatch.setattr(ls, "_compiled", broken)
    with pytest.raises(ConfigError, match="unset PRIVBENCH_COMPILE"):
        stats_from_logits(torch.randn(1, 3, 16), torch.zeros(1, 3, dtype=torch.long))

    def out_of_memory(*args, **kwargs):
        raise torch.OutOfMemoryError("CUDA out of memory")

    monkeypatch.setattr(ls, "_compiled", out_of_memory)  # not a compile failure: the batch back-off must see it
    with pytest.raises(torch.OutOfMemoryError):
        stats_from_logits(torch.randn(1, 3, 16), torch.zeros(1, 3, dtype=torch.long))


def test_bf16_logits_are_scored_in_fp32():
    logits = torch.randn(2, 5, 512).bfloat16()
    tgt = torch.randint(0, 512, (2, 5))
    got = stats_from_logits(logits, tgt)
    ref = _naive(logits.float(), tgt)
    assert got[1].dtype == torch.float32 and (got[1].double() - ref[1]).abs().max() <= 1e-5


def test_compiled_signals_have_a_fingerprint_of_their_own(monkeypatch):
    """Compiled and eager signals differ in the last bits, so they must never share a signal cache or an evaluation
    key; the eager fingerprint stays the one stored runs were keyed by."""
    from bench.hashing import content_hash, module_hash
    from bench.keys import scoring_fingerprint

    monkeypatch.delenv("PRIVBENCH_COMPILE", raising=False)
    eager = scoring_fingerprint("k", max_length=128, bf16=False)
    assert eager == content_hash({"model": "k", "max_length": 128, "bf16": False,
                                  "code": module_hash("bench.lm", "bench.signals", "bench.logit_stats")})
    monkeypatch.setenv("PRIVBENCH_COMPILE", "1")
    assert scoring_fingerprint("k", max_length=128, bf16=False) != eager
