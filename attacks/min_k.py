"""Min-K% Prob (Shi et al., 2024): mean log-prob of the K% least likely tokens. Source 004 eq. (3)."""

from __future__ import annotations

import math

import numpy as np

from bench.attack import Attack
from bench.params import Param
from bench.registry import register_attack


def lowest_k_mean(values: np.ndarray, k: float) -> float:
    """Mean of the ceil(k·n) smallest values (at least one)."""
    if values.size == 0:
        return float("nan")
    m = max(1, math.ceil(k * values.size))
    return float(np.sort(values.astype(np.float64))[:m].mean())


@register_attack("min_k")
class MinKAttack(Attack):
    description = "Mean log-probability of the K% tokens with the lowest probability (Shi et al. 2024)."
    reference = "Shi et al. 2024; source 004 A.2 eq. (3); K = 20% as in source 003"
    params = (Param("k", float, 0.2, "fraction of lowest-probability tokens averaged", low=0.0, high=1.0,
                    low_inclusive=False),)

    def score(self, view):
        return np.array([lowest_k_mean(s.logprobs, self.k) for s in view.model.token_signals(view.texts)])
