"""Malicious fixture: never finishes. It marks that it started (in its working dir), then loops on import."""

from pathlib import Path

from bench.defense import Defense
from bench.registry import register_defense

Path("loop-started").write_text("the plugin began its endless loop")
n = 0
while True:
    n += 1


@register_defense("forever")
class Forever(Defense):  # never reached
    """Loops forever."""
