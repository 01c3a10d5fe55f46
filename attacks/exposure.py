"""Canary exposure (Carlini et al., 2019), by sampling and by distribution modelling (Marek et al. 2026,
appendices B.5 and F).

For each target canary the attacker draws fresh reference canaries of the same public format (Marek et al. 2026:
256 freshly generated prefixes on the same carrier; Segal et al. 2025: fresh random-word triples), ranks the target
among them by the model's log-perplexity, and reports

    exposure = log2 |R ∪ {x}| − log2 rank(x)                        (Marek et al. 2026, eq. 7)

(``estimator: sampling``), or −log2 F(x) with F the fitted skew-normal CDF of the references'
log-perplexities (``estimator: skewnorm``, Marek et al. 2026, appendix F). An unmemorised canary has expected exposure
1/ln 2 ≈ 1.44. The references depend only on the public format, the target's text and a seed — never on
membership — so members and non-members are treated alike. Exposure is also a membership score (higher =
member), so the game's AUC applies; the runner adds mean and 95th-percentile exposure of positives and
negatives.
"""

from __future__ import annotations

import numpy as np

from bench.attack import Attack
from bench.errors import CapabilityError
from bench.lm import TOKEN_LOGPROBS
from bench.params import Param
from bench.registry import register_attack

UNMEMORISED_EXPOSURE = 1.0 / np.log(2.0)


def sampling_exposure(target_score: float, reference_scores: np.ndarray) -> float:
    """log2(n+1) − log2(rank), rank = 1 + #references strictly more likely (+½ per tie)."""
    better = float((reference_scores > target_score).sum()) + 0.5 * float((reference_scores == target_score).sum())
    return float(np.log2(len(reference_scores) + 1) - np.log2(1.0 + better))


def skewnorm_exposure(target_score: float, reference_scores: np.ndarray) -> float:
    """−log2 of the fitted skew-normal probability that a reference is at least as likely as the target."""
    from scipy.stats import skewnorm
    a, loc, scale = skewnorm.fit(reference_scores)
    tail = float(skewnorm.sf(target_score, a, loc=loc, scale=scale))
    return float(-np.log2(max(tail, 1e-300)))


@register_attack("exposure")
class ExposureAttack(Attack):
    family = "exposure"
    description = "Canary exposure: rank of the canary among fresh references of its public format (sampling or skew-normal)."
    reference = "Carlini et al. 2019; Marek et al. 2026, eq. (7), appendices B.5 and F; Segal et al. 2025, §5"
    requires = frozenset({TOKEN_LOGPROBS})
    params = (
        Param("estimator", str, "sampling", "sampling (rank among references) or skewnorm (distribution model)",
              choices=("sampling", "skewnorm")),
        Param("n_references", int, None, "references per canary; null = the task's (256 in Marek et al. 2026)",
              low=8, nullable=True),
        Param("seed", int, 0, "seed of the reference draw", low=0),
    )

    def check_task(self, public_format, unit: str) -> None:
        """Canary tasks only: the references are drawn from the targets' public canary format."""
        kind = (public_format or {}).get("kind")
        if kind not in ("canary_prefix", "random_words"):
            raise CapabilityError(f"exposure needs a canary task (canaries, random_word_canaries); this task's public "
                                  f"format is {kind!r}: drop exposure from the suite or use a canary task")

    def _references(self, fmt, text: str) -> list[str]:
        from tasks.canaries import random_word_references_for, references_for
        n = self.n_references or fmt.get("n_references", 256)
        if fmt.get("kind") == "canary_prefix":
            return references_for(fmt, text, n=n, seed=self.seed)
        if fmt.get("kind") == "random_words":
            return random_word_references_for(fmt, text, n=n, seed=self.seed)
        raise CapabilityError(f"exposure needs a canary task (canaries, random_word_canaries); this task's public "
                              f"format is {fmt.get('kind')!r}")

    def score(self, view):
        fmt = view.public_format
        if not fmt:
            raise CapabilityError("exposure needs a canary task: its targets have no public canary format")
        refs = [self._references(fmt, t) for t in view.texts]
        flat = [r for rs in refs for r in rs]
        # log-likelihood of the whole sequence (higher = more likely); all candidates share the format
        ll = {t: float(s.logprobs.astype(np.float64).sum())
              for t, s in zip(view.texts + flat, view.model.token_signals(view.texts + flat))}
        fn = sampling_exposure if self.estimator == "sampling" else skewnorm_exposure
        return np.array([fn(ll[t], np.array([ll[r] for r in rs])) for t, rs in zip(view.texts, refs)])

    def metrics(self, labels, output, ctx) -> list:
        """Mean and 95th-percentile exposure of members, non-members and never-inserted canaries."""
        from bench.metrics import exposure_metrics
        return exposure_metrics(labels, output.scores, never_inserted=ctx.never_inserted)
