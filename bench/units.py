"""Unit-level membership: what a user or secret target shows, what the defender knows, and unit scores.

The unit of membership (DESIGN.md, "The game") is a record, a user (all records of a user, Kandpal et al. 2024) or a
secret (all records carrying it, Ganesh et al. 2025). The challenger (:class:`bench.game.Challenger`) draws whole
units; this module holds the pieces around that draw:

* :func:`unit_samples` — what a unit target shows the attacker (``Target.samples``):

  - a **user** shows the user's held-aside documents (Kandpal et al. 2024, section 4.1: "we set aside 10% of a
    user's samples as the attacker's knowledge; these samples are never used for fine-tuning"), taken from
    ``public_format["user_samples"]``. A user task without held-aside samples (``enron_users``, ``local_text`` with a
    user column) shows the user's own records instead: that is *user-level membership inference* in Kandpal et al.'s
    terms (section 2, the attacker knows the exact training samples), a stronger attacker;
  - a **secret** shows its carriers, the records that carry it (``tasks/secrets.py``; Ganesh et al. 2025, section 3:
    the attacker may know "which examples contain which secrets", the protected part is the secret's content). A
    membership candidate is shown in full, as for any record target, so the carriers' texts — and the secret in them
    — are what the candidate is. No secret id, no other secret's string, and no (p_j, r_j) beyond the public spec
    reach the attack.

* :func:`owners_of` and :func:`secrets_of` — the defender's facts about its own training texts
  (``AdaptationData.users / secrets / secret_targets``), pseudonymised per world and never marking which
  records are targets.

* :func:`bench.attack.score_units` — how a record-level attack scores a unit: the mean of its record scores over the
  unit's samples (Kandpal et al. 2024, eq. 4 and appendix D, Table 2: the mean of example-level statistics beats the
  minimum or maximum). An attack that scores units itself sets ``scores_units = True``
  (``attacks/user_inference.py``) and reads ``Target.samples``.

* :func:`canary_unit_metrics` — AUC on canary units and on ordinary units separately (Kandpal et al. 2024,
  section 4.3, Figure 6: canary users vs real users).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from bench.errors import DataError
from bench.hashing import content_hash

if TYPE_CHECKING:
    from bench.metrics import MetricRow
    from bench.task import TaskData

__all__ = ["GROUPS", "NULL_POOL", "AUDIT_POOL", "AUDIT_PRETRAIN_POOL", "UNIT_META_KEYS", "unit_key", "group_targets_by_unit",
           "draw_unit_groups", "unit_samples", "owners_of", "SECRET_RUN", "defender_secrets", "secrets_of",
           "canary_unit_metrics"]


#: the four (a, b) groups of the holistic audit game: a = inserted into pretraining, b = into adaptation
GROUPS: tuple[tuple[int, int], ...] = ((0, 0), (0, 1), (1, 0), (1, 1))
#: the separate pool of never-inserted units the null game splits in half (never part of a 2×2 game)
NULL_POOL = "null"
#: the separate pool of audit canaries, each put into the adaptation data with probability 1/2 (the audit game)
AUDIT_POOL = "audit"
#: the separate pool of pretraining audit canaries, each put into the pretraining data with probability 1/2
#: (the audit/pretrain game)
AUDIT_PRETRAIN_POOL = "audit/pretrain"
#: the ``target_meta`` key that names a target's unit, per membership unit
UNIT_META_KEYS = {"user": "user", "secret": "secret_id"}

# ---------------------------------------------------------------------------------------- the draw

def unit_key(data: TaskData, record_id: str) -> str:
    """The membership unit of target ``record_id``: the record itself, its user or its secret."""
    if data.unit == "record":
        return record_id
    key = UNIT_META_KEYS.get(data.unit)
    if key is None:
        raise DataError(f"task '{data.name}' has membership unit {data.unit!r}: use one of record, "
                        f"{', '.join(UNIT_META_KEYS)}")
    meta = data.target_meta.get(record_id) or {}
    if meta.get(key) in (None, ""):
        raise DataError(f"task '{data.name}' (unit {data.unit}): target {record_id!r} has no "
                        f"target_meta[{key!r}]: every target must name its {data.unit}")
    return str(meta[key])


def group_targets_by_unit(data: TaskData) -> dict[str, list[int]]:
    """Unit key -> indices into ``data.targets`` of the records of that unit, in first-appearance order.

    For ``unit == "record"`` every target is its own unit (keyed by its id), so a challenger that draws
    units draws exactly what it drew before. Target ids must be unique.
    """
    out: dict[str, list[int]] = {}
    seen: set[str] = set()
    for i, rec in enumerate(data.targets):
        if rec.id in seen:
            raise DataError(f"task '{data.name}': target id {rec.id!r} appears twice: target ids must be unique")
        seen.add(rec.id)
        out.setdefault(unit_key(data, rec.id), []).append(i)
    return out


def draw_unit_groups(data: TaskData, sizes: dict, rng: np.random.Generator, *,
                     known_a: bool = False) -> dict[str, tuple[int, int] | str]:
    """Record id -> its (a, b) group, or :data:`NULL_POOL`, drawing whole units: ``sizes[g]`` units per group.

    ``sizes`` maps each of the four groups of :data:`GROUPS` (and optionally :data:`NULL_POOL`) to a number of
    units. The null pool is drawn from the same pool as group (0, 0) but is a separate set of units that no
    other game shows (DESIGN.md: the null game never shares units with the 2×2 games). Every record of a unit
    gets the unit's group. With ``known_a`` (a fixed by the data, e.g. a released model's split) the units of
    each a are drawn from their own pool (the null pool from a = 0), and all records of a unit must share
    ``target_meta[id]["a"]``.
    """
    units = group_targets_by_unit(data)
    keys = list(units)
    noun = "records" if data.unit == "record" else f"{data.unit}s"
    order_of_groups: list = (list(GROUPS) + ([NULL_POOL] if sizes.get(NULL_POOL) else [])
                             + ([AUDIT_POOL] if sizes.get(AUDIT_POOL) else [])
                             + ([AUDIT_PRETRAIN_POOL] if sizes.get(AUDIT_PRETRAIN_POOL) else []))
    out: dict[str, tuple[int, int] | str] = {}

    def place(key: str, g) -> None:
        for i in units[key]:
            out[data.targets[i].id] = g

    def a_bit(g) -> int:
        return 0 if g in (NULL_POOL, AUDIT_POOL, AUDIT_PRETRAIN_POOL) else g[0]

    if known_a:
        a_of: dict[str, int] = {}
        for k, idx in units.items():
            bits = {int(data.target_meta[data.targets[i].id]["a"]) for i in idx}
            if len(bits) != 1:
                raise DataError(f"task '{data.name}': {data.unit} {k!r} has records with a=0 and a=1: the records "
                                f"of one {data.unit} must share their known pretraining membership")
            a_of[k] = bits.pop()
        pools = {a: [k for k in keys if a_of[k] == a] for a in (0, 1)}
        for a in (0, 1):
            want = sum(sizes[g] for g in order_of_groups if a_bit(g) == a)
            if len(pools[a]) < want:
                raise DataError(f"task '{data.name}' has {len(pools[a])} target {noun} with known a={a} but the "
                                f"world needs {want}: lower n_per_group / n_null in the suite's `world`")
        for a in (0, 1):
            order = [pools[a][int(i)] for i in rng.permutation(len(pools[a]))]
            start = 0
            for g in (g for g in order_of_groups if a_bit(g) == a):
                for k in order[start:start + sizes[g]]:
                    place(k, g)
                start += sizes[g]
        return out
    need = sum(sizes[g] for g in order_of_groups)
    if len(keys) < need:
        raise DataError(f"task '{data.name}' has {len(keys)} target {noun} but the world needs {need} "
                        f"(4 × n_per_group + n_null + n_audit + n_audit_pretrain, counted in {noun}): lower them in the suite's `world` "
                        f"or use "
                        f"more data")
    chosen = rng.permutation(len(keys))[:need]
    start = 0
    for g in order_of_groups:
        for i in chosen[start:start + sizes[g]]:
            place(keys[int(i)], g)
        start += sizes[g]
    return out


def unit_samples(data: TaskData, unit: str, record_ids: Sequence[str]) -> tuple[str, ...]:
    """What the attacker legitimately knows of ``unit`` (records ``record_ids``): see the module docstring."""
    if data.unit == "record":
        return ()
    text = {r.id: r.text for r in data.targets}
    own = tuple(text[r] for r in sorted(record_ids))
    if data.unit == "user":
        samples = (data.public_format or {}).get("user_samples")
        if samples is None:  # no held-aside documents: user-level membership inference on its own records
            return own
        if not samples.get(unit):
            raise DataError(f"task '{data.name}': user {unit!r} has no entry in public_format['user_samples']: "
                            f"set aside at least one document of every target user (attacker_fraction > 0)")
        return tuple(samples[unit])
    if data.unit == "secret":
        return own
    raise DataError(f"task '{data.name}' has membership unit {data.unit!r}: use record, user or secret")


def _pseudonym(world_key: str, kind: str, value: Any) -> str:
    return content_hash(world_key, kind, value, length=12)


def owners_of(data: TaskData, world_key: str, n_background: int, target_units: Sequence[str]) -> list[str]:
    """Owner of each adaptation text (background first, then target records), pseudonymised per world.

    Background owners are ``data.adapt_owners``, the users of the task's adaptation records; target records are
    owned by their user. Both are real users with their own numbers of records, so an owner's record count says
    nothing about whether it is a target. A user task without ``adapt_owners`` is refused: giving each
    background record its own owner would mark every owner of several records as a target. The pseudonyms are
    one hash of the world key and the user id, so background and target owners look alike and the defense
    cannot look a user up in the attacker's public data.
    """
    provided = data.adapt_owners
    if provided is None:
        raise DataError(f"task '{data.name}' has membership unit 'user' but names no owners of its adaptation "
                        f"records (TaskData.adapt_owners): give every adaptation record its user")
    if len(provided) < n_background:
        raise DataError(f"task '{data.name}' names owners of {len(provided)} adaptation records but the world "
                        f"uses {n_background}: give every adaptation record an owner")
    bg = [_pseudonym(world_key, "user", provided[i]) for i in range(n_background)]
    return bg + [_pseudonym(world_key, "user", u) for u in target_units]


def held_out_user_validation(data: TaskData, n_background: int, n: int) -> tuple[str, ...] | None:
    """A user world's validation records: the first ``n`` adaptation records after D's background whose owners
    have no record in D, or None when the task names no owners.

    Kandpal et al. 2024 (appendix C) validate on documents of users held in to training. Here those would be
    documents of D's background users alone (a target user's held-aside documents are the attacker's samples),
    so they would name the background users and mark every other user of D as a target, for a dishonest defense
    to drop. Users outside D mark no one; their loss rises with user-level overfitting where held-in users' falls
    (Kandpal et al., Fig. 4), so early stopping on them stops no later than on held-in users."""
    owners = data.adapt_owners
    if owners is None:
        return None
    in_d = set(owners[:n_background])
    return tuple(t for t, u in zip(data.adapt[n_background:], owners[n_background:]) if u not in in_d)[:n]


#: a maximal run of the characters secrets are made of; every occurrence of a secret lies inside one run
SECRET_RUN = re.compile(r"[A-Za-z0-9_\-]+")


def defender_secrets(data: TaskData, texts: Iterable[str]) -> dict[str, dict[str, Any]]:
    """The defender's spec for its training ``texts``: ``{secret: {"secret_id", "p", "r", "n_records"}}``.

    The data owner knows every secret in its own data and its (p_j, r_j) (Ganesh et al. 2025, section 3), target
    or not: the secrets come from the challenger-only ``data.secret_spec`` (every secret the task inserted) and,
    for a secret task built without one, from ``target_meta``. Only secrets that occur in ``texts`` are returned;
    ``n_records`` counts the texts carrying the secret. No label and no partition reach the defense: a target
    and a background secret get entries of the same form.
    """
    spec: dict[str, dict[str, Any]] = {}
    for s, v in (data.secret_spec or {}).items():
        spec[s] = {"secret_id": v["secret_id"], "p": v["p"], "r": v["r"], "n_records": 0}
    for meta in data.target_meta.values():
        if "secret" in meta:
            spec.setdefault(meta["secret"], {"secret_id": meta["secret_id"], "p": meta["p"], "r": meta["r"],
                                             "n_records": 0})
    by_run = {s.casefold(): s for s in spec}
    for t in texts:
        for s_cf in {r for r in SECRET_RUN.findall(t.casefold()) if r in by_run}:
            spec[by_run[s_cf]]["n_records"] += 1
    return {s: v for s, v in spec.items() if v["n_records"] > 0}


def secrets_of(data: TaskData, texts: Sequence[str]) -> tuple[list[tuple[str, ...]], dict[str, tuple[float, float]]]:
    """The secrets each text carries (by secret id) and each carried secret's (p_j, r_j) (Ganesh et al. 2025).

    Computed with :func:`defender_secrets` from the texts the defense already holds and the challenger-only
    ``data.secret_spec``, so it tells the defense only what the data owner knows about its own data (Ganesh et
    al. 2025, section 3): every secret in it, target and background alike. On the ``secrets`` task every
    adaptation record carries one, so a secret in a text does not mark the text as a target. The runner calls it
    on the attacker's population slices too, to hand a shadow of a secret-aware recipe (Hush) the attacker's own
    secrets.
    """
    spec = defender_secrets(data, texts)
    by_run = {s.casefold(): v["secret_id"] for s, v in spec.items()}
    per_text = [tuple(sorted({by_run[r] for r in SECRET_RUN.findall(t.casefold()) if r in by_run})) for t in texts]
    targets = {v["secret_id"]: (float(v["p"]), float(v["r"])) for v in spec.values()}
    return per_text, targets


# ---------------------------------------------------------------------------------------- metrics

#: fewer units than this on either side of a canary / ordinary subset and its AUC row is flagged underpowered
SUBSET_MIN_PER_SIDE = 20


def canary_unit_metrics(labels: np.ndarray, scores: np.ndarray, canary: Iterable[bool]) -> list[MetricRow]:
    """AUC among canary units and among ordinary units (Kandpal et al. 2024, Figure 6), where both have both classes.

    Rows ``auc_canary_units`` and ``auc_ordinary_units``; nothing when the world has no canary units. A row with
    fewer than :data:`SUBSET_MIN_PER_SIDE` units on a side is flagged ``underpowered``: with 4 vs 4 canary users
    an AUC of 0.8 is within chance (θ′ = θ reaches it), so such a row must not read as evidence.
    """
    from bench.metrics import FLAG_UNDERPOWERED, MetricRow, roc_auc

    y = np.asarray(labels, dtype=np.int64)
    s = np.asarray(scores, dtype=np.float64)
    c = np.fromiter(canary, dtype=bool, count=len(y))
    if not c.any():
        return []
    rows = []
    for name, mask in (("auc_canary_units", c), ("auc_ordinary_units", ~c)):
        n_pos, n_neg = int(y[mask].sum()), int((1 - y[mask]).sum())
        if n_pos and n_neg:
            flag = FLAG_UNDERPOWERED if min(n_pos, n_neg) < SUBSET_MIN_PER_SIDE else None
            rows.append(MetricRow(name, float(roc_auc(y[mask], s[mask])), None, None, n_pos, n_neg, flag))
    return rows
