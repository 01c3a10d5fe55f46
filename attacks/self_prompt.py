"""Self-prompt calibration (Fu et al., NeurIPS 2024, "SPV-MIA"), as GUARD (anonymous preprint, 2025) uses it
(§4.1, appendix A.6).

The attacker has no data from the fine-tuning distribution, so it asks the released model for some: it prompts
θ' with short prefixes of its own population records, collects the greedy continuations, and fine-tunes a copy
of its calibration model on them. That self-prompted reference θ_sp approximates "a model fine-tuned on the same
distribution but not on x", and the score is the calibrated likelihood

    score(x) = log p_θ'(x) − log p_θsp(x) = L(x | θ_sp) − L(x | θ')        (mean token log-likelihoods)

(SPV-MIA's likelihood-ratio form with the self-prompted reference; ``mode: ratio`` gives
−L(x|θ')/L(x|θ_sp) as in Marek et al. 2026, eq. 4). Higher = member.

Deviations, stated:

* SPV-MIA's probabilistic-variation term (the second-order difference of the likelihood under paraphrases made
  by a mask-filling model) is omitted: it needs a separate T5-style mask filler that the offline benchmark does
  not have. The likelihood-ratio form above is SPV-MIA's score with the variation replaced by the likelihood.
* The copy that is fine-tuned is the attacker's calibration model: θ where the game releases it (joint and
  post-adaptation games), else the attacker's reference model trained on population data. The GUARD
  paper fine-tunes the reference for 4 epochs (the default here); its "extreme" variant trains on the
  target's own fine-tuning data, which an attacker does not have and privbench does not give it.
* Generation is greedy (the model API's generate); SPV-MIA samples. Distinct population prefixes give distinct
  continuations, and the benchmark stays deterministic.
* Sizes fit the smoke-sized world: by default 200 prompts of 8 tokens and 48 generated tokens each, not the
  paper's thousands of samples.
"""

from __future__ import annotations

import numpy as np

from bench.attack import Attack
from bench.errors import CapabilityError
from bench.hashing import content_hash
from bench.lm import FINETUNE_REFERENCE, GENERATE, POPULATION, TOKEN_LOGPROBS
from bench.params import Param
from bench.registry import register_attack


@register_attack("self_prompt")
class SelfPromptAttack(Attack):
    description = ("Self-prompt calibration (SPV-MIA): likelihood under the released model over that under a copy "
                   "of the attacker's model fine-tuned on the released model's own generations.")
    reference = ("Fu et al. 2024 (SPV-MIA, self-prompt reference); GUARD (anonymous preprint, 2025), §4.1 and "
                 "appendix A.6: score = L(x|θ_sp) − L(x|θ'), probabilistic-variation term omitted")
    requires = frozenset({TOKEN_LOGPROBS, GENERATE, POPULATION, FINETUNE_REFERENCE})
    params = (
        Param("n_prompts", int, 200, "population records whose prefixes prompt the released model", low=1),
        Param("prompt_tokens", int, 8, "tokens of each population record used as the prompt", low=1),
        Param("generate_tokens", int, 48, "tokens generated per prompt", low=1),
        Param("epochs", float, 4.0, "fine-tuning passes over the generations (GUARD, anonymous preprint 2025, "
              "appendix A.6: 4)", low=0.0, low_inclusive=False),
        Param("lr", float, 1e-3, "AdamW learning rate of the reference fine-tune", low=0.0, low_inclusive=False),
        Param("batch_size", int, 16, "fine-tuning batch size", low=1),
        Param("include_prompt", bool, True, "train on prompt + generation (else the generation alone)"),
        Param("mode", str, "difference", "difference: L(x|θ_sp) − L(x|θ') (SPV-MIA); ratio: −L(x|θ')/L(x|θ_sp)",
              choices=("difference", "ratio")),
        Param("seed", int, 0, "which population records prompt, and the fine-tuning seed", low=0),
    )

    def __init__(self, **params) -> None:
        super().__init__(**params)
        self._generated: dict[str, list[str]] = {}  # per released model: games that share θ' generate once

    def self_prompt_texts(self, view) -> list[str]:
        """The training texts of θ_sp: the released model's continuations of population prefixes."""
        pop = [t for t in (view.population or ()) if t.strip()]
        if not pop:
            raise CapabilityError("self_prompt needs attacker-owned population data for its prompts")
        rng = np.random.default_rng(self.seed)
        idx = rng.choice(len(pop), size=min(self.n_prompts, len(pop)), replace=False)
        prompts = [view.model.split_at_token(pop[int(i)], self.prompt_tokens)[0] for i in idx]
        key = content_hash(view.model.fingerprint, prompts, self.generate_tokens)
        if key not in self._generated:
            self._generated[key] = view.model.generate(prompts, self.generate_tokens)
        gens = self._generated[key]
        return [p + g if self.include_prompt else g for p, g in zip(prompts, gens) if g.strip()]

    def self_prompted_reference(self, view):
        if view.trainer is None:
            raise CapabilityError("self_prompt needs a model to fine-tune: enable `reference` in the suite")
        return view.trainer.finetune(self.self_prompt_texts(view), epochs=self.epochs, lr=self.lr,
                                     batch_size=self.batch_size, seed=self.seed)

    def score(self, view):
        ref = self.self_prompted_reference(view)
        target = np.array([s.nll() for s in view.model.token_signals(view.texts)])
        calib = np.array([s.nll() for s in ref.token_signals(view.texts)])
        if self.mode == "ratio":
            return -target / np.maximum(calib, 1e-8)
        return calib - target
