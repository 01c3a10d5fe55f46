"""Reference (Ratio) attack (Carlini et al., 2021): target loss calibrated by a reference model's loss.

Marek et al. 2026, appendix A.2, eq. (4): Ref(x) = L(x|θ) / L(x|θ_ref); a member has a low ratio,
so the score is its negation. The reference is the released base model θ where
the game releases it (joint and post-adaptation games), else the attacker's own
reference model trained on population data.
"""

from __future__ import annotations

import numpy as np

from bench.attack import Attack
from bench.errors import CapabilityError
from bench.lm import REFERENCE_MODEL, TOKEN_LOGPROBS
from bench.params import Param
from bench.registry import register_attack


@register_attack("reference")
class ReferenceAttack(Attack):
    description = "Loss ratio between the released model and a reference model (base θ if released, else the attacker's)."
    reference = "Carlini et al. 2021; Marek et al. 2026, appendix A.2, eq. (4): score = -L(x|θ)/L(x|θ_ref)"
    requires = frozenset({TOKEN_LOGPROBS, REFERENCE_MODEL})
    params = (
        Param("calibrate_with", str, "auto", "auto: base θ if the game releases it, else the attacker's reference",
              choices=("auto", "base", "reference")),
        Param("mode", str, "ratio", "ratio (Marek et al. 2026, eq. 4) or difference L(x|θ) - L(x|θ_ref)",
              choices=("ratio", "difference")),
    )

    def _reference_model(self, view):
        if self.calibrate_with == "base":
            if view.base is None:
                raise CapabilityError(f"reference attack with calibrate_with=base: game '{view.game}' does not "
                                      f"release θ; use calibrate_with=auto")
            return view.base
        if self.calibrate_with == "reference":
            if view.reference is None:
                raise CapabilityError("reference attack with calibrate_with=reference: no attacker reference model")
            return view.reference
        return view.calibration_model()

    def score(self, view):
        target = np.array([s.nll() for s in view.model.token_signals(view.texts)])
        ref = np.array([s.nll() for s in self._reference_model(view).token_signals(view.texts)])
        if self.mode == "ratio":
            return -target / np.maximum(ref, 1e-8)
        return -(target - ref)
