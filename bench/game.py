"""The holistic audit game of Marek et al. 2026 (section 6.1): four stages, seven games, one world.

A world is built once per (task, model, defense, seed). The challenger draws
targets and puts each in one of four groups by two bits: ``a`` (inserted into
the pretraining data S) and ``b`` (inserted into the adaptation data D). Each
game then picks its positives and negatives from those groups and releases
θ (pretrained), θ' (adapted) or both:

======================  ============  ==============  ==============
game                    released      positives (a,b) negatives (a,b)
======================  ============  ==============  ==============
pretrain                θ             (1,·)           (0,·)
adapt                   θ' only       (·,1)           (·,0)
joint/fresh (x ∉ S)     θ and θ'      (0,1)           (0,0)
joint/seen (x ∈ S)      θ and θ'      (1,1)           (1,0)
joint/both              θ and θ'      (1,1)           (0,0)
post_adapt (x ∉ D)      θ and θ'      (1,0)           (0,0)
null (control)          θ'            half of N       other half of N
audit                   θ'            C with c=1      C with c=0
audit/pretrain          θ             C_S with c=1    C_S with c=0
======================  ============  ==============  ==============

The four groups have equal sizes, so ``a`` and ``b`` are independent; ``N`` is a separate pool of
never-inserted units that only the null game shows. ``C`` is a separate pool of ``n_audit`` audit canaries
(empty by default), each put into D *independently with probability 1/2* (bit ``c``): the design of the one-run
audit of Steinke, Nasr and Jagielski 2023, which only the audit game shows (:mod:`bench.audit`). ``C_S`` is the
same design at pretraining: ``n_audit_pretrain`` canaries, each put into S independently with probability 1/2,
shown only by the audit/pretrain game (θ released), so a pretraining-stage defense gets a one-run ε lower bound.

A task may give its target records *neighbours* (``target_meta[id]["neighbour"]``, task ``secrets_replaced``):
the same record with its secret replaced by a fresh draw. Then a unit with b = 0 (an audit canary with c = 0) is
not left out of D but trained on as its neighbour, so the b games test the secret's content with the carriers
present on both sides: the neighbouring datasets of Ganesh et al. 2025 (Definition 3.1), which Hush's guarantee
bounds (:func:`bench.audit.secret_claim_row`).

The attacker receives an :class:`AttackerView`: the targets in shuffled
order with opaque ids, restricted model handles and attacker-owned data.
Labels stay with the :class:`Challenger`; defenses receive only their
training texts, shuffled, with no marker of which are targets.

The unit of membership is the task's (``TaskData.unit``): a record, a user
(all records of a user, Kandpal et al. 2024) or a secret (all records carrying
it, Ganesh et al. 2025). The challenger draws whole units into the groups
(:func:`tasks.users.draw_unit_groups`; world sizes count units), every record
of a unit shares its (a, b), and a game shows one target per unit whose
``samples`` are what the attacker knows of it (:mod:`bench.units`). For
record-level tasks the draw, ids and world keys are those of the record-level
challenger.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import numpy as np

from bench.errors import CapabilityError, ConfigError, DataError
from bench.hashing import content_hash
from bench.lm import (
    FINETUNE_REFERENCE, MODEL_CAPABILITIES, POPULATION, REFERENCE_MODEL, SHADOW_MODELS, USER_SAMPLES, LanguageModel,
    RestrictedModel,
)
from bench.params import Param, validate_params
from bench.pools import (
    KNOWN_A_DRAW_VERSION, POOLED_DRAW_VERSION, USER_DRAW_VERSION, known_a_draw_applies, pooled_draw_applies,
    split_known_pool, split_pool, split_user_pool, user_draw_applies,
)
from bench.task import TaskData
from bench.units import (
    AUDIT_POOL, AUDIT_PRETRAIN_POOL, GROUPS, NULL_POOL, draw_unit_groups, group_targets_by_unit,
    held_out_user_validation, owners_of, secrets_of, unit_samples,
)

#: version of the game's draw and labels; part of every world key, so results of another game version never mix
#: (2: four equal groups and a separate null pool, salted draws, label-free pretraining hooks)
GAME_VERSION = "2"
STAGES = ("pretraining", "adaptation", "joint", "post_adaptation", "control", "audit")


@dataclass(frozen=True)
class GameSpec:
    name: str
    stage: str
    target_model: str              # "pretrained" (θ) or "adapted" (θ')
    releases_base: bool            # θ released next to θ'
    positives: frozenset
    negatives: frozenset
    null_split: bool = False
    description: str = ""
    #: shows an audit pool (labels c), not the four groups: C (inserted into D) when the target model is θ',
    #: C_S (inserted into S) when it is θ
    audit_pool: bool = False


GAMES: dict[str, GameSpec] = {g.name: g for g in (
    GameSpec("pretrain", "pretraining", "pretrained", False, frozenset({(1, 0), (1, 1)}),
             frozenset({(0, 0), (0, 1)}), description="was x in the pretraining data? (θ released)"),
    GameSpec("adapt", "adaptation", "adapted", False, frozenset({(0, 1), (1, 1)}),
             frozenset({(0, 0), (1, 0)}), description="was x in the adaptation data? (θ' only; a unknown)"),
    GameSpec("joint/fresh", "joint", "adapted", True, frozenset({(0, 1)}), frozenset({(0, 0)}),
             description="x known not in S: was it in D? (θ and θ')"),
    GameSpec("joint/seen", "joint", "adapted", True, frozenset({(1, 1)}), frozenset({(1, 0)}),
             description="x known in S: was it in D? (θ and θ')"),
    GameSpec("joint/both", "joint", "adapted", True, frozenset({(1, 1)}), frozenset({(0, 0)}),
             description="x in both S and D, or in neither (θ and θ')"),
    GameSpec("post_adapt", "post_adaptation", "adapted", True, frozenset({(1, 0)}), frozenset({(0, 0)}),
             description="x known not in D: was it in S, judged after adaptation? (θ and θ')"),
    GameSpec("null", "control", "adapted", False, frozenset({(0, 0)}), frozenset({(0, 0)}), null_split=True,
             description="control: two random halves of non-members; any AUC far from 0.5 is a leak"),
    GameSpec("audit", "audit", "adapted", False, frozenset(), frozenset(), audit_pool=True,
             description="audit canaries, each in D with probability 1/2: a one-run lower bound on ε (needs "
                         "world n_audit > 0)"),
    GameSpec("audit/pretrain", "audit", "pretrained", False, frozenset(), frozenset(), audit_pool=True,
             description="pretraining audit canaries, each in S with probability 1/2: a one-run lower bound on ε "
                         "of θ (needs world n_audit_pretrain > 0)"),
)}
#: the games ``games: all`` selects: the audit games need their own pools (``n_audit``, ``n_audit_pretrain``) and
#: are named explicitly
DEFAULT_GAMES = tuple(name for name, g in GAMES.items() if not g.audit_pool)

WORLD_PARAMS = (
    Param("n_per_group", int, 100, "units in each of the four groups (0,0), (0,1), (1,0), (1,1): equal sizes keep "
          "a and b independent", low=4),
    Param("n_null", int, 400, "units of the null game's own pool (never inserted, shown by no other game), split in "
          "half; below 400 (200 vs 200) the null rows are flagged underpowered", low=8),
    Param("adapt_background", int, 200, "non-target records in the adaptation data D (in a user world drawn by "
          "pool_draw: pooled, the fewest whole users that reach it)", low=0),
    Param("n_validation", int, 100, "records of the adaptation pool after D's background (in a user world, of users "
          "with no record in D and no target user) that the data owner holds back for validation (early stopping); "
          "never targets, never trained on", low=0),
    Param("pretrain_target_repeats", int, 1, "copies of each a=1 target inserted into pretraining", low=1),
    Param("n_audit", int, 0, "audit canaries (pool C, shown only by the audit game), each inserted into D "
          "independently with probability 1/2; 0 = none", low=0),
    Param("n_audit_pretrain", int, 0, "pretraining audit canaries (pool C_S, shown only by the audit/pretrain "
          "game), each inserted into S independently with probability 1/2; 0 = none", low=0),
    Param("adapt_target_repeats", int, None, "copies of each b=1 target inserted into adaptation (canaries: 1, 3, "
          "10); null = the task's own repeats, else 1", low=1, nullable=True),
    Param("pool_draw", str, "pooled", "where targets and D's background come from on tasks of natural text: pooled "
          "= the adaptation and target partitions pooled and split by document under the world's salt "
          "(bench/pools.py), so a defense cannot recognise targets by their public partition; on tasks with a "
          "known pretraining split (mimir, pile_split) the members and the non-members of both partitions split "
          "at random into targets and background likewise; on user tasks both partitions' users split, whole users, "
          "into target users and D's background users; partition = the task's two partitions as built (about "
          "half the records, and that channel open: docs/submitting.md)",
          choices=("pooled", "partition")),
    Param("background_in_pretraining", str, "none", "none = D's background is never in S (Marek et al. 2026: "
          "different data for pretraining and adaptation); matched = as large a share of its units is inserted into "
          "S as of the b=1 units (the (1,1) group), so that θ's memory of S marks no target among D̃ "
          "(docs/submitting.md, \"Channels of the pools\"); on a known split (mimir, pile_split) the background "
          "takes that share of its records from the task's members instead (pool_draw: pooled only); no effect "
          "on overlap tasks", choices=("none", "matched")),
)


def b_only_game(spec: GameSpec) -> bool:
    """Whether a game releases θ′ and its two sides differ in b (or the audit bit c) alone, with a alike on both:
    the games whose negatives are the positives' neighbours in a world that trains b = 0 units as neighbours."""
    if spec.target_model != "adapted" or spec.null_split:
        return False
    if spec.audit_pool:
        return True
    return ({b for _, b in spec.positives} == {1} and {b for _, b in spec.negatives} == {0}
            and {a for a, _ in spec.positives} == {a for a, _ in spec.negatives})


