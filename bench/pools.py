"""Secret sides of the adaptation pool: which documents give targets, which give D's background.

Why: a task builds its adaptation and target pools from public text with public code, so a defense that rebuilds
the task could drop every record of D̃ that lies in the target pool and train on the background alone (its
membership games would then read like the undefended model's absence). Here the world pools both partitions and
splits them again by *document*, with its own salted random stream, into four sides:

* **T**, the target side: every unit the world draws (four groups, null pool, audit pool C) comes from it;
* **B**, the background side: D's background is a uniform draw of ``adapt_background`` of its records;
* **S**, the pretraining audit side: the canaries C_S, inserted into pretraining only, never into D̃;
* **V**, the validation side: the records the data owner holds back (given to defenses that validate), from
  documents of neither, so that knowing them tells a defense nothing about T or B.

Whole documents go to one side, so no background record is a sibling chunk of a target (the confound that sank
drawing the background from the target pool's leftovers), and a target's siblings reach D̃ only as other targets,
as before. The sides are sized so that D̃ samples both at one rate (``n_b1 / |T| ≈ adapt_background / |B|``): a
document's share of its records in D̃ then says nothing about which side it is on. With the world's ``secret``
the split cannot be recomputed; without it, it is as public as the rest of the draw (docs/submitting.md).
"""

from __future__ import annotations

from dataclasses import dataclass
from math import ceil

import numpy as np

from bench.errors import DataError
from bench.hashing import text_hash
from bench.task import TargetRecord, TaskData

__all__ = ["KNOWN_A_DRAW_VERSION", "POOLED_DRAW_VERSION", "USER_DRAW_VERSION", "PooledSides", "known_a_draw_applies",
           "pooled_draw_applies", "split_known_pool", "split_pool", "split_user_pool", "user_draw_applies"]

#: the version of this split, part of every pooled world's key
POOLED_DRAW_VERSION = "1"
#: the version of the split of tasks whose pretraining membership is known (:func:`split_known_pool`)
KNOWN_A_DRAW_VERSION = "1"
#: the version of the split of user tasks (:func:`split_user_pool`)
USER_DRAW_VERSION = "1"
#: orders of the documents tried before a pool too lumpy for the world is refused (a large document early in the
#: order can leave too little for B; no bundled world needed one in 1,000 orders, so it is a tight pool's fallback)
ATTEMPTS = 20
#: the share of the pool (less V and S) that T and B fill together when it holds more than the world needs: the
#: rest absorbs the overshoot of whole documents, so V still gets its records
POOL_SHARE = 0.9


@dataclass(frozen=True)
class PooledSides:
    """The three sides of one world's adaptation pool (records of the adaptation and target partitions)."""

    targets: tuple[TargetRecord, ...]         # T: the pool the world's units are drawn from
    background: tuple[str, ...]               # B, in a random order: D's background is its head
    validation: tuple[str, ...]               # V: held back by the data owner
    pretrain_audit: tuple[TargetRecord, ...]  # S: the pretraining audit canaries' pool (never in D̃)
    n_docs: dict[str, int]                    # documents per side (users per side, split_user_pool)
    background_members: tuple[str, ...] = ()  # B's records in pretraining (known split: its member records)
    background_owners: tuple[str, ...] = ()   # the user of each record of B (user tasks, split_user_pool)
    target_meta: dict | None = None           # target_meta of T and S (user tasks: records B's users brought in)


def pooled_draw_applies(data: TaskData, *, known_a: bool) -> bool:
    """Whether ``data`` draws targets and background from one pool: record tasks of natural text whose builder
    kept each record's document, ``overlap`` subsets included (their targets and background are records of S
    alike). Tasks whose targets differ from the background by construction (canaries, Names2IDs, users, secrets: a
    ``public_format`` or another unit) keep their target pool, and tasks whose targets' pretraining membership is
    given by the data (``known_a``) split theirs by it (:func:`split_known_pool`)."""
    return (data.adapt_docs is not None and data.target_docs is not None and data.unit == "record"
            and data.public_format is None and not known_a)


def _fill(order: list[str], by_doc: dict[str, list[int]],
          quota: dict[str, int]) -> tuple[dict[str, list[int]], dict[str, int]]:
    """Whole documents, in ``order``, to T until it holds its quota of records, then to B, then S, then V."""
    sides: dict[str, list[int]] = {"T": [], "B": [], "S": [], "V": []}
    n_docs = {"T": 0, "B": 0, "S": 0, "V": 0}
    todo = ["T", "B", "S", "V"]
    for doc in order:
        while todo and len(sides[todo[0]]) >= quota[todo[0]]:
            todo.pop(0)
        if not todo:
            break
        sides[todo[0]].extend(by_doc[doc])
        n_docs[todo[0]] += 1
    return sides, n_docs


