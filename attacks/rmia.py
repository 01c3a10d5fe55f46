"""RMIA, offline (Zarifzadeh et al., 2024), adapted to language models as in Marek et al. 2026,
Algorithm 1.

For a target x and population samples z (attacker-owned, never trained on):

    L_OUT(x) = mean over reference models θ_r of L(x|θ_r)
    L̂(x)     = ½((1 + α)·L_OUT(x) + (1 − α))                 (offline approximation of the IN/OUT mix)
    Ratio_x  = L(x|θ) / L̂(x)
    score(x) = Pr_z[ Ratio_x / Ratio_z < γ ]                    (minority vote on loss ratios, eqs. 5–6)

Reference models are the attacker's shadows: the defense's public recipe applied by the attacker to its own
population slices (from θ where the game releases it, else from the attacker's reference model); for the
pretraining game, the attacker's reference model pretrained on population data. α = 0 as Marek et al. set it
(appendix H); ``alpha: null`` tunes it as Zarifzadeh et al. do, on an attacker-owned shadow pair — shadow i plays
the target (its training slice = members, half of Z = non-members) and shadow j the reference — never on the
evaluation data. With a single reference model (pretraining game) α cannot be tuned and ``alpha_fallback`` is used.

Why γ and Z barely matter: Ratio_z does not depend on x, so the count is a non-increasing step function of
Ratio_x, the same for every target. The score thus ranks targets as −Ratio_x does, only more coarsely; γ, |Z|
and how Ratio_z is computed decide only which targets tie.

Deviation, stated: the count C/|Z| takes only |Z| + 1 values, and ties make TPR at low FPR meaningless
(a known pitfall of other tools). With ``tie_break`` a term below 1/(2|Z|), decreasing in Ratio_x, orders
targets that share a count; it never changes the order between different counts. The score then ranks targets
exactly as −Ratio_x does, so AUC and TPR at any FPR no longer depend on γ or Z (``tie_break: false`` for the
paper's coarse count, e.g. to sweep γ as in its Fig. 14).
"""

from __future__ import annotations

import numpy as np

from bench.attack import Attack
from bench.errors import CapabilityError
from bench.lm import SHADOW_MODELS, TOKEN_LOGPROBS
from bench.metrics import roc_auc
from bench.params import Param
from bench.registry import register_attack


def rmia_scores(target_x: np.ndarray, refs_x: np.ndarray, target_z: np.ndarray, refs_z: np.ndarray, *,
                alpha: float, gamma: float, tie_break: bool = True) -> np.ndarray:
    """Algorithm 1 of Marek et al. 2026, vectorised. ``refs_*`` have shape (k, n)."""
    def ratio(t, refs):
        mixed = 0.5 * ((1.0 + alpha) * refs.mean(axis=0) + (1.0 - alpha))
        return t / np.maximum(mixed, 1e-12)

    rx, rz = ratio(target_x, refs_x), ratio(target_z, refs_z)
    counts = (rx[:, None] / np.maximum(rz[None, :], 1e-12) < gamma).mean(axis=1)
    if tie_break:
        counts = counts + (0.5 / len(rz)) / (1.0 + np.maximum(rx, 0.0))
    return counts


@register_attack("rmia")
class RMIAAttack(Attack):
    description = ("RMIA offline (Marek et al. 2026, Algorithm 1): how often the target's loss ratio against "
                   "attacker shadows beats population samples'; α = 0 as the paper, or tuned on a shadow pair.")
    reference = "Zarifzadeh et al. 2024; Marek et al. 2026, Algorithm 1 and eqs. (5)-(6), appendix B.4"
    requires = frozenset({TOKEN_LOGPROBS, SHADOW_MODELS})
    #: 0.2.0: α = 0 by default (Marek et al., appendix H); 0.1.0 tuned it on shadows (now ``alpha: null``)
    version = "0.2.0"
    params = (
        Param("gamma", float, 1.0, "threshold γ on Ratio_x / Ratio_z", low=0.0, low_inclusive=False),
        Param("alpha", float, 0.0, "scaling α of the offline approximation (Marek et al.: 0); null = tune on a "
              "shadow pair", low=0.0, high=1.0, nullable=True),
        Param("alpha_fallback", float, 0.3, "α when it cannot be tuned (one reference model)", low=0.0, high=1.0),
        Param("alpha_grid", list, [0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0], "α values tried",
              item_type=float),
        Param("tie_break", bool, True, "order targets that share a count by their loss ratio (see module doc)"),
        Param("tune_members", int, 150, "shadow members used to tune α", low=4),
    )

    def _losses(self, model, texts) -> np.ndarray:
        return np.array([s.nll() for s in model.token_signals(texts)])

    def tuned_alpha(self, shadows) -> tuple[float, dict]:
        """α maximising the mean AUC over ordered shadow pairs (i as target, j as reference)."""
        k = len(shadows.models)
        if self.alpha is not None:
            return float(self.alpha), {"alpha": self.alpha, "tuned": False}
        if k < 2:
            return float(self.alpha_fallback), {"alpha": self.alpha_fallback, "tuned": False,
                                                "why": "one reference model"}
        z = list(shadows.held_out)
        half = len(z) // 2
        z_pop, z_out = z[:half], z[half:]
        aucs = {a: [] for a in self.alpha_grid}
        for i in range(k):
            members = list(shadows.members[i][: self.tune_members])
            x = members + z_out
            labels = np.r_[np.ones(len(members)), np.zeros(len(z_out))]
            t_x, t_z = self._losses(shadows.models[i], x), self._losses(shadows.models[i], z_pop)
            for j in range(k):
                if j == i:
                    continue
                r_x = self._losses(shadows.models[j], x)[None, :]
                r_z = self._losses(shadows.models[j], z_pop)[None, :]
                for a in self.alpha_grid:
                    aucs[a].append(roc_auc(labels, rmia_scores(t_x, r_x, t_z, r_z, alpha=a, gamma=self.gamma,
                                                               tie_break=self.tie_break)))
        means = {a: float(np.mean(v)) for a, v in aucs.items()}
        best = max(sorted(means), key=lambda a: means[a])
        return float(best), {"alpha": best, "tuned": True, "shadow_auc": means}

    def score(self, view):
        sh = view.shadows
        if sh is None or not sh.models:
            raise CapabilityError("rmia needs shadow models: enable `reference` in the suite")
        alpha, self.last_tuning = self.tuned_alpha(sh)
        z = list(sh.held_out)
        t_x, t_z = self._losses(view.model, view.texts), self._losses(view.model, z)
        r_x = np.stack([self._losses(m, view.texts) for m in sh.models])
        r_z = np.stack([self._losses(m, z) for m in sh.models])
        return rmia_scores(t_x, r_x, t_z, r_z, alpha=alpha, gamma=self.gamma, tie_break=self.tie_break)
