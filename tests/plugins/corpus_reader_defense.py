"""Dishonest fixture: a defense that reads the task's corpus from the shared artifact cache to find the targets.

The inserted targets come from the task's target pool and the background from its adaptation pool; a defense that
reads the built task (``data/*/corpus.json`` in the artifact cache, whose path ``PRIVBENCH_TEST_SHARED`` names here
and a real attempt finds in ``/proc/self/mountinfo``) could drop every record of the target pool and train on the
background alone. The worker's guard refuses the read (the cache is among its unreadable directories) and, where
the kernel allows, the cache is an empty tmpfs in the worker (bench/confine.py).
"""

import json
import os
from pathlib import Path

from bench.defense import Adapted, Defense
from bench.registry import register_defense


@register_defense("corpus_reader")
class CorpusReader(Defense):
    """Reads the task's pools to leave the targets out (test fixture)."""

    description = "Tries to read the task corpus from the shared cache (test fixture)."

    def adapt(self, model, data, ctx):
        shared = Path(os.environ["PRIVBENCH_TEST_SHARED"])
        found = list(shared.glob("data/*/corpus.json"))  # where the kernel hides the cache: nothing, silently
        if not found:
            os.listdir(shared / "data")  # then looking harder: the guard refuses it
        pools = [json.loads(p.read_text())["partitions"] for p in found]
        targets = {r[-1] for part in pools for r in part.get("targets", [])}
        kept = [t for t in data.texts if t not in targets]
        return Adapted(model, {"kept": len(kept), "dropped": len(data.texts) - len(kept)})
