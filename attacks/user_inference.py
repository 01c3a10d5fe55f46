"""User inference (Kandpal et al. 2024, section 3, eq. 4): mean log-likelihood ratio of a user's samples.

Given m samples x^(1..m) the attacker knows of user u (held-aside documents, never trained on),
Kandpal et al. test H'_0: samples ~ p_ref against H'_1: samples ~ p_θ with the log-likelihood ratio

    T(x^(1..m)) = Σ_i log p_θ(x^(i)) − log p_ref(x^(i))                     (eq. 4)

and normalises by m, the number of samples (which varies per user): the score is T̂ = T / m.
log p(x) is the log-likelihood of the whole sequence, Σ_t log p(x_t | x_<t), not a per-token mean
(Kandpal et al. define p_θ(x) = Π_t p_θ(x_t | x_<t), section 3); ``normalize: token`` divides each sample's
ratio by its token count instead, a variant (stated deviation when chosen). Tokens are those the model scores: the
first token has no context and is not scored, and a text longer than the context keeps its first tokens.

The reference is θ (the pretrained model) where the game releases it — Kandpal et al.'s main choice,
"the pre-trained LLM as a reference model" (section 4.1; appendix D, Table 3) — else the attacker's own reference
model trained on population data (their Table 3: an independently trained model also works), via
:meth:`bench.game.AttackerView.calibration_model`.

The attack scores units itself (``scores_units``). On a record-level game it would have no user samples:
it declares ``user_samples`` and the game refuses it there.
"""

from __future__ import annotations

import numpy as np

from bench.attack import Attack
from bench.lm import REFERENCE_MODEL, TOKEN_LOGPROBS, USER_SAMPLES
from bench.params import Param
from bench.registry import register_attack


def sample_llr(target_logprobs: list[np.ndarray], ref_logprobs: list[np.ndarray], *, normalize: str) -> np.ndarray:
    """log p_θ(x) − log p_ref(x) per sample, from per-token log-probs (float64 sums)."""
    out = np.empty(len(target_logprobs), dtype=np.float64)
    for i, (t, r) in enumerate(zip(target_logprobs, ref_logprobs)):
        d = float(t.astype(np.float64).sum() - r.astype(np.float64).sum())
        if normalize == "token":
            d /= max(len(t), 1)
        out[i] = d
    return out


@register_attack("user_inference")
class UserInferenceAttack(Attack):
    description = ("User inference: mean over a user's known samples of log p_θ'(x) − log p_ref(x); reference = "
                   "θ if released, else the attacker's reference model (Kandpal et al. 2024).")
    reference = "Kandpal et al. 2024, section 3, eq. (4), normalised by the number of samples m"
    requires = frozenset({TOKEN_LOGPROBS, REFERENCE_MODEL, USER_SAMPLES})
    scores_units = True
    params = (Param("normalize", str, "sequence", "sequence: log p(x) of the whole sample (Kandpal et al. 2024, "
                    "eq. 4); token: "
                    "divided by its token count (variant)", choices=("sequence", "token")),)

    def score(self, view):
        samples = [t.samples or (t.text,) for t in view.targets]
        flat = [s for unit in samples for s in unit]
        owner = np.repeat(np.arange(len(samples)), [len(u) for u in samples])
        tgt = [s.logprobs for s in view.model.token_signals(flat)]
        ref = [s.logprobs for s in view.calibration_model().token_signals(flat)]
        llr = sample_llr(tgt, ref, normalize=self.normalize)
        return np.bincount(owner, weights=llr, minlength=len(samples)) / np.bincount(owner, minlength=len(samples))
