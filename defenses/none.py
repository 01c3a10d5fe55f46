"""The `none` anchor: release θ unchanged, so a ranking has its zero-utility, zero-adaptation-leakage end.

A defense can look private by not adapting at all; `none` is that point made explicit. Next to `finetune` (the
full-utility, undefended end) it anchors utility retained, (L(θ) − L(θ′)) / (L(θ) − L(θ′_finetune)): `none`
retains 0 %, and with θ′ = θ every adaptation-stage game is at chance (tests/test_fair_game.py checks that the
adapt game of θ′ = θ is at chance even when pretraining memorised strongly).
"""

from __future__ import annotations

from bench.defense import Adapted, Defense, TrainContext
from bench.registry import register_defense


@register_defense("none")
class NoAdaptation(Defense):
    description = "Releases the pretrained θ unchanged (no adaptation): the zero-utility anchor of every track."
    version = "1.0.0"

    def adapt(self, model, data, ctx: TrainContext):
        return Adapted(model, {"train": {"steps": 0, "seconds": 0.0}, "trainable_params": 0})
