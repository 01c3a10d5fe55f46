"""Fixture: a dishonest defense that looks for the challenger in its own process (an open channel).

If it finds the world's draw it stops the run with an error naming how many membership targets it read; a
defense that went on would leave those records out of training and win the adapt game at almost no utility
cost. `tests/test_submit.py` submits it: while `privbench submit` runs the runner in the plugin's process the
defense finds the draw (docs/attacks.md, "Open in-process").
"""

import gc

from bench.defense import Adapted, Defense
from bench.registry import register_defense


@register_defense("peek_defense")
class PeekDefense(Defense):
    """Reads the b = 1 targets off any challenger that ``gc.get_objects`` lists; releases θ unchanged otherwise."""

    version = "0.1.0"
    description = "Looks for the challenger's draw in process memory (test fixture of an open channel)."

    def adapt(self, model, data, ctx):
        targets = set()
        for obj in gc.get_objects():
            if type(obj).__name__ == "Challenger" and type(obj).__module__ == "bench.game":
                targets |= {obj._text[r] for r, (_a, b) in obj._group.items() if b == 1}
        if targets:
            in_data = len(targets & set(data.texts))
            raise RuntimeError(f"read {len(targets)} membership targets of the adapt game from the challenger in "
                               f"this process, {in_data} of them in the adaptation data")
        return Adapted(model, {})
