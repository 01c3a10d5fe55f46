"""A deliberately broken DP defense (test fixture for the audit): it trains with NO noise and NO clipping (the
noise multiplier silently 0), yet reports the ledger a correct run at its ``epsilon`` would have. An audit must
flag its claim as violated."""

import math

from bench.accounting import DPLedger, noise_for_epsilon
from bench.defense import Adapted
from bench.registry import register_defense
from defenses.dp import DPAdapt


@register_defense("broken_dp")
class BrokenDP(DPAdapt):
    """DP-SGD whose noise never reaches the gradients: the claim is the calibrated σ's, the training is σ = 0's."""

    version = "0.0.1"
    description = "DP-SGD with the noise silently dropped, claiming the calibrated ledger (test fixture)."

    def adapt(self, model, data, ctx):
        claimed = self.epsilon
        self.epsilon = math.inf  # the bug: the run takes the non-private path
        try:
            out = super().adapt(model, data, ctx)
        finally:
            self.epsilon = claimed
        t = self._report["train"]
        sigma = noise_for_epsilon(claimed, t["delta"], t["sample_rate"], t["steps"], accountant=self.accountant)
        self._ledger = DPLedger.build(sigma=sigma, sample_rate=t["sample_rate"], steps=t["steps"], clip=self.clip,
                                      delta=t["delta"], n_records=t["n_records"], target_epsilon=claimed,
                                      accountant=self.accountant, grad_sample_mode=self.grad_sample_mode)
        return Adapted(out.model, out.report, self.guarantee())
