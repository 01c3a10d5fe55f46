"""Min-K%++ (Zhang et al., 2024): Min-K% on log-probs standardised by the model's own distribution."""

from __future__ import annotations

import numpy as np

from attacks.min_k import lowest_k_mean
from bench.attack import Attack
from bench.params import Param
from bench.registry import register_attack


def min_k_pp_token_scores(logprobs: np.ndarray, mu: np.ndarray, sigma2: np.ndarray) -> np.ndarray:
    """(log p(x_t) − μ_t) / σ_t with μ_t, σ_t² the mean and variance of log p(z), z ~ p(·|x_<t)."""
    sigma = np.sqrt(np.maximum(sigma2.astype(np.float64), 1e-12))
    return (logprobs.astype(np.float64) - mu.astype(np.float64)) / sigma


@register_attack("min_k_pp")
class MinKPlusPlusAttack(Attack):
    version = "0.2.0"  # 0.2.0: exact ⌈k·n⌉ token count (0.1·30 no longer rounds up to 4)
    description = "Min-K% over tokens standardised by the mean and std of log p under the model (Zhang et al. 2024)."
    reference = "Zhang et al. 2024 (Min-K%++); GUARD (anonymous preprint, 2025), §4.1, K = 20%"
    params = (Param("k", float, 0.2, "fraction of lowest standardised tokens averaged", low=0.0, high=1.0,
                    low_inclusive=False),)

    def score(self, view):
        return np.array([lowest_k_mean(min_k_pp_token_scores(s.logprobs, s.mu, s.sigma2), self.k)
                         for s in view.model.token_signals(view.texts)])