def keyed_world(world: dict[str, Any]) -> dict[str, Any]:
    """The world settings as hashed into keys: ``n_audit`` and ``n_audit_pretrain`` only when > 0, and
    ``pool_draw`` only when not ``pooled`` and ``background_in_pretraining`` only when not ``none``, so worlds, runs
    and tracks written before them keep their keys (a pooled world's key says so itself, ``Challenger.world_key``)."""
    out = dict(world)
    for name in ("n_audit", "n_audit_pretrain"):
        if not out.get(name):
            out.pop(name, None)
    if out.get("pool_draw", "pooled") == "pooled":
        out.pop("pool_draw", None)
    if out.get("background_in_pretraining", "none") == "none":
        out.pop("background_in_pretraining", None)
    return out


def resolve_games(names: list[str] | str) -> list[GameSpec]:
    if names == "all" or names == ["all"]:
        return [GAMES[n] for n in DEFAULT_GAMES]
    if isinstance(names, str):
        names = [names]
    if not isinstance(names, list) or not names:
        raise ConfigError(f"games must be 'all' or a non-empty list of game names (got {names!r}): "
                          f"games are {', '.join(GAMES)}")
    out = []
    for n in names:
        if n is None:  # YAML reads a bare `null` as None; the control game is named "null"
            n = "null"
        if not isinstance(n, str) or n not in GAMES:
            import difflib
            close = difflib.get_close_matches(str(n), list(GAMES), n=1)
            raise ConfigError(f"unknown game '{n}': " + (f"did you mean '{close[0]}'? " if close else "") +
                              f"games are {', '.join(GAMES)} or 'all'")
        if GAMES[n] in out:
            raise ConfigError(f"game '{n}' is listed twice: list each game once")
        out.append(GAMES[n])
    return out


