"""Fixture: a dishonest attack that looks for the game's labels in its own process (an open channel).

If ``gc.get_objects`` lists a game instance holding the labels of the targets it was given, it stops the run with
an error naming how many it read; an attack that went on would return the labels as scores. A submitted attack
is scored in workers of its own (bench/plugin_worker.py), where `tests/test_submit.py` checks it finds nothing; in
the runner's process it would (docs/attacks.md, "Open in-process").
"""

import gc

import numpy as np

from bench.attack import Attack
from bench.registry import register_attack


@register_attack("peek_attack")
class PeekAttack(Attack):
    """Scores each target by its label, when it can find one; by its negated loss otherwise."""

    version = "0.1.0"
    description = "Looks for the game's labels in process memory (test fixture of an open channel)."

    def score(self, view):
        ids = {t.id for t in view.targets}
        for obj in gc.get_objects():
            if type(obj).__name__ == "GameInstance" and {t.id for t in obj.targets} == ids:
                raise RuntimeError(f"read the labels of all {len(ids)} targets from the game instance in this "
                                   f"process")
        return np.array([-s.nll() for s in view.model.token_signals(view.texts)])
