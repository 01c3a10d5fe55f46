"""Min-K% Prob (Shi et al., 2024): mean log-prob of the K% least likely tokens. Marek et al. 2026,
appendix A.2, eq. (3).

Marek et al. grid-search K; a suite sweeps it with ``{name: min_k, sweep: {k: [0.05, 0.1, 0.2, 0.5]}}``
(bench/suite.py), each K its own labelled entry, ``min_k(k=0.1)``.
"""

from __future__ import annotations

import math

import numpy as np

from bench.attack import Attack
from bench.params import Param
from bench.registry import register_attack


def n_lowest(k: float, n: int) -> int:
    """⌈k·n⌉ tokens (at least one), with k read as the decimal written in the suite.

    Why the rounding: in binary floating point 0.1·30 = 3.0000000000000004, whose ceiling would average 4 of 30
    tokens instead of 3; swept K values (0.05, 0.1, 0.3, …) hit this often.
    """
    return max(1, math.ceil(round(k * n, 9)))


def lowest_k_mean(values: np.ndarray, k: float) -> float:
    """Mean of the ceil(k·n) smallest values (at least one)."""
    if values.size == 0:
        return float("nan")
    m = n_lowest(k, values.size)
    return float(np.sort(values.astype(np.float64))[:m].mean())


@register_attack("min_k")
class MinKAttack(Attack):
    version = "0.2.0"  # 0.2.0: exact ⌈k·n⌉ token count (0.1·30 no longer rounds up to 4)
    description = "Mean log-probability of the K% tokens with the lowest probability (Shi et al. 2024)."
    reference = ("Shi et al. 2024; Marek et al. 2026, appendix A.2, eq. (3); K = 20% as in "
                 "GUARD (anonymous preprint, 2025)")
    params = (Param("k", float, 0.2, "fraction of lowest-probability tokens averaged", low=0.0, high=1.0,
                    low_inclusive=False),)

    def score(self, view):
        return np.array([lowest_k_mean(s.logprobs, self.k) for s in view.model.token_signals(view.texts)])
