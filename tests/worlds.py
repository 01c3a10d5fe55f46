"""Shared test worlds: the one tiny suite most integration tests run (tens of seconds on 2 cores), and the
synthetic corpus the attack tests train their tiny models on.

Kept out of the test modules so no test module imports another; ``bench.validate.TINY_SUITE`` and
tests/plugins/tiny.yaml are the submission flow's own tiny worlds (the same task and model, shrunk the same way).
"""

from __future__ import annotations

import random

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


#: the vocabulary of the synthetic corpus (tiny tokenizers and models of the attack tests train on it)
WORDS = ("the a an model data privacy attack member language token train test river mountain city "
         "quickly slowly blue green seven apple network function return value house garden winter "
         "summer reads writes under over between small large bright quiet").split()


def synthetic_corpus(n: int = 200, seed: int = 0) -> list[str]:
    """~200 short synthetic English sentences and Python snippets."""
    rng = random.Random(seed)
    out = []
    for i in range(n // 2):
        out.append(" ".join(rng.choice(WORDS) for _ in range(rng.randint(4, 20))).capitalize() + ".")
        out.append(f"def {rng.choice(WORDS)}_{i}(x, y):\n    return x * {rng.randint(0, 99)} + y"
                   f"  # {rng.choice(WORDS)}\n")
    return out
