"""Secret loss (Panda, Tang, Nasr, Choquette-Choo and Mittal 2025): the loss of a canary's secret tokens alone, given
its public prefix.

    score(x) = −L(secret | prefix, θ') = (1/|s|) Σ_t log p(s_t | prefix, s_<t)

The split into prefix and secret comes from the task's public format only (:func:`tasks.audit_canaries.split_secret`):
audit canaries (``audit_canaries``) split at their separator; random-word canaries score the three words after the
template's fixed words; canary prefixes (Marek et al. 2026) score the random prefix alone; secret carriers (Ganesh et
al. 2025) score the secret after the text before it, found from the public templates and formats; records with no public
secret (ordinary records) score the whole record, where this is the ``loss`` attack (Yeom et al. 2018).
"""

from __future__ import annotations

import numpy as np

from bench.attack import Attack
from bench.lm import TOKEN_LOGPROBS
from bench.registry import register_attack


@register_attack("secret_loss")
class SecretLossAttack(Attack):
    description = ("Negative mean loss of a canary's secret tokens given its public prefix (Panda et al. 2025); "
                   "the whole record where the task's format names no secret.")
    reference = "Panda, Tang, Nasr, Choquette-Choo, Mittal 2025 (loss on the secret only); Yeom et al. 2018"
    requires = frozenset({TOKEN_LOGPROBS})

    def score(self, view):
        from tasks.audit_canaries import split_secret

        parts = [split_secret(view.public_format, t) for t in view.texts]
        scores = np.empty(len(parts))
        by_context: dict[str | None, list[int]] = {}
        for i, (context, _) in enumerate(parts):
            by_context.setdefault(context, []).append(i)
        for context, idx in by_context.items():
            signals = view.model.token_signals([parts[i][1] for i in idx], context)
            for i, s in zip(idx, signals):
                scores[i] = -s.nll()
        return scores
