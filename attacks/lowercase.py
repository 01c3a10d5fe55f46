"""Lowercase attack (Carlini et al., 2021): perplexity of the text relative to its lowercased form.

Carlini et al. compare the perplexity of a sample before and after
lowercasing; a memorised sample is much more likely in its original casing.
We use the log of that perplexity ratio, L(x) − L(lower(x)), negated so that
higher = member (a monotone transform of the ratio: same AUC and TPR@FPR).
GUARD (anonymous preprint, 2025), §4.1, lists it among the reference-free attacks.
"""

from __future__ import annotations

import numpy as np

from bench.attack import Attack
from bench.registry import register_attack


@register_attack("lowercase")
class LowercaseAttack(Attack):
    description = "Loss of the text minus loss of its lowercased copy (Carlini et al. 2021); low = member."
    reference = ("Carlini et al. 2021; GUARD (anonymous preprint, 2025), §4.1: "
                 "score = L(lower(x)|θ) − L(x|θ) = log(ppl(lower x)/ppl(x))")

    def score(self, view):
        orig = np.array([s.nll() for s in view.model.token_signals(view.texts)])
        lower = np.array([s.nll() for s in view.model.token_signals([t.lower() for t in view.texts])])
        return lower - orig
