"""Loss attack (Yeom et al., 2018): members have lower loss.

As in Marek et al. 2026, appendix A.2, and GUARD (anonymous preprint, 2025), §4.1.
"""

from __future__ import annotations

import numpy as np

from bench.attack import Attack
from bench.registry import register_attack


@register_attack("loss")
class LossAttack(Attack):
    description = "Negative mean token loss of the target under the released model (Yeom et al. 2018)."
    reference = "Yeom et al. 2018; GUARD (anonymous preprint, 2025), §4.1: score = -L(x|θ) = mean_t log p(x_t|x_<t)"

    def score(self, view):
        return np.array([-s.nll() for s in view.model.token_signals(view.texts)])
