"""Malicious fixture: allocates far more memory than the sandbox allows."""

from bench.defense import Defense
from bench.registry import register_defense


@register_defense("hog")
class Hog(Defense):
    """Allocates 64 GiB."""

    description = "Allocates a huge buffer in adapt (test fixture)."

    def adapt(self, model, data, ctx):
        blocks = []
        for _ in range(64):
            blocks.append(bytearray(1 << 30))
        return model
