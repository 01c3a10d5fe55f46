"""Attack contract: declare capabilities, return one score per target (higher = member).

Unit-level games (a user or a secret per target, :mod:`bench.units`): a record-level attack runs unchanged
on the unit's samples and the unit's score is the mean of its sample scores (source 002 averages
example-level statistics, eq. 4); an attack that scores units itself sets ``scores_units = True`` and reads
``Target.samples``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, ClassVar

import numpy as np

from bench.errors import PluginError
from bench.lm import ALL_CAPABILITIES, TOKEN_LOGPROBS
from bench.plugin import Plugin

if TYPE_CHECKING:
    from bench.game import AttackerView


class Attack(Plugin):
    """A membership-inference attack. Subclasses implement :meth:`score`."""

    kind: ClassVar[str] = "attack"
    family: ClassVar[str] = "mia"
    requires: ClassVar[frozenset[str]] = frozenset({TOKEN_LOGPROBS})
    reference: ClassVar[str] = ""   # the paper and equation the score follows
    #: True: :meth:`score` scores unit targets (users, secrets) itself from ``Target.samples``; False: the
    #: runner scores each sample as a record and averages per unit (bench.units.score_units)
    scores_units: ClassVar[bool] = False

    def score(self, view: AttackerView) -> Sequence[float]:  # pragma: no cover - interface
        raise NotImplementedError

    @classmethod
    def info(cls) -> dict:
        d = super().info()
        d.update(family=cls.family, requires=sorted(cls.requires), reference=cls.reference)
        return d


def _score_in_fresh_thread(attack: Attack, box: dict):
    """``attack.score(view)`` on a new thread, with the view handed over through ``box`` (emptied on pickup).

    Why: no frame of the runner (which holds the labels) is then on the attack's own stack, so
    ``sys._getframe``/``inspect.stack`` walks end at the thread start, and no frame of the caller holds the view,
    so ``gc.get_referrers(view)`` does not lead back to the runner. Not a sandbox: docs/attacks.md lists what
    only process isolation closes (``gc.get_objects``, ``sys._current_frames``, closure cells).
    """
    import threading

    out: dict = {}

    def call() -> None:
        a, v = box.pop("attack"), box.pop("view")
        try:
            out["scores"] = a.score(v)
        except BaseException as exc:  # re-raised on the caller's thread
            out["exc"] = exc

    # the attack scores as a shallow copy: the suite's instance is referenced by the suite and the runner, so
    # gc.get_referrers(self) on it would lead there; state the attack keeps (e.g. RMIA's tuning) is copied back
    import copy
    try:
        twin = copy.copy(attack)
    except Exception:  # an attack that cannot be copied scores as itself
        twin = attack
    box["attack"] = twin
    try:
        t = threading.Thread(target=call, name="privbench-attack", daemon=True)
        t.start()
        t.join()
    finally:
        if twin is not attack and hasattr(twin, "__dict__"):
            vars(attack).update(vars(twin))
        del twin
    if "exc" in out:
        raise out.pop("exc")
    return out.pop("scores")


def run_attack(attack: Attack, view: AttackerView) -> np.ndarray:
    """Call an attack and enforce its contract: no exception escapes unnamed, one finite score per target.

    On a unit game an attack without ``scores_units`` scores the units' samples as records and each unit
    gets the mean of its samples' scores.
    """
    from bench.units import is_unit_view, score_units
    if is_unit_view(view) and not getattr(attack, "scores_units", False):
        return score_units(attack, view, _run_checked)
    return _run_checked(attack, view)


def _run_checked(attack: Attack, view: AttackerView) -> np.ndarray:
    unknown = set(attack.requires) - ALL_CAPABILITIES
    if unknown:
        raise PluginError(f"attack '{attack.name}' requires unknown capabilities {sorted(unknown)}: "
                          f"use {sorted(ALL_CAPABILITIES)}")
    n_targets = len(view.targets)
    box = {"view": view}
    del view  # from here on only the attack's thread holds the view
    try:
        raw = _score_in_fresh_thread(attack, box)
    except PluginError:
        raise
    except Exception as exc:
        from bench.errors import CapabilityError
        if isinstance(exc, CapabilityError):
            raise
        raise PluginError(f"attack '{attack.name}' raised {type(exc).__name__}: {exc}: fix the plugin "
                          f"(run `privbench list attacks` to check its parameters)") from exc
    try:
        scores = np.asarray(raw, dtype=np.float64).reshape(-1)
    except (TypeError, ValueError) as exc:
        raise PluginError(f"attack '{attack.name}' returned {type(raw).__name__}, not numbers: return one float "
                          f"per target") from exc
    if scores.shape[0] != n_targets:
        raise PluginError(f"attack '{attack.name}' returned {scores.shape[0]} scores for {n_targets} "
                          f"targets: return exactly one score per target, in the order given")
    bad = int((~np.isfinite(scores)).sum())
    if bad:
        raise PluginError(f"attack '{attack.name}' returned {bad} NaN/infinite scores: return finite scores "
                          f"(e.g. guard divisions and logs of zero)")
    return scores
