"""Shared test worlds: the one tiny suite most integration tests run (tens of seconds on 2 cores).

Kept out of the test modules so no test module imports another; ``bench.validate.TINY_SUITE`` and
tests/plugins/tiny.yaml are the submission flow's own tiny worlds (the same task and model, shrunk the same way).
"""

from __future__ import annotations

TINY = {
    "name": "tiny",
    "seeds": [0],
    "tasks": [{"name": "mini_pile", "params": {"max_chars_per_source": 400_000}}],
    "models": [{"name": "nano", "params": {"pretrain_tokens": 6000, "reference_tokens": 4000}}],
    "defenses": [{"name": "finetune", "params": {"epochs": 1}}],
    "attacks": ["loss", "min_k"],
    "games": ["adapt", "null"],
    "world": {"n_per_group": 8, "n_null": 16, "adapt_background": 8},
    "metrics": {"n_boot": 50},
    "utility": {"n_heldout": 20},
}
