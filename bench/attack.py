"""Attack contract: declare capabilities, return one score per target (higher = member).

Unit-level games (a user or a secret per target, :mod:`bench.units`): a record-level attack runs unchanged on the
unit's samples and the unit's score is the mean of its sample scores (Kandpal et al. 2024 average example-level
statistics, eq. 4); an attack that scores units itself sets ``scores_units = True`` and reads ``Target.samples``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from bench.errors import CapabilityError, PluginError
from bench.hashing import content_hash
from bench.lm import ALL_CAPABILITIES, TOKEN_LOGPROBS
from bench.plugin import Plugin

if TYPE_CHECKING:
    from bench.game import AttackerView
    from bench.metrics import MetricRow


@dataclass(frozen=True)
class Scores:
    """What :meth:`Attack.score` may return instead of a bare sequence: one score per target, plus per-target
    details the attack's own :meth:`Attack.metrics` read (e.g. token-by-token correctness and confidence)."""

    values: Sequence[float]
    details: Any = None


@dataclass(frozen=True)
class MetricContext:
    """What an attack's own metrics may use besides labels and scores, from the challenger after scoring."""

    alpha: float                          # 1 − confidence of intervals
    public_format: Mapping[str, Any] | None
    never_inserted: np.ndarray            # per target: inserted in no training data at all (group (0, 0))


class Attack(Plugin):
    """A membership-inference attack. Subclasses implement :meth:`score` (and :meth:`metrics` for rows of their own).
    """

    kind: ClassVar[str] = "attack"
    family: ClassVar[str] = "mia"
    requires: ClassVar[frozenset[str]] = frozenset({TOKEN_LOGPROBS})
    reference: ClassVar[str] = ""   # the paper and equation the score follows
    #: True: :meth:`score` scores unit targets (users, secrets) itself from ``Target.samples``; False: the
    #: runner scores each sample as a record and averages per unit (:func:`score_units`)
    scores_units: ClassVar[bool] = False

    def check_task(self, public_format: Mapping[str, Any] | None, unit: str) -> None:
        """Raise :class:`bench.errors.CapabilityError` (problem and fix) if this attack cannot score the targets of
        a task with this public format and membership unit. The runner calls it before anything trains, so a suite
        pairing the attack with the wrong task fails in a second, not after pretraining. Accepts every task by
        default; the capabilities in ``requires`` are checked by the runner itself."""

    def score(self, view: AttackerView) -> Sequence[float] | Scores:  # pragma: no cover - interface
        """One score per target, in ``view.targets`` order, higher = member; or :class:`Scores` with details."""
        raise NotImplementedError

    def metrics(self, labels: np.ndarray, output: AttackOutput, ctx: MetricContext) -> list[MetricRow]:
        """Rows this attack reports next to AUC and TPR at low FPR (canary exposure, extraction rates).

        Called by the runner with the game's labels after scoring, on the suite's instance: it must depend on the
        attack's parameters and its arguments only. None by default."""
        return []

    @classmethod
    def info(cls) -> dict:
        d = super().info()
        d.update(family=cls.family, requires=sorted(cls.requires), reference=cls.reference)
        return d


def fresh_instance(attack: Attack) -> Attack:
    """A new instance of ``attack``'s class with the same validated parameters.

    Why: every (world, game, defense) evaluation is scored by its own instance, so nothing an attack keeps on
    ``self`` (texts it saw, scores, tuning) can carry group information from one game to another: the games of
    one world show label-determined subsets of the same units (joint/fresh only a = 0 units, joint/seen only
    a = 1, ...). The signal cache, keyed by content, is the only state shared between evaluations; state kept at
    class or module level is not reset and is listed as an in-process channel in docs/attacks.md.
    """
    try:
        return type(attack)(**attack.config)
    except Exception as exc:
        raise PluginError(f"attack '{attack.name}' cannot be re-created from its parameters "
                          f"({type(exc).__name__}: {exc}): its __init__ must accept its own params as keywords") \
            from exc


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

    box["attack"] = attack
    t = threading.Thread(target=call, name="privbench-attack", daemon=True)
    t.start()
    t.join()
    if "exc" in out:
        raise out.pop("exc")
    return out.pop("scores")