def split_pool(data: TaskData, *, n_units: int, n_inserted: float, n_background: int, n_validation: int,
               rng: np.random.Generator, n_pretrain_audit: int = 0) -> PooledSides:
    """Split the pooled adaptation and target partitions of ``data`` by document into V, T and B.

    ``n_units`` records must fit in T (every unit the world draws), of which about ``n_inserted`` go into D̃; B
    holds ``|T| * n_background / n_inserted`` records (at least ``n_background``), so that D̃ samples either side at
    one rate, ``n_inserted / |T|``. T is as large as :data:`POOL_SHARE` of the pool allows (at least ``n_units``):
    the lower that rate, the fewer of an untrained target's sibling chunks are trained on. Documents are taken in an
    order drawn from ``rng``: T until it has its quota of records, then B, then S (``n_pretrain_audit``, the
    pretraining audit pool: never in D̃, so outside the rate), then V, up to ``n_validation`` records of what is
    left (a new order while T, B or S is short, up to :data:`ATTEMPTS`, then the least sizes); each side keeps its
    quota of its records at random, and the rest of the pool is unused. V may be short on a small pool, as the
    adaptation partition's tail could be before.
    """
    if data.adapt_docs is None or data.target_docs is None:
        raise DataError(f"task '{data.name}' keeps no document per record: it cannot use the pooled draw")
    if n_inserted <= 0:
        raise DataError(f"task '{data.name}': a world that inserts no target cannot size its background side")
    records: list[tuple[str, str, str]] = []  # (id, text, document)
    records += [(t.id, t.text, d) for t, d in zip(data.targets, data.target_docs)]
    records += [(f"adapt-{text_hash(text)[:12]}", text, d) for text, d in zip(data.adapt, data.adapt_docs)]
    by_doc: dict[str, list[int]] = {}
    for i, (_, _, doc) in enumerate(records):
        by_doc.setdefault(doc, []).append(i)
    docs = sorted(by_doc)
    fix = ("lower n_per_group, n_null, n_audit, n_audit_pretrain or adapt_background in the suite's `world`, "
           "build the task with more text (max_chars_per_source), or set world pool_draw: partition (the task's "
           "own partitions, half the records; a defense can then recognise targets by theirs, docs/submitting.md)")

    def quotas(n_target_side: int) -> dict[str, int]:
        return {"T": n_target_side, "B": max(n_background, ceil(n_target_side * n_background / n_inserted)),
                "S": n_pretrain_audit, "V": n_validation}

    least = quotas(n_units)
    need = least["T"] + least["B"] + least["S"]
    if len(records) < need:
        raise DataError(f"task '{data.name}' has {len(records)} adaptation and target records but the world needs "
                        f"{need}: {n_units} for its units ({n_inserted:g} of them inserted into D), {least['B']} for "
                        f"the background side ({n_background} drawn, at the units' rate) and {n_pretrain_audit} for "
                        f"the pretraining audit pool: {fix}")
    # T and B share the pool at one rate, the lowest the pool allows (the fewest trained siblings per untrained
    # target), leaving POOL_SHARE's rest for S, V and the overshoot of whole documents; the least sizes if that fails
    room = int(POOL_SHARE * (len(records) - n_validation - n_pretrain_audit) * n_inserted / (n_inserted + n_background))
    fitted = None
    for quota in ([quotas(room)] if room > n_units else []) + [least]:
        for _ in range(ATTEMPTS):
            sides, n_docs = _fill([docs[i] for i in rng.permutation(len(docs))], by_doc, quota)
            if all(len(sides[s]) >= quota[s] for s in ("T", "B", "S")):
                fitted = quota
                break
        if fitted:
            break
    if fitted is None:
        raise DataError(
            f"task '{data.name}' pools {len(records)} adaptation and target records in {len(docs)} documents; a "
            f"world that samples targets and background at one rate needs {n_units} for its units ({n_inserted:g} "
            f"of them inserted into D), {least['B']} for the background side ({n_background} drawn) and "
            f"{n_pretrain_audit} for the pretraining audit pool, and {ATTEMPTS} draws of the documents' order did not "
            f"fit them in whole documents: {fix}")
    quota = fitted
    # each side keeps exactly its quota, at random: T's and B's last documents overshoot it, and a larger T or B
    # would change the rate at which D̃ samples that side
    kept = {side: [sides[side][i] for i in rng.permutation(len(sides[side]))][:quota[side]] for side in sides}

    def as_targets(side: str) -> tuple[TargetRecord, ...]:
        ordered = sorted(kept[side], key=lambda i: records[i][0])
        return tuple(TargetRecord(records[i][0], records[i][1]) for i in ordered)

    return PooledSides(targets=as_targets("T"), background=tuple(records[i][1] for i in kept["B"]),
                       validation=tuple(records[i][1] for i in kept["V"]), pretrain_audit=as_targets("S"),
                       n_docs=n_docs)


