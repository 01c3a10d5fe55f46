"""A deliberately broken Hush (test fixture for the secret-level audit): it trains with NO noise (σ silently 0) yet
reports the ledger of the calibrated σ, as a correct run would. The audit on a ``secrets_replaced`` world must
flag its claim as violated."""

import defenses.hush as hush
from bench.registry import register_defense


@register_defense("broken_hush")
class BrokenHush(hush.Hush):
    """Hush whose noise never reaches the gradients: the ledger is the calibrated σ's, the training σ = 0's."""

    version = "0.0.1"
    description = "Hush with the DP-SGD noise silently dropped, claiming the calibrated ledger (test fixture)."

    def adapt(self, model, data, ctx):
        real = hush.hush_train

        def noiseless(*args, **kwargs):  # the bug: sigma is dropped on the way to the optimiser
            return real(*args, **{**kwargs, "sigma": 0.0})

        hush.hush_train = noiseless
        try:
            return super().adapt(model, data, ctx)
        finally:
            hush.hush_train = real
