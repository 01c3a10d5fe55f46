"""A well-behaved submitted attack: the median token log-probability (test fixture)."""

import numpy as np

from bench.attack import Attack
from bench.registry import register_attack


@register_attack("median_logprob")
class MedianLogprob(Attack):
    """Score = median over tokens of log p(x_t | x_<t): a loss attack that ignores a few outlier tokens."""

    version = "0.1.0"
    description = "Median token log-probability under the released model (test fixture)."

    def score(self, view):
        return np.array([float(np.median(s.logprobs)) for s in view.model.token_signals(view.texts)])