@dataclass(frozen=True)
class Target:
    """What an attacker knows of a target: an opaque id and the text. Never its label.

    For unit-level games (a user, a secret) ``samples`` holds what the attacker legitimately knows of the unit
    (e.g. a user's held-aside documents, never trained on); ``text`` is then the first of them.
    """

    id: str
    text: str
    samples: tuple[str, ...] = ()


@dataclass(frozen=True)
class ShadowSet:
    """Attacker-trained shadow models: each trained (OUT for every target) on a known slice of population data.

    ``members[i]`` are the texts shadow ``i`` was trained on (the attacker trained it, so it knows);
    ``held_out`` are population texts no shadow saw: the population sample Z of RMIA.
    """

    models: tuple[LanguageModel, ...]
    members: tuple[tuple[str, ...], ...]
    held_out: tuple[str, ...]
    base: str  # "released θ" or "attacker reference": what the shadows were adapted from


@dataclass(frozen=True)
class AdaptationData:
    """What a defense receives: its training texts, shuffled. No ids, no target marks.

    The data owner knows facts about its own data that some defenses use: the (pseudonymous) owner of each
    text for per-user limits and user-level DP, and the secrets each text carries with their protection
    targets for secret-level defenses (Hush, Ganesh et al. 2025). These never mark which records are targets.
    """

    texts: tuple[str, ...]
    #: owner of each text (user-stratified tasks), aligned with ``texts``; None elsewhere
    users: tuple[str, ...] | None = None
    #: ids of the secrets each text carries (secret-bearing tasks), aligned with ``texts``; None elsewhere
    secrets: tuple[tuple[str, ...], ...] | None = None
    #: per secret id, Hush's (p_j prior success, r_j allowed posterior success) targets; None elsewhere
    secret_targets: dict[str, tuple[float, float]] | None = None
    #: records of the same distribution the data owner holds back from training (never targets, never
    #: evaluation data), for defenses that validate (early stopping); given only to a defense that declares
    #: ``uses_validation``, so no other defense's cache key depends on it
    validation: tuple[str, ...] | None = None

    def __post_init__(self) -> None:
        for name in ("users", "secrets"):
            aligned = getattr(self, name)
            if aligned is not None and len(aligned) != len(self.texts):
                raise ValueError(f"AdaptationData.{name} has {len(aligned)} entries for {len(self.texts)} texts")

    def key_parts(self) -> list:
        """What an adapted model's cache key must cover: every field a defense can read."""
        from bench.hashing import text_hash
        parts: list = [[text_hash(t) for t in self.texts]]
        if self.users is not None:
            parts.append(["users", list(self.users)])
        if self.secrets is not None:
            parts.append(["secrets", [list(s) for s in self.secrets]])
        if self.secret_targets is not None:
            parts.append(["secret_targets", sorted((k, list(v)) for k, v in self.secret_targets.items())])
        if self.validation is not None:
            parts.append(["validation", [text_hash(t) for t in self.validation]])
        return parts


class AttackerView:
    """Everything an attack may use in one game. Read-only; carries no labels and no challenger state.

    ``unit`` is the membership unit ("record", "user", "secret"); for unit games each target's ``samples``
    are what the attacker knows of the unit (:mod:`bench.units`). ``trainer`` fine-tunes a fresh copy of the
    attacker's calibration model for attacks that declare ``finetune_reference`` (self-prompt).
    """

    __slots__ = ("game", "targets", "model", "base", "reference", "population", "shadows", "public_format", "unit",
                 "trainer")

    def __init__(self, game: str, targets: tuple[Target, ...], model: LanguageModel,
                 base: LanguageModel | None, reference: LanguageModel | None,
                 population: tuple[str, ...] | None, shadows: ShadowSet | None = None,
                 public_format: dict | None = None, unit: str = "record", trainer: Any = None) -> None:
        import copy
        for name, value in (("game", game), ("targets", targets), ("model", model), ("base", base),
                            ("reference", reference), ("population", population), ("shadows", shadows),
                            ("public_format", copy.deepcopy(public_format)), ("unit", unit), ("trainer", trainer)):
            object.__setattr__(self, name, value)

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError("the attacker view is read-only")

    def __delattr__(self, name: str) -> None:
        raise AttributeError("the attacker view is read-only")

    @property
    def texts(self) -> list[str]:
        return [t.text for t in self.targets]

    def calibration_model(self) -> LanguageModel:
        """θ where the game releases it, else the attacker-owned reference model."""
        if self.base is not None:
            return self.base
        if self.reference is not None:
            return self.reference
        raise CapabilityError(f"game '{self.game}' releases no base model and no reference model was given: "
                              f"configure `reference` in the suite")


