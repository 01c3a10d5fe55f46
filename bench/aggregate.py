"""Aggregation rules of the NAF (near access-freeness) family and their per-input bounds k_x.

Pure tensor functions on next-token log-probabilities ``(..., V)`` in log space (fp32 or fp64), used by
:mod:`defenses.naf` to combine the constituents' distributions at every position. Segal et al. 2025 (SCP-Δr):

* ``cp_delta``      Def. 2.2: r ∝ min_i p_i (pointwise minimum, renormalised); k_x under the max divergence
                    Δ(r‖p_i) = max_y log r(y)/p_i(y); tight and equal to log 1/(1 − TV(p, q)) for k = 2 (Thm 2.3).
* ``cp_delta_kl``   Vyas et al. 2023 (Segal et al. §2.5): r ∝ (∏_i p_i)^{1/k} (geometric mean); k_x under KL.
* ``cp_fuse``       Abad et al. 2025 (Segal et al. §2.5, §5.2): r_t ∝ p_1^{b1} · p_2^{b2} with (b1, b2) chosen per
                    position on a grid to minimise max_i [KL(r_t‖p_i) − log p_i(y_<t)] (the history of the
                    continuation so far balances the two models); k_x under KL.
* ``cp_delta_r``    Def. 2.5–2.6: r ∝ min_i rp_i on relative probabilities rp = p / tp, tp = exp(mean_y log p);
                    k_x under the relative max divergence Δr(r‖p_i) = max_y log rr(y)/rp_i(y); equal to
                    D_r = (1/2n) Σ_y |log rp/rq| for k = 2 (Thm 2.7).
* ``scp_delta_r``   Algorithm 1: smooth each RPD towards a base RPD rb, keeping the m tokens with the largest
                    score p(y) · log rp(y)/rb(y) (§4.1), then CP-Δr on the smoothed RPDs; k_x is CP-Δr's bound
                    w.r.t. the smoothed constituents p̃_i ("the resulting model is CP-Δr(p̃, q̃)", §4.1).

Every function works on any number k ≥ 2 of constituents (the paper states them for k = 2), except CP-Fuse,
whose weight search is stated for two models. Log-space throughout (logsumexp), so no probability underflows.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from bench.errors import ConfigError

VARIANTS = ("cp_delta", "cp_delta_kl", "cp_fuse", "cp_delta_r", "scp_delta_r_b", "scp_delta_r_c")
#: the divergence each variant's k_x is measured in
DIVERGENCE = {"cp_delta": "max", "cp_delta_kl": "kl", "cp_fuse": "kl", "cp_delta_r": "relative_max",
              "scp_delta_r_b": "relative_max", "scp_delta_r_c": "relative_max"}


def normalise(logu: torch.Tensor) -> torch.Tensor:
    """log of u / Σ u for an unnormalised log-measure ``logu`` (the CP renormalisation Z)."""
    return logu - torch.logsumexp(logu, dim=-1, keepdim=True)


def floor_log_probs(logp: torch.Tensor, min_log_prob: float | None) -> torch.Tensor:
    """Every token at probability ≥ e^``min_log_prob``, as Segal et al. 2025 (§2.1) require of "all models and
    probability distributions" (e^−20 there, which keeps relative probabilities in [e^−20, e^20], Prop. 4.8). The
    paper does not say how; here by mixing with the uniform distribution, p' = (1 − λ) p + λ/V with λ = V·e^floor,
    which stays normalised and meets the floor exactly. None leaves ``logp`` as it is (naf's ``min_log_prob: null``)."""
    if min_log_prob is None:
        return logp
    vocab = logp.shape[-1]
    log_lam = math.log(vocab) + float(min_log_prob)
    if log_lam >= 0:
        raise ConfigError(f"min_log_prob {min_log_prob} would give a vocabulary of {vocab} tokens more than all the "
                          f"probability mass: use a value below −log V = {-math.log(vocab):.3f} (Segal et al.: −20)")
    return torch.logaddexp(logp + math.log1p(-math.exp(log_lam)), torch.full_like(logp, float(min_log_prob)))


def log_rpd(logp: torch.Tensor) -> torch.Tensor:
    """log rp = log p − log tp with tp = exp(mean_y log p): Def. 2.5 (Σ_y log rp(y) = 0)."""
    return logp - logp.mean(dim=-1, keepdim=True)


def smooth(log_rp: torch.Tensor, log_rb: torch.Tensor, logp: torch.Tensor, m: int) -> torch.Tensor:
    """S_m(rp, rb) of §4.1: rp on the m tokens of largest p(y)·log rp(y)/rb(y), rb elsewhere, times β so that
    Σ_y log S = 0 (returns log S_m). ``log_rb`` broadcasts (a constant base has no position axis)."""
    n = logp.shape[-1]
    if not 1 <= m <= n:
        raise ConfigError(f"smoothing m = {m} must be in [1, vocabulary size {n}]: lower `m`")
    log_rb = log_rb.expand_as(log_rp)
    score = logp.exp() * (log_rp - log_rb)
    keep = torch.zeros_like(log_rp, dtype=torch.bool).scatter_(-1, score.topk(m, dim=-1).indices, True)
    s = torch.where(keep, log_rp, log_rb)
    return s - s.mean(dim=-1, keepdim=True)  # log β = −mean(log s)


def cp_delta(logps: Sequence[torch.Tensor]) -> torch.Tensor:
    """CP-Δ (Def. 2.2): log of min_i p_i(y) / Z."""
    return normalise(torch.stack(list(logps)).amin(dim=0))


def cp_delta_kl(logps: Sequence[torch.Tensor]) -> torch.Tensor:
    """CP-ΔKL (Vyas et al. 2023): log of (∏_i p_i(y))^{1/k} / Z."""
    return normalise(torch.stack(list(logps)).mean(dim=0))


def cp_delta_r(logps: Sequence[torch.Tensor]) -> torch.Tensor:
    """CP-Δr (Def. 2.6): log of min_i rp_i(y) / Z."""
    return normalise(torch.stack([log_rpd(lp) for lp in logps]).amin(dim=0))


def smoothed_rpds(logps: Sequence[torch.Tensor], log_base: torch.Tensor, m: int) -> list[torch.Tensor]:
    """Algorithm 1 lines 1–2: log S_m(rp_i, rb) for every constituent."""
    log_rb = log_rpd(log_base)
    return [smooth(log_rpd(lp), log_rb, lp, m) for lp in logps]


def scp_delta_r(logps: Sequence[torch.Tensor], log_base: torch.Tensor, m: int) -> torch.Tensor:
    """SCP-Δr (Algorithm 1): CP-Δr on the smoothed RPDs; ``log_base`` is θ's log p (-b) or a constant (-c)."""
    return normalise(torch.stack(smoothed_rpds(logps, log_base, m)).amin(dim=0))


def fuse_coefficients(grid_size: int, *, dtype=torch.float32, device=None) -> torch.Tensor:
    """CP-Fuse's weight grid (Abad et al. 2025, released code): ``grid_size`` points on [0, 2) then 2, 3, …, 10,
    for each of the two exponents independently; returns (G², 2)."""
    axis = torch.cat([torch.linspace(0.0, 2.0, grid_size, dtype=dtype, device=device)[:-1],
                      torch.linspace(2.0, 10.0, 9, dtype=dtype, device=device)])
    b1, b2 = torch.meshgrid(axis, axis, indexing="ij")
    return torch.stack([b1.flatten(), b2.flatten()], dim=-1)


def fuse_step(logp1: torch.Tensor, logp2: torch.Tensor, history: torch.Tensor, grid_size: int = 10,
              chunk: int = 64) -> tuple[torch.Tensor, torch.Tensor]:
    """One CP-Fuse position (Abad et al. 2025): r ∝ p1^{b1} p2^{b2}, (b1, b2) on :func:`fuse_coefficients`,
    chosen to minimise max_i [KL(r‖p_i) − log p_i(y_<t)] (``history`` = −log p_i(y_<t) of the continuation so
    far, shape (..., 2); the common term log r(y_<t) does not move the minimiser). Returns (log r, (b1, b2))."""
    coef = fuse_coefficients(grid_size, dtype=logp1.dtype, device=logp1.device)
    pair = torch.stack([logp1, logp2], dim=-1)                                                  # (..., V, 2)
    best_obj = best_idx = None
    for c0 in range(0, coef.shape[0], chunk):  # chunks of the grid bound memory at (..., chunk, V)
        c = coef[c0:c0 + chunk]                                                                 # (C, 2)
        cand = c[:, 0:1] * logp1.unsqueeze(-2) + c[:, 1:2] * logp2.unsqueeze(-2)                # (..., C, V)
        top = cand.amax(dim=-1, keepdim=True)
        z = cand.sub_(top).exp_()                                                               # one exp pass
        total = z.sum(-1, keepdim=True)
        e = torch.matmul(z, pair) / total                                                       # E_r[log p_i]
        lse = (top + total.log()).squeeze(-1)                                                   # log Σ exp(cand)
        # KL(r‖p_i) = Σ_y r (b1 log p1 + b2 log p2 − A − log p_i) = b·E − A − E_i, without a second (C, V) pass
        dot = (e * c).sum(-1)
        obj = torch.maximum(dot - lse - e[..., 0] + history[..., 0:1], dot - lse - e[..., 1] + history[..., 1:2])
        val, idx = obj.min(dim=-1)
        if best_obj is None:
            best_obj, best_idx = val, idx
        else:
            better = val < best_obj  # strict: the first minimiser on the grid wins, as torch.min does
            best_obj = torch.where(better, val, best_obj)
            best_idx = torch.where(better, idx + c0, best_idx)
    b = coef[best_idx]                                                                          # (..., 2)
    logr = normalise(b[..., 0:1] * logp1 + b[..., 1:2] * logp2)
    return logr, b


def cp_fuse_sequence(logp1: torch.Tensor, logp2: torch.Tensor, tokens: torch.Tensor, start: torch.Tensor,
                     grid_size: int = 10) -> torch.Tensor:
    """CP-Fuse over teacher-forced sequences: ``logp_i`` (B, T, V) predict ``tokens`` (B, T); the history counts
    the tokens at positions ≥ ``start`` (B,) (the continuation after the prompt), as generation would."""
    B, T, _ = logp1.shape
    hist = torch.zeros(B, 2, dtype=logp1.dtype, device=logp1.device)
    out = torch.empty_like(logp1)
    pos = torch.arange(T, device=logp1.device)
    for t in range(T):
        logr, _ = fuse_step(logp1[:, t], logp2[:, t], hist, grid_size)
        out[:, t] = logr
        tok = tokens[:, t:t + 1]
        nll = -torch.cat([logp1[:, t].gather(-1, tok), logp2[:, t].gather(-1, tok)], dim=-1)     # (B, 2)
        hist = hist + nll * (pos[t] >= start).to(hist.dtype).unsqueeze(-1)
    return out


def aggregate(variant: str, logps: Sequence[torch.Tensor], *, log_base: torch.Tensor | None = None, m: int = 10
              ) -> torch.Tensor:
    """The released distribution of a position-independent ``variant`` (every variant but ``cp_fuse``)."""
    if variant == "cp_delta":
        return cp_delta(logps)
    if variant == "cp_delta_kl":
        return cp_delta_kl(logps)
    if variant == "cp_delta_r":
        return cp_delta_r(logps)
    if variant in ("scp_delta_r_b", "scp_delta_r_c"):
        if log_base is None:
            raise ConfigError(f"{variant} needs a base distribution: pass log_base")
        return scp_delta_r(logps, log_base, m)
    raise ConfigError(f"unknown NAF variant '{variant}': use one of {list(VARIANTS)}")


def naf_bound(variant: str, logr: torch.Tensor, logps: Sequence[torch.Tensor], *,
              log_base: torch.Tensor | None = None, m: int = 10) -> torch.Tensor:
    """Per-input k_x (Def. 2.1) = max_i Δ(r‖p_i) in the variant's divergence, over the last axis.

    max (CP-Δ): max_y log r/p_i; KL (CP-ΔKL, CP-Fuse): Σ_y r log r/p_i; relative max (CP-Δr, SCP-Δr):
    max_y log rr/rp_i with rr the RPD of r, against the *smoothed* RPDs for SCP-Δr (§4.1)."""
    div = DIVERGENCE.get(variant)
    if div is None:
        raise ConfigError(f"unknown NAF variant '{variant}': use one of {list(VARIANTS)}")
    if div == "max":
        return torch.stack([(logr - lp).amax(-1) for lp in logps]).amax(0)
    if div == "kl":
        pr = logr.exp()
        return torch.stack([(pr * (logr - lp)).sum(-1) for lp in logps]).amax(0)
    if variant.startswith("scp"):
        if log_base is None:
            raise ConfigError(f"{variant} needs a base distribution: pass log_base")
        refs = smoothed_rpds(logps, log_base, m)
    else:
        refs = [log_rpd(lp) for lp in logps]
    lrr = log_rpd(logr)
    return torch.stack([(lrr - ref).amax(-1) for ref in refs]).amax(0)