def known_a_draw_applies(data: TaskData, *, known_a: bool) -> bool:
    """Whether ``data`` draws its targets and D's background from its known members and non-members under the
    world's salt (:func:`split_known_pool`): record tasks whose targets' pretraining membership is given by the data
    (``mimir``, ``pile_split``)."""
    return known_a and data.unit == "record" and data.public_format is None


def split_known_pool(data: TaskData, *, n_units: dict[int, int], n_background: int, n_background_members: int,
                     n_validation: int, rng: np.random.Generator) -> PooledSides:
    """Split a task with known pretraining membership into T, B and V, each member or non-member at random.

    Why: such a task lists its members (a = 1: every one a target under the task's own draw) and hash-partitions its
    non-members into a target and an adaptation partition, from public files by public code. A defense that rebuilt
    the task would find every target of D̃, the members by the list and the others by their partition. Here the
    members form one stratum and the non-members of both partitions another; each stratum is shuffled with the
    world's salted ``rng`` and cut into T (``n_units[a]`` records, the units of that a) and B (D's background:
    ``n_background_members`` members, the other ``n_background - n_background_members`` non-members), and V takes
    up to ``n_validation`` of the non-members left. The partition then says nothing about T against B, and with as
    large a share of members in B as among the inserted targets (world ``background_in_pretraining: matched``)
    neither does the member list. Every record is its own document (these tasks keep none), so no sibling of a
    target can reach B.
    """
    meta = data.target_meta
    strata: dict[int, list[tuple[str, str]]] = {0: [], 1: []}
    for t in data.targets:
        strata[int(meta[t.id]["a"])].append((t.id, t.text))
    seen = {t.text for t in data.targets}  # a text both listed and in the adaptation partition counts once, listed
    for text in data.adapt:
        if text not in seen:
            seen.add(text)
            strata[0].append((f"adapt-{text_hash(text)[:12]}", text))
    want_b = {1: n_background_members, 0: n_background - n_background_members}
    fix = ("lower n_per_group, n_null, n_audit or adapt_background in the suite's `world`, give the task more rows "
           "(`n`), or set world pool_draw: partition (the task's own partitions; a defense can then recognise the "
           "targets by their partition and the member list, docs/submitting.md)")
    for a, noun in ((1, "member"), (0, "non-member")):
        need = n_units[a] + want_b[a]
        if len(strata[a]) < need:
            raise DataError(f"task '{data.name}' has {len(strata[a])} {noun} records (known a={a}) but the world "
                            f"needs {need}: {n_units[a]} for its units with a={a} and {want_b[a]} for D's "
                            f"background: {fix}")
    targets: list[TargetRecord] = []
    background: dict[int, list[str]] = {}
    validation: tuple[str, ...] = ()
    for a in (1, 0):
        order = [strata[a][int(i)] for i in rng.permutation(len(strata[a]))]
        targets += [TargetRecord(rid, text) for rid, text in order[:n_units[a]]]
        background[a] = [text for _, text in order[n_units[a]:n_units[a] + want_b[a]]]
        if a == 0:
            start = n_units[0] + want_b[0]
            validation = tuple(text for _, text in order[start:start + n_validation])
    mixed = background[1] + background[0]
    return PooledSides(targets=tuple(sorted(targets, key=lambda t: t.id)),
                       background=tuple(mixed[int(i)] for i in rng.permutation(len(mixed))),
                       validation=validation, pretrain_audit=(),
                       n_docs={"T1": n_units[1], "T0": n_units[0], "B1": want_b[1], "B0": want_b[0],
                               "V": len(validation)},
                       background_members=tuple(background[1]))


def user_draw_applies(data: TaskData, *, known_a: bool) -> bool:
    """Whether ``data`` draws its target users and D's background users from one pool of users under the world's
    salt (:func:`split_user_pool`): user tasks that name the owner of every adaptation record."""
    return data.unit == "user" and data.adapt_owners is not None and not known_a and bool(data.targets)