@dataclass(frozen=True)
class GameInstance:
    """The challenger's side of one game: targets in the order shown, their labels and record ids."""

    spec: GameSpec
    targets: tuple[Target, ...]
    labels: np.ndarray
    record_ids: tuple[str, ...]

    @property
    def n_pos(self) -> int:
        return int(self.labels.sum())

    @property
    def n_neg(self) -> int:
        return int(len(self.labels) - self.labels.sum())


class Challenger:
    """Draws a world from a task: targets, their (a, b) groups, S̃ and D̃, and the null pool. Holds the labels.

    The four groups have ``n_per_group`` units each, so ``a`` and ``b`` are independent (Marek et al. 2026, section
    6.1): a game over ``b`` alone (``adapt``) then has as many a = 1 units among its negatives as among its
    positives, and θ′'s memory of pretraining cannot pass for adaptation leakage. The null game uses its own pool of
    ``n_null`` never-inserted units, shown by no other game. Tasks of natural text that keep each record's document
    give the units and D's background from one pool split by document (:mod:`bench.pools`), and user tasks their
    target users and D's background users from one pool of users: the public partition a record came from then says
    nothing about whether it is a target.

    ``secret`` salts every draw: with it, the world cannot be recomputed from the public suite and seed (a
    plugin that rebuilds the challenger gets another world); without it the draw is public and reproducible
    from the suite alone (see docs/attacks.md, "What a defense cannot reach").
    """

    def __init__(self, data: TaskData, config: dict[str, Any] | None, seed: int, *,
                 secret: str | None = None) -> None:
        self.config = validate_params("world", WORLD_PARAMS, config)
        if self.config["adapt_target_repeats"] is None:
            self.config["adapt_target_repeats"] = int((data.public_format or {}).get("repeats", 1))
        self.seed = int(seed)
        self._data = data
        c = self.config
        #: membership unit: "record", "user" or "secret"; world sizes count units
        self.unit = data.unit
        sizes = {g: c["n_per_group"] for g in GROUPS}
        sizes[NULL_POOL] = c["n_null"]
        sizes[AUDIT_POOL] = c["n_audit"]
        sizes[AUDIT_PRETRAIN_POOL] = c["n_audit_pretrain"]
        salt = [] if secret is None else [int(content_hash("world-secret", secret, length=16), 16)]
        self._salt = salt
        task_stream = int(content_hash(data.fingerprint, length=8), 16)
        rng = np.random.default_rng([self.seed, task_stream, *salt])
        #: a comes from the data (a released model's documented split), not from the challenger
        self.known_a = bool(data.targets) and all("a" in data.target_meta.get(r.id, {}) for r in data.targets)
        #: targets and background from one pool split by document under the world's salt (bench.pools)
        self.pooled = c["pool_draw"] == "pooled" and pooled_draw_applies(data, known_a=self.known_a)
        #: members and non-members split at random into targets and background under the world's salt (bench.pools)
        self.known_a_pooled = c["pool_draw"] == "pooled" and known_a_draw_applies(data, known_a=self.known_a)
        #: target users and D's background users from one pool of users under the world's salt (bench.pools)
        self.user_pooled = c["pool_draw"] == "pooled" and user_draw_applies(data, known_a=self.known_a)
        #: records of D's background: ``adapt_background``, or in a user-pooled world the whole users reaching it
        self.n_background = c["adapt_background"]
        if self.known_a and c["background_in_pretraining"] == "matched" and not self.known_a_pooled:
            raise ConfigError(f"task '{data.name}' gives pretraining membership from its data, and world "
                              f"background_in_pretraining: matched draws D's background from its members, which "
                              f"only the pooled draw does: set world pool_draw: pooled (the default)")
        self._validation: tuple[str, ...] | None = None
        #: the members of a known split that a pooled world put in D's background (world ``matched``)
        self._background_members: tuple[str, ...] = ()
        #: documents per side (T, B, S, V) of a pooled world, for inspection (tests/test_pools.py); None elsewhere
        self.pool_docs: dict[str, int] | None = None
        if self.pooled or self.user_pooled:
            # C_S (pretraining audit) never reaches D̃: its own side, outside the rate at which D̃ samples T and B
            n_units = sum(n for g, n in sizes.items() if g != AUDIT_PRETRAIN_POOL)
            if self.pooled:
                pool_rng = np.random.default_rng([self.seed, 31, task_stream, *salt])
                sides = split_pool(data, n_units=n_units, n_inserted=2 * c["n_per_group"] + c["n_audit"] / 2,
                                   n_background=c["adapt_background"], n_validation=c["n_validation"],
                                   n_pretrain_audit=c["n_audit_pretrain"], rng=pool_rng)
                data = dataclasses.replace(data, targets=sides.targets + sides.pretrain_audit,
                                           adapt=sides.background, target_docs=None, adapt_docs=None)
            else:
                pool_rng = np.random.default_rng([self.seed, 43, task_stream, *salt])
                sides = split_user_pool(data, n_units=n_units, n_pretrain_audit=c["n_audit_pretrain"],
                                        n_background=c["adapt_background"], n_validation=c["n_validation"],
                                        rng=pool_rng)
                data = dataclasses.replace(data, targets=sides.targets + sides.pretrain_audit,
                                           adapt=sides.background, adapt_owners=sides.background_owners,
                                           target_meta=sides.target_meta)
                self.n_background = len(sides.background)
            self._data = data
            self._validation = sides.validation
            self.pool_docs = dict(sides.n_docs)
            drawn = draw_unit_groups(dataclasses.replace(data, targets=sides.targets),
                                     {**sizes, AUDIT_PRETRAIN_POOL: 0}, rng)
            if sides.pretrain_audit:
                drawn.update(draw_unit_groups(dataclasses.replace(data, targets=sides.pretrain_audit),
                                              {**{g: 0 for g in GROUPS}, AUDIT_PRETRAIN_POOL: c["n_audit_pretrain"]},
                                              pool_rng))
        elif self.known_a_pooled:
            pool_rng = np.random.default_rng([self.seed, 41, task_stream, *salt])
            n_units = {1: 2 * c["n_per_group"], 0: sum(sizes.values()) - 2 * c["n_per_group"]}
            # as large a share of members in D's background as among the inserted units (the (1,1) group against
            # (0,1) and the audit canaries expected in D) under `matched`; none under the paper's game
            n_inserted = 2 * c["n_per_group"] + c["n_audit"] / 2
            k = (round(c["adapt_background"] * c["n_per_group"] / n_inserted)
                 if c["background_in_pretraining"] == "matched" else 0)
            sides = split_known_pool(data, n_units=n_units, n_background=c["adapt_background"],
                                     n_background_members=k, n_validation=c["n_validation"], rng=pool_rng)
            meta = {**data.target_meta, **{t.id: {"a": 0} for t in sides.targets if t.id not in data.target_meta}}
            data = dataclasses.replace(data, targets=sides.targets, adapt=sides.background, target_meta=meta)
            self._data = data
            self._validation = sides.validation
            self.pool_docs = dict(sides.n_docs)
            self._background_members = sides.background_members
            drawn = draw_unit_groups(data, sizes, rng, known_a=True)
        else:
            # whole units go to one group (or the null pool)
            drawn = draw_unit_groups(data, sizes, rng, known_a=self.known_a)
        #: record -> (a, b) for the records of the four groups; null-pool and audit-pool records are not in it
        self._group: dict[str, tuple[int, int]] = {r: g for r, g in drawn.items()
                                                   if g not in (NULL_POOL, AUDIT_POOL, AUDIT_PRETRAIN_POOL)}
        if len(data.adapt) < c["adapt_background"]:
            raise DataError(f"task '{data.name}' has {len(data.adapt)} adaptation records but adapt_background is "
                            f"{c['adapt_background']}: lower it or use more data")
        by_unit = group_targets_by_unit(data)
        self._text: dict[str, str] = {data.targets[i].id: data.targets[i].text
                                      for idx in by_unit.values() for i in idx if data.targets[i].id in drawn}
        self._unit_of: dict[str, str] = {}
        #: unit -> its records (sorted ids), for the units drawn into the world (null pool included)
        self._records: dict[str, tuple[str, ...]] = {}
        for u, idx in by_unit.items():
            rids = sorted(data.targets[i].id for i in idx)
            if rids[0] in drawn:
                self._records[u] = tuple(rids)
                self._unit_of.update((r, u) for r in rids)
        self._unit_group: dict[str, tuple[int, int]] = {u: self._group[r[0]] for u, r in self._records.items()
                                                        if r[0] in self._group}
        #: every target is already in S (relation "overlap"): the a bit is not controlled by the challenger
        self.a_uncontrolled = data.relation == "overlap" and not self.known_a
        #: the null game's own units (never inserted, never shown by another game), split in half
        self._null_units: tuple[str, ...] = tuple(sorted(u for u, r in self._records.items()
                                                         if drawn[r[0]] == NULL_POOL))
        perm = rng.permutation(len(self._null_units))
        self._null_positive = frozenset(self._null_units[i] for i in perm[: len(self._null_units) // 2])
        #: the audit pool C and its bits c, drawn independently with probability 1/2 from their own stream
        self._audit_units: tuple[str, ...] = tuple(sorted(u for u, r in self._records.items()
                                                          if drawn[r[0]] == AUDIT_POOL))
        coin = np.random.default_rng([self.seed, 23, *salt]).random(len(self._audit_units)) < 0.5
        self._audit_in = frozenset(u for u, bit in zip(self._audit_units, coin) if bit)
        #: the pretraining audit pool C_S and its bits, likewise from a stream of its own
        self._pre_audit_units: tuple[str, ...] = tuple(sorted(u for u, r in self._records.items()
                                                              if drawn[r[0]] == AUDIT_PRETRAIN_POOL))
        coin = np.random.default_rng([self.seed, 29, *salt]).random(len(self._pre_audit_units)) < 0.5
        self._pre_audit_in = frozenset(u for u, bit in zip(self._pre_audit_units, coin) if bit)
        #: record -> its neighbour text, for tasks whose b = 0 units are trained on with their secret replaced
        #: (``secrets_replaced``, ``target_meta[...]["neighbour"]``); empty elsewhere
        self._neighbours: dict[str, str] = {r: data.target_meta[r]["neighbour"] for u, rids in self._records.items()
                                            if u not in self._null_units for r in rids
                                            if "neighbour" in data.target_meta.get(r, {})}
        key = {"task": data.fingerprint, "world": keyed_world(self.config), "seed": self.seed, "game": GAME_VERSION}
        if self.pooled:
            key["draw"] = f"pooled-{POOLED_DRAW_VERSION}"
        elif self.known_a_pooled:
            key["draw"] = f"known-a-pooled-{KNOWN_A_DRAW_VERSION}"
        elif self.user_pooled:
            key["draw"] = f"user-pooled-{USER_DRAW_VERSION}"
        if secret is not None:
            key["secret"] = content_hash("world-secret-id", secret)
        self.world_key = content_hash(key)

    # -- what training sees ------------------------------------------------------------------------
    def members(self, bit: str) -> list[str]:
        i = 0 if bit == "a" else 1
        return [self._text[r] for r in sorted(self._group) if self._group[r][i] == 1]

    def pretraining_inserts(self) -> list[str]:
        """Texts of the a=1 targets, of the background records S shares with D (world ``background_in_pretraining``)
        and of the pretraining audit canaries with c=1, each repeated ``pretrain_target_repeats`` times.

        Empty when membership in S is given by the data (known split, or overlap): nothing to insert.
        """
        if self.known_a or self.a_uncontrolled:
            return []
        canaries = [self._text[r] for u in sorted(self._pre_audit_in) for r in self._records[u]]
        inserts = self.members("a") + self.background_in_pretraining() + canaries
        return inserts * self.config["pretrain_target_repeats"]

    def background_in_pretraining(self) -> list[str]:
        """The records of D's background that S also holds: none by default; with world ``background_in_pretraining:
        matched``, a uniform draw (from the world's own stream) of as large a share of the background's units as the
        (1,1) group is of the b=1 units, each drawn unit with all its background records, so that "θ has seen it"
        is as likely for a background unit of D̃ as for an inserted target, and a defense that drops what θ knows
        pays for it in utility at the targets' rate.

        Units are the task's: a record, a user (the background records' owners) or a secret (the background records
        carrying the same secrets). Drawing records of a user task would leave every (1,1) user wholly in S and
        every background user about half in it, which a defense that scores users by θ would still tell apart.

        On a known split the records are not inserted (S is the released model's): the pooled draw took that share
        of D's background from the task's members (bench.pools.split_known_pool), and they are returned here."""
        if self.known_a:
            return list(self._background_members)
        if self.config["background_in_pretraining"] == "none" or self.a_uncontrolled:
            return []
        units = self._background_units()
        b1 = [u for u, (_, b) in self._unit_group.items() if b == 1]
        n_b1 = len(b1) + len(self._audit_in)
        k = round(len(units) * sum(self._unit_group[u][0] for u in b1) / n_b1) if n_b1 else 0
        picked = np.random.default_rng([self.seed, 37, *self._salt]).choice(len(units), size=k, replace=False)
        return [self._data.adapt[i] for i in sorted(i for j in picked for i in units[j])]

    def _background_units(self) -> list[list[int]]:
        """Indices of D's background records grouped by membership unit, in order of first record."""
        n_bg = self.n_background
        if self.unit == "user" and self._data.adapt_owners is not None:  # without owners D̃ is refused anyway
            keys = list(self._data.adapt_owners[:n_bg])
        elif self.unit == "secret":
            per_text, _ = secrets_of(self._data, self._data.adapt[:n_bg])
            keys = [s or ("record", i) for i, s in enumerate(per_text)]
        else:
            return [[i] for i in range(n_bg)]
        groups: dict[Any, list[int]] = {}
        for i, key in enumerate(keys):
            groups.setdefault(key, []).append(i)
        return list(groups.values())

    def games_defined(self) -> set[str]:
        """Games whose labels this world can honour."""
        audit = {"audit"} if self._audit_units else set()
        if self._pre_audit_units and not (self.known_a or self.a_uncontrolled):  # S is ours to insert into
            audit.add("audit/pretrain")
        if self.a_uncontrolled:  # a is nominal: only games over b alone, and the control
            return {"adapt", "null"} | audit
        return set(DEFAULT_GAMES) | audit

    def adaptation_data(self) -> AdaptationData:
        """D̃ = D ∪ {targets with b=1}, shuffled so the order does not mark which records are targets. In a pooled
        world (bench.pools) the background and the targets come from one pool split by document (or by user) under
        the world's salt, so their public partitions do not mark them either; elsewhere the background is the
        adaptation pool's head (docs/submitting.md, "Channels of the pools").

        Unit tasks add what the data owner knows of its own texts (Kandpal et al. 2024: owners, for per-user limits;
        Ganesh et al. 2025: the secrets each text carries and their (p_j, r_j)); see :mod:`bench.units`.
        """
        n_bg = self.n_background
        reps = self.config["adapt_target_repeats"]
        b1 = [r for r in sorted(self._group) if self._group[r][1] == 1]
        b1 += [r for u in sorted(self._audit_in) for r in self._records[u]]  # audit canaries with c = 1
        b0: list[str] = []
        if self._neighbours:  # b = 0 (c = 0) units leave their neighbours in D: Hush's adjacency, not absence
            b0 = [r for r in sorted(self._group) if self._group[r][1] == 0]
            b0 += [r for u in self._audit_units if u not in self._audit_in for r in self._records[u]]
        inserted = [self._text[r] for r in b1] + [self._neighbours[r] for r in b0]
        texts = list(self._data.adapt[:n_bg]) + inserted * reps
        rng = np.random.default_rng([self.seed, 17, *self._salt])
        order = rng.permutation(len(texts))
        shuffled = tuple(texts[i] for i in order)
        # held back by the data owner for validation: records of the adaptation pool after the background, in a user
        # world only those of users with no record in D (bench.units.held_out_user_validation)
        validation = self._validation
        if validation is None and self.unit == "user":
            validation = held_out_user_validation(self._data, n_bg, self.config["n_validation"])
        if validation is None:
            validation = tuple(self._data.adapt[n_bg: n_bg + self.config["n_validation"]])
        if self.unit == "user":
            owners = owners_of(self._data, self.world_key, n_bg, [self._unit_of[r] for r in b1 + b0] * reps)
            return AdaptationData(shuffled, users=tuple(owners[i] for i in order), validation=validation)
        if self.unit == "secret":
            per_text, targets = secrets_of(self._data, shuffled)
            return AdaptationData(shuffled, secrets=tuple(per_text), secret_targets=targets, validation=validation)
        return AdaptationData(shuffled, validation=validation)

    @property
    def target_pool(self) -> tuple:
        """The records the world drew its units from: the task's target partition, or in a pooled world the target
        side and the pretraining audit side of the split (bench.pools)."""
        return self._data.targets

    def target_texts(self) -> list[str]:
        """Texts of every target record of the world (all records of every drawn unit, null pool included)."""
        return [self._text[r] for r in sorted(self._text)]

    def sample_texts(self) -> list[str]:
        """Texts unit targets show the attacker (``Target.samples``); empty for record-level worlds."""
        out: list[str] = []
        for u in sorted(self._records):
            out.extend(self._samples(u))
        return out

    def unit_of(self, record_id: str) -> str:
        """The membership unit of a target record (the record id itself for record-level tasks)."""
        return self._unit_of[record_id]

    def unit_group(self, unit: str) -> tuple[int, int]:
        """The (a, b) group of a unit of the four groups (KeyError for a null-pool unit: it has no group)."""
        return self._unit_group[unit]

    def units(self) -> list[str]:
        """Every unit drawn into the world (the four groups and the null pool), sorted."""
        return sorted(self._records)

    def null_units(self) -> tuple[str, ...]:
        """The null game's own units: never inserted, never shown by another game."""
        return self._null_units

    def never_inserted(self, unit: str) -> bool:
        """Whether ``unit`` is in no training data at all: group (0, 0), the null pool, or audit canaries with c = 0."""
        if unit in self._audit_in or unit in self._pre_audit_in:
            return False
        return self._unit_group.get(unit, (0, 0)) == (0, 0)

    def unit_size(self, unit: str) -> int:
        """How many records ``unit`` has (each goes into the training data when the unit does); 1 for a record."""
        return len(self._records[unit])

    def is_canary_unit(self, unit: str) -> bool:
        """A canary unit (Kandpal et al. 2024, section 4.3: canary users): any of its records is marked
        ``canary`` in target_meta."""
        return any(bool(self._data.target_meta.get(r, {}).get("canary")) for r in self._records[unit])

    def _samples(self, unit: str) -> tuple[str, ...]:
        return unit_samples(self._data, unit, self._records[unit])

    def group_of(self, record_id: str) -> tuple[int, int]:
        return self._group[record_id]

    # -- what a game shows ---------------------------------------------------------------------------
    def instance(self, game: GameSpec) -> GameInstance:
        """One game over the world: one target per unit (a record, a user or a secret), labels per unit.

        ``record_ids`` holds the units' keys (record ids for record-level tasks). A unit target shows
        :func:`bench.units.unit_samples` as ``samples`` and the first of them as ``text``.
        """
        rows: list[tuple[str, int]] = []
        if game.null_split:
            rows = [(unit, int(unit in self._null_positive)) for unit in self._null_units]
        if game.audit_pool and game.target_model == "pretrained":
            rows = [(unit, int(unit in self._pre_audit_in)) for unit in self._pre_audit_units]
        elif game.audit_pool:
            rows = [(unit, int(unit in self._audit_in)) for unit in self._audit_units]
        for unit in ([] if game.null_split or game.audit_pool else sorted(self._unit_group)):
            g = self._unit_group[unit]
            if g in game.positives:
                rows.append((unit, 1))
            elif g in game.negatives:
                rows.append((unit, 0))
        rng = np.random.default_rng([self.seed, int(content_hash(game.name, length=8), 16), *self._salt])
        rows = [rows[i] for i in rng.permutation(len(rows))]
        salt = content_hash(self.world_key, game.name, "ids")
        targets = []
        for unit, _ in rows:
            tid = content_hash(salt, unit, length=12)
            if self.unit == "record":
                targets.append(Target(id=tid, text=self._text[unit]))
            else:
                samples = self._samples(unit)
                targets.append(Target(id=tid, text=samples[0], samples=samples))
        return GameInstance(game, tuple(targets), np.array([lab for _, lab in rows], dtype=np.int64),
                            tuple(unit for unit, _ in rows))

    def view(self, inst: GameInstance, *, requires: frozenset[str], pretrained: LanguageModel,
             adapted: LanguageModel | None, reference: LanguageModel | None,
             population: tuple[str, ...] | None, attack_name: str = "attack",
             shadows: dict[str, ShadowSet] | None = None, trainers: dict[str, Any] | None = None) -> AttackerView:
        """Build the attacker's view of one game, giving the attack only what it declared and the game releases.

        ``trainers`` maps a start model ("base" = θ, "reference" = the attacker's) to a factory of
        :class:`bench.attacker_models.ReferenceTrainer`, for attacks that declare ``finetune_reference``; the
        trainer starts from θ where the game releases it, else from the attacker's reference model.
        Texts and ids reach the attacker as fresh copies, so ``gc.get_referrers`` on anything in the view leads
        back to the view only, never to this challenger, the game instance or the task data (see docs/attacks.md).
        """
        spec = inst.spec
        caps = frozenset(requires) & MODEL_CAPABILITIES
        target_model = pretrained if spec.target_model == "pretrained" else adapted
        if target_model is None:
            raise CapabilityError(f"game '{spec.name}' needs an adapted model but none was built")
        problem = capability_problem(spec, requires, attack_name=attack_name, task_name=self._data.name,
                                     unit=self.unit, reference=reference is not None, population=bool(population),
                                     shadow_sets=frozenset(k for k, v in (shadows or {}).items() if v is not None),
                                     trainer_starts=frozenset(k for k, v in (trainers or {}).items() if v is not None))
        if problem:
            raise CapabilityError(problem)
        base = RestrictedModel(pretrained, caps, "base") if spec.releases_base else None
        ref = None
        if REFERENCE_MODEL in requires:
            ref = RestrictedModel(reference, caps, "reference") if reference is not None else None
        pop = tuple(population) if POPULATION in requires else None
        shadow_set = None
        if SHADOW_MODELS in requires:
            raw = shadows[_shadow_start(spec)]
            shadow_set = ShadowSet(tuple(RestrictedModel(m, caps, "shadow") for m in raw.models),
                                   tuple(_detached(m) for m in raw.members), _detached(raw.held_out), raw.base)
        trainer = None
        if FINETUNE_REFERENCE in requires:
            which = _trainer_start(spec)
            trainer = trainers[which]()  # a fresh trainer per view: nothing shared leads back here
            if trainer is None:
                raise CapabilityError(f"attack '{attack_name}' fine-tunes a copy of the attacker's calibration model "
                                      f"but game '{spec.name}' has no {which} model to start from: set "
                                      f"`reference: true` in the suite")
        public = self._data.public_format
        if public is not None and "user_samples" in public:
            # a user's samples reach the attack as Target.samples; the map keyed by user id stays here
            public = {k: v for k, v in public.items() if k != "user_samples"}
        targets = tuple(Target(_copy_str(t.id), _copy_str(t.text), _detached(t.samples)) for t in inst.targets)
        return AttackerView(spec.name, targets, RestrictedModel(target_model, caps, "released"),
                            base, ref, None if pop is None else _detached(pop), shadow_set, public, self.unit,
                            trainer)


def _shadow_start(spec: GameSpec) -> str:
    """Which shadow set a game's attacker uses: shadows adapted from θ where the game releases it, else from the
    attacker's reference model; a pretraining audit compares θ with the reference model pretrained on population
    data."""
    return "base" if spec.releases_base else ("pretrain" if spec.target_model == "pretrained" else "reference")


def _trainer_start(spec: GameSpec) -> str:
    """The model an attacker's fine-tuned calibration model starts from: θ where released, else its reference."""
    return "base" if spec.releases_base else "reference"


def capability_problem(spec: GameSpec, requires: frozenset[str], *, attack_name: str, task_name: str, unit: str,
                       reference: bool, population: bool, shadow_sets: frozenset[str],
                       trainer_starts: frozenset[str]) -> str | None:
    """Why an attack declaring ``requires`` cannot be scored on game ``spec`` of a world, or None.

    One rule set for two moments: :meth:`Challenger.view` enforces it on the objects a world built, and
    ``Worlds.check`` (bench/world.py) on what the suite will build, before anything trains. ``reference``: the
    suite trains an attacker reference model; ``shadow_sets`` and ``trainer_starts``: the start models ("base",
    "reference", "pretrain") shadows and calibration fine-tunes exist for."""
    if POPULATION in requires and not population:
        return f"attack '{attack_name}' needs population data but task '{task_name}' has none: use another task"
    if USER_SAMPLES in requires and unit == "record":
        return (f"attack '{attack_name}' needs a unit's samples (user inference) but task '{task_name}' is "
                f"record-level: use a user or secret task (e.g. synthetic_users)")
    if REFERENCE_MODEL in requires and not reference and not spec.releases_base:
        return (f"attack '{attack_name}' needs a reference model, game '{spec.name}' releases no base model and the "
                f"suite trains no reference: set `reference: true` in the suite, or drop the attack or the game")
    if SHADOW_MODELS in requires and _shadow_start(spec) not in shadow_sets:
        return (f"attack '{attack_name}' needs shadow models for game '{spec.name}' but none are built: set "
                f"`reference: true` in the suite (shadows start from the attacker's reference model)")
    if FINETUNE_REFERENCE in requires and _trainer_start(spec) not in trainer_starts:
        return (f"attack '{attack_name}' fine-tunes a copy of the attacker's calibration model but game "
                f"'{spec.name}' has no {_trainer_start(spec)} model to start from: set `reference: true` in the suite")
    return None


def _copy_str(s: str) -> str:
    """A new string object equal to ``s`` (str(s) and s[:] return ``s`` itself): cuts gc referrer chains."""
    return s.encode("utf-8", "surrogatepass").decode("utf-8", "surrogatepass") if len(s) > 1 else s


def _detached(texts: tuple[str, ...]) -> tuple[str, ...]:
    return tuple(_copy_str(t) for t in texts)