@dataclass(frozen=True)
class AttackOutput:
    """What one evaluation of an attack produced: one score per target, and the details it reported."""

    scores: np.ndarray
    details: Any = None


def run_attack(attack: Attack, view: AttackerView) -> np.ndarray:
    """Score ``view`` with a fresh instance of ``attack`` and enforce its contract (see :func:`evaluate_attack`)."""
    return evaluate_attack(attack, view).scores


def evaluate_attack(attack: Attack, view: AttackerView) -> AttackOutput:
    """Score one game with a fresh instance of ``attack``: no exception escapes unnamed, one finite score per target.

    ``attack`` is only a template: a new instance with its parameters scores the view (:func:`fresh_instance`),
    and nothing is copied back. On a unit game an attack without ``scores_units`` scores the units' samples as
    records and each unit gets the mean of its samples' scores. ``details`` are what :meth:`Attack.score` returned
    in :class:`Scores` (None for a bare sequence).
    """
    instance = fresh_instance(attack)
    details: list = []
    if is_unit_view(view) and not instance.scores_units:
        scores = score_units(instance, view, lambda a, v: _run_checked(a, v, details))
    else:
        scores = _run_checked(instance, view, details)
    return AttackOutput(scores, details[0] if details else None)


def is_unit_view(view: AttackerView) -> bool:
    return view.unit != "record"


def score_units(attack: Attack, view: AttackerView, run_records) -> np.ndarray:
    """Score every unit target as the mean of ``attack``'s record scores over the unit's samples.

    ``run_records(attack, view)`` runs the attack on a record-level view and checks its contract. The
    attack sees one record target per sample (opaque ids derived from the unit's), in unit order, with the
    same models and attacker data as the unit view; Kandpal et al. 2024 average example-level statistics
    (eq. 4, Table 2).
    """
    from bench.game import AttackerView, Target

    family = attack.family
    if family != "mia":
        raise CapabilityError(f"attack '{attack.name}' (family {family}) scores records, and game '{view.game}' "
                              f"scores {view.unit}s by averaging membership scores only: run it on a "
                              f"record-level task")
    flat: list[Target] = []
    owner: list[int] = []
    for i, t in enumerate(view.targets):
        samples = t.samples or (t.text,)
        for j, s in enumerate(samples):
            flat.append(Target(id=content_hash(t.id, j, length=12), text=s))
            owner.append(i)
    record_view = AttackerView(view.game, tuple(flat), view.model, view.base, view.reference, view.population,
                               view.shadows, view.public_format, "record", view.trainer)
    scores = run_records(attack, record_view)
    idx = np.asarray(owner, dtype=np.int64)
    sums = np.bincount(idx, weights=scores, minlength=len(view.targets))
    counts = np.bincount(idx, minlength=len(view.targets))
    return sums / counts


def _run_checked(attack: Attack, view: AttackerView, details: list | None = None) -> np.ndarray:
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
    if isinstance(raw, Scores):
        if details is not None:
            details.append(raw.details)
        raw = raw.values
    if raw is None:
        raise PluginError(f"attack '{attack.name}' returned None: return one float per target (a missing `return` "
                          f"in score?)")
    try:
        scores = np.asarray(raw, dtype=np.float64)
    except (TypeError, ValueError) as exc:
        raise PluginError(f"attack '{attack.name}' returned {type(raw).__name__}, not numbers: return one float "
                          f"per target") from exc
    if scores.ndim != 1:
        raise PluginError(f"attack '{attack.name}' returned an array of shape {scores.shape}: return a flat array "
                          f"of one float per target, in the order given")
    if scores.shape[0] != n_targets:
        raise PluginError(f"attack '{attack.name}' returned {scores.shape[0]} scores for {n_targets} "
                          f"targets: return exactly one score per target, in the order given")
    bad = int((~np.isfinite(scores)).sum())
    if bad:
        raise PluginError(f"attack '{attack.name}' returned {bad} NaN/infinite scores: return finite scores "
                          f"(e.g. guard divisions and logs of zero)")
    return scores