def split_user_pool(data: TaskData, *, n_units: int, n_pretrain_audit: int, n_background: int, n_validation: int,
                    rng: np.random.Generator) -> PooledSides:
    """Split the users of a user task's target and adaptation partitions, whole users, into T, S, B and V.

    Why: a user task deals its users into a target partition and an adaptation partition by public code, and the
    task's draw took D's background from the adaptation partition. A defense that rebuilt the task would know every
    background user of D̃, so every other user of D̃ is a target with b = 1, to drop (tests/test_pools.py shows the
    rule). Here both partitions' users form one pool, shuffled with the world's salted ``rng``: T takes ``n_units``
    users (the world's units; the task's canary users first, as they are targets by construction, Kandpal et al.
    2024, section 4.3), S the ``n_pretrain_audit`` users of the pretraining audit pool, B the fewest next users whose
    records reach ``n_background`` (whole users, so no user of D̃ is there in part: a target is always whole), and V
    up to ``n_validation`` records of the users after them (never in D̃). Every user in D̃, target or background,
    then brings all its records, and which partition a user came from says nothing about its side.

    The attacker's samples of a user that T took from the adaptation partition are the task's
    ``public_format["user_samples"]`` entry for it; a task that sets samples aside for its target users only cannot
    use this draw (the error says so)."""
    from bench.units import unit_key
    if data.adapt_owners is None or len(data.adapt_owners) != len(data.adapt):
        raise DataError(f"task '{data.name}' names no owner of every adaptation record: a user world needs "
                        f"TaskData.adapt_owners")
    records: dict[str, list[tuple[str, str]]] = {}  # user -> its (id, text), targets and adaptation records alike
    canary: set[str] = set()
    meta: dict = {}
    for t in data.targets:
        u = unit_key(data, t.id)
        records.setdefault(u, []).append((t.id, t.text))
        meta[t.id] = dict(data.target_meta.get(t.id, {}))
        if meta[t.id].get("canary"):
            canary.add(u)
    target_users = set(records)
    for text, owner in zip(data.adapt, data.adapt_owners):
        u = str(owner)
        if u in target_users:
            raise DataError(f"task '{data.name}': user {u!r} owns target records and adaptation records: a user's "
                            f"records must lie in one partition")
        rid = f"adapt-{text_hash(text)[:12]}"
        records.setdefault(u, []).append((rid, text))
        meta[rid] = {"user": u}
    samples = (data.public_format or {}).get("user_samples")
    if samples is not None:
        missing = sorted(u for u in records if u not in target_users and not samples.get(u))
        if missing:
            raise DataError(f"task '{data.name}' sets aside attacker samples for its target users only ({len(missing)} "
                            f"adaptation users have none, e.g. {missing[0]!r}), so a world cannot draw an adaptation "
                            f"user as a target: publish samples of every user in public_format['user_samples'], or "
                            f"set world pool_draw: partition (the task's own partitions; a defense can then recognise "
                            f"D's background users, docs/submitting.md)")
    fix = ("lower n_per_group, n_null, n_audit, n_audit_pretrain or adapt_background in the suite's `world`, give the "
           "task more users, or set world pool_draw: partition (the task's own partitions; a defense can then "
           "recognise D's background users, docs/submitting.md)")
    forced = sorted(canary)
    if len(forced) > n_units:
        raise DataError(f"task '{data.name}' has {len(forced)} canary users but the world draws {n_units} target "
                        f"users: {fix}")
    rest = sorted(u for u in records if u not in canary)
    order = forced + [rest[int(i)] for i in rng.permutation(len(rest))]
    t_users, s_users = order[:n_units], order[n_units:n_units + n_pretrain_audit]
    if len(t_users) + len(s_users) < n_units + n_pretrain_audit:
        raise DataError(f"task '{data.name}' has {len(records)} users in its target and adaptation partitions but "
                        f"the world needs {n_units + n_pretrain_audit} target users and more for D's background: {fix}")
    start = n_units + n_pretrain_audit
    b_users: list[str] = []
    n_b = 0
    while n_b < n_background and start < len(order):
        b_users.append(order[start])
        n_b += len(records[order[start]])
        start += 1
    if n_b < n_background:
        raise DataError(f"task '{data.name}': after {n_units + n_pretrain_audit} target users, the {len(b_users)} "
                        f"users left hold {n_b} records but D's background needs {n_background}: {fix}")
    v_texts: list[str] = []
    n_v_users = 0
    for u in order[start:]:
        if len(v_texts) >= n_validation:
            break
        v_texts += [text for _, text in records[u]]
        n_v_users += 1
    validation = tuple(v_texts[:n_validation])

    def as_targets(users: list[str]) -> tuple[TargetRecord, ...]:
        return tuple(TargetRecord(rid, text) for rid, text in sorted(r for u in users for r in records[u]))

    background = [(text, u) for u in b_users for _, text in records[u]]
    return PooledSides(targets=as_targets(t_users), background=tuple(t for t, _ in background),
                       validation=validation, pretrain_audit=as_targets(s_users),
                       n_docs={"T": len(t_users), "S": len(s_users), "B": len(b_users), "V": n_v_users},
                       background_owners=tuple(u for _, u in background),
                       target_meta={rid: meta[rid] for u in t_users + s_users for rid, _ in records[u]})
