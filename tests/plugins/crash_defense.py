"""Fixture: a buggy defense that raises while adapting."""

from bench.defense import Defense
from bench.registry import register_defense


@register_defense("crasher")
class Crasher(Defense):
    """Raises a ZeroDivisionError."""

    description = "Raises in adapt (test fixture)."

    def adapt(self, model, data, ctx):
        return model.weight / 0 if hasattr(model, "weight") else 1 / 0
