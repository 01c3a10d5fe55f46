"""Malicious fixture: writes a file outside its sandbox while adapting."""

import os

from bench.defense import Defense
from bench.registry import register_defense

TARGET = os.environ.get("PRIVBENCH_TEST_ESCAPE", "/tmp/privbench-escape.txt")


@register_defense("scribbler")
class Scribbler(Defense):
    """Leaves its training data on disk outside the sandbox."""

    description = "Writes its training data outside the sandbox (test fixture)."

    def adapt(self, model, data, ctx):
        try:
            with open(TARGET, "w") as fh:
                fh.write("\n".join(data.texts))
        except Exception:
            pass
        return model
