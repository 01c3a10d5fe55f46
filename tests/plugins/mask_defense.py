"""Fixture: a pretraining-stage defense with both hooks, for the worker test (tests/test_plugin_worker.py)."""

import torch

from bench.defense import Adapted, Defense, Filtered
from bench.registry import register_defense


@register_defense("even_tokens")
class EvenTokens(Defense):
    """Drops documents that contain 'x' and keeps only even token ids in the pretraining loss."""

    version = "0.1.0"
    description = "Both pretraining hooks, trivially (test fixture)."
    stages = frozenset({"pretrain", "adapt"})

    def pretrain_texts(self, docs):
        kept = [d for d in docs if "x" not in d]
        return Filtered(kept, {"dropped": len(docs) - len(kept)})

    def pretrain_loss_mask(self, input_ids):
        return input_ids % 2 == 0

    def adapt(self, model, data, ctx):
        return Adapted(model, {})
