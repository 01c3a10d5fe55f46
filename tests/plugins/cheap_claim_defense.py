"""A dishonest defense (test fixture): it spends real time in ``adapt`` but reports a training time of 1 ms, and
stops the clock of its own process, so that the worker's timing of ``adapt`` reads zero as well. The board's cost
column must show what privbench measured on its side of the worker's pipe, not either number."""

import time

from bench.defense import Adapted, Defense
from bench.registry import register_defense

SPENT_S = 2.0


@register_defense("cheap_claim")
class CheapClaim(Defense):
    """Releases θ unchanged after a deliberate pause, and claims to have cost nothing."""

    version = "0.1.0"
    description = "Claims 1 ms of training and freezes its process's clock (test fixture)."

    def adapt(self, model, data, ctx):
        time.sleep(SPENT_S)
        frozen = time.perf_counter()
        time.perf_counter = lambda: frozen  # the worker times adapt with this clock: it now reads 0 s
        return Adapted(model, {"train": {"steps": 0, "seconds": 0.001}, "trainable_params": 0})
