"""Matched utility: tune a defense's training length or learning rate to a target validation loss.

Marek et al. 2026 compare adaptations at similar validation loss; a defense that barely trains looks private
for free. A defense entry in a suite may carry ``match: {param, grid, target_loss}`` (or ``target_defense``:
the label of another, unmatched defense of the suite, whose validation loss in the same world is the target,
so two defenses are compared at the same utility): the runner adapts
θ once per grid value (each cached like any model), measures the loss on validation records held out
from the task's held-out partition — disjoint from the records the reported utility is measured on,
and never a target — and keeps the value whose loss is closest to the target. The choice and the loss
reached are stored with the run's utility rows.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from bench.errors import ConfigError
from bench.params import Param, validate_params

MATCH_PARAMS = (
    Param("param", str, "epochs", "defense parameter to tune (e.g. epochs, lr)"),
    Param("grid", list, [1, 2, 4, 8], "values tried for it", item_type=float),
    Param("target_loss", float, None, "validation loss (nats/token) to reach", low=0.0, low_inclusive=False,
          nullable=True),
    Param("target_defense", str, None, "or: the label of another defense of the suite whose validation loss in the "
          "same world is the target (compare two defenses at the same utility)", nullable=True),
    Param("n_validation", int, 100, "held-out records used for tuning, after those the utility is measured on",
          low=1),
)


def parse_match(raw: Any, defense_name: str, defense_params: dict, create: Callable[[str, dict], Any],
                suite: str) -> dict[str, Any]:
    """Validate a ``match`` mapping: its parameter must exist on the defense and every grid value must be valid."""
    if not isinstance(raw, dict):
        raise ConfigError(f"suite '{suite}': 'match' of defense '{defense_name}' must be a mapping like "
                          f"{{param: epochs, grid: [1, 2, 4], target_loss: 5.0}}")
    if ("target_loss" in raw) == ("target_defense" in raw):
        raise ConfigError(f"suite '{suite}': 'match' of defense '{defense_name}' needs exactly one of target_loss (the "
                          f"validation loss in nats/token to reach) and target_defense (the label of a defense whose "
                          f"validation loss to reach)")
    m = validate_params(f"suite '{suite}' match of '{defense_name}'", MATCH_PARAMS, raw)
    if not m["grid"]:
        raise ConfigError(f"suite '{suite}': 'match.grid' of defense '{defense_name}' is empty: list values to try")
    for v in m["grid"]:  # each candidate must be a valid configuration of the defense
        create(defense_name, {**defense_params, m["param"]: _native(v)})
    return m


def _native(v: float) -> int | float:
    return int(v) if float(v).is_integer() else float(v)


def pick(candidates: list[tuple[Any, float]], target: float) -> tuple[Any, float]:
    """The (value, loss) closest to the target loss; ties go to the earlier (cheaper) grid value."""
    return min(candidates, key=lambda c: abs(c[1] - target))


def brackets(losses: list[float], target: float) -> bool:
    """Whether the grid's losses lie on both sides of the target: if not, the closest value sits at the grid's edge
    and the defense is *not* at the target utility (a finer or wider grid is needed)."""
    return min(losses) <= target <= max(losses)


def candidate_params(match: dict, params: dict) -> list[dict]:
    return [{**params, match["param"]: _native(v)} for v in match["grid"]]
