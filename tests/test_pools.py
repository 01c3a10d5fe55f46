"""The pooled draw (bench/pools.py): targets and D's background from one pool split by document under the world's
salt, so a defense that rebuilds the task's public pools cannot single out the targets in D̃.

Each exploit here is the dishonest defense's rule, applied to what ``adapt`` receives; the first also runs as a
plugin (tests/plugins/pool_filter_defense.py) on the real embedded task.
"""

from __future__ import annotations

import dataclasses
import sys
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from bench.errors import DataError
from bench.game import Challenger
from bench.metrics import roc_auc
from bench.pools import pooled_draw_applies, split_pool, split_user_pool, user_draw_applies
from fakes import make_task_data

sys.path.insert(0, str(Path(__file__).parent / "plugins"))
from pool_filter_defense import drop_public_targets, keep_public_background  # noqa: E402

WORLD = {"n_per_group": 20, "n_null": 40, "adapt_background": 40, "n_validation": 20}


def with_docs(data, *, per_doc: int = 6):
    """``data`` with each run of ``per_doc`` records of a partition in one document, as a chunked corpus has."""
    return dataclasses.replace(
        data, target_docs=tuple(f"t/{i // per_doc}" for i in range(len(data.targets))),
        adapt_docs=tuple(f"a/{i // per_doc}" for i in range(len(data.adapt))))


@pytest.fixture(scope="module")
def data():
    return with_docs(make_task_data(n_targets=600, n_adapt=600, seed=3))


def doc_of(data) -> dict[str, str]:
    out = {r.text: d for r, d in zip(data.targets, data.target_docs)}
    out.update(zip(data.adapt, data.adapt_docs))
    return out


def inserted_and_background(ch):
    d_tilde = ch.adaptation_data().texts
    inserted = set(ch.members("b"))
    return d_tilde, inserted, [t for t in d_tilde if t not in inserted]


# ------------------------------------------------------------------------------------------------ the split itself

def test_sides_are_whole_documents_of_the_pool_at_their_quotas(data):
    sides = split_pool(data, n_units=120, n_inserted=40, n_background=40, n_validation=20,
                       rng=np.random.default_rng(0))
    docs = doc_of(data)
    t_docs = {docs[r.text] for r in sides.targets}
    b_docs = {docs[t] for t in sides.background}
    v_docs = {docs[t] for t in sides.validation}
    assert not (t_docs & b_docs) and not (t_docs & v_docs) and not (b_docs & v_docs)
    # T holds the units and as much more as the pool allows (the lowest rate into D̃), B the same share scaled to
    # the background (40 / 40 here), V its 20
    assert len(sides.targets) >= 120 and len(sides.background) == len(sides.targets) and len(sides.validation) == 20
    assert len(sides.targets) + len(sides.background) == 2 * int(0.9 * (1200 - 20) * 40 / 80)
    tight = split_pool(data, n_units=540, n_inserted=40, n_background=40, n_validation=20,
                       rng=np.random.default_rng(0))  # the pool holds the least sizes only
    assert (len(tight.targets), len(tight.background)) == (540, 540)
    # both partitions feed both sides: the target side is not the task's target partition
    partition = {r.text for r in data.targets}
    assert 0 < sum(r.text in partition for r in sides.targets) < len(sides.targets)
    assert 0 < sum(t in partition for t in sides.background) < len(sides.background)


def test_the_split_follows_its_stream(data):
    kw = dict(n_units=120, n_inserted=40, n_background=40, n_validation=20)
    one = split_pool(data, rng=np.random.default_rng(1), **kw)
    assert split_pool(data, rng=np.random.default_rng(1), **kw) == one
    assert split_pool(data, rng=np.random.default_rng(2), **kw).targets != one.targets


def test_a_pool_too_small_for_the_world_names_the_fix(data):
    with pytest.raises(DataError, match="lower n_per_group, n_null, n_audit, n_audit_pretrain or adapt_background"):
        split_pool(data, n_units=900, n_inserted=100, n_background=200, n_validation=100,
                   rng=np.random.default_rng(0))
    with pytest.raises(DataError, match="lower n_per_group"):
        Challenger(data, {"n_per_group": 150, "n_null": 400, "adapt_background": 200}, seed=0)


def test_only_natural_record_tasks_use_it(data):
    assert pooled_draw_applies(data, known_a=False)
    assert not pooled_draw_applies(data, known_a=True)
    assert not pooled_draw_applies(dataclasses.replace(data, target_docs=None), known_a=False)
    assert not pooled_draw_applies(dataclasses.replace(data, public_format={"kind": "canary"}), known_a=False)
    assert pooled_draw_applies(dataclasses.replace(data, relation="overlap"), known_a=False)  # all of it in S
    assert not pooled_draw_applies(dataclasses.replace(data, unit="user"), known_a=False)


# ------------------------------------------------------------------------------------------------ the world

def test_background_shares_no_document_with_any_drawn_unit(data):
    ch = Challenger(data, WORLD, seed=0)
    assert ch.pooled and ch.pool_docs["T"] > 0
    docs = doc_of(data)
    d_tilde, inserted, background = inserted_and_background(ch)
    unit_docs = {docs[t] for t in ch.target_texts()}           # every unit: groups, null pool
    assert len(background) == WORLD["adapt_background"]
    assert not {docs[t] for t in background} & unit_docs
    validation = ch.adaptation_data().validation
    assert len(validation) == WORLD["n_validation"]
    assert not {docs[t] for t in validation} & ({docs[t] for t in d_tilde} | unit_docs)
    assert inserted <= set(d_tilde)


def test_pooled_worlds_have_their_own_keys_and_the_secret_moves_the_sides(data):
    old = Challenger(dataclasses.replace(data, target_docs=None, adapt_docs=None), WORLD, seed=0)
    new = Challenger(data, WORLD, seed=0)
    assert not old.pooled and old.world_key != new.world_key
    assert Challenger(data, WORLD, seed=0).adaptation_data() == new.adaptation_data()
    salted = Challenger(data, WORLD, seed=0, secret="s3cr3t")
    assert set(salted.adaptation_data().texts) != set(new.adaptation_data().texts)


# ------------------------------------------------------------------------------------------------ the exploits

def _exploit_aucs(data, score, seeds=range(12)):
    """AUC of a dishonest defense's score for "this record of D̃ is an inserted target", per secret world."""
    out = []
    for seed in seeds:
        ch = Challenger(data, WORLD, seed=seed, secret=f"s{seed}")
        d_tilde, inserted, _ = inserted_and_background(ch)
        out.append(roc_auc(np.array([t in inserted for t in d_tilde], dtype=int), np.array(score(d_tilde))))
    return np.array(out)


def partition_rule(pool: frozenset[str]):
    """The dishonest score of tests/plugins/pool_filter_defense.py: 1 for a record it would drop."""
    def score(texts):
        kept = set(drop_public_targets(texts, pool))
        return [float(t not in kept) for t in texts]
    return score


def test_filtering_the_public_target_partition_no_longer_finds_the_targets(data):
    """The channel as it was: with the background from the adaptation partition, dropping every record of D̃ in
    the public target partition drops exactly the targets (AUC 1). From one pool split by document, the targets
    are no likelier to lie in that partition than the background is."""
    in_pool = partition_rule(frozenset(r.text for r in data.targets))

    before = _exploit_aucs(dataclasses.replace(data, target_docs=None, adapt_docs=None), in_pool, seeds=range(3))
    assert np.all(before == 1.0)
    after = _exploit_aucs(data, in_pool)
    assert abs(after.mean() - 0.5) < 0.06, after


def test_overlap_subsets_pool_too(data):
    """An `overlap` subset draws its adaptation and target records from S's own records by a public hash: the same
    channel (AUC 1 under the task's partitions), closed the same way, and its a stays uncontrolled."""
    overlap = dataclasses.replace(data, relation="overlap")
    in_pool = partition_rule(frozenset(r.text for r in data.targets))
    before = _exploit_aucs(dataclasses.replace(overlap, target_docs=None, adapt_docs=None), in_pool, seeds=range(3))
    assert np.all(before == 1.0)
    after = _exploit_aucs(overlap, in_pool)
    assert abs(after.mean() - 0.5) < 0.06, after
    ch = Challenger(overlap, WORLD, seed=0)
    assert ch.pooled and ch.a_uncontrolled and ch.games_defined() == {"adapt", "null"}
    assert not ch.pretraining_inserts()


def test_document_coverage_does_not_mark_the_target_side(data):
    """A cleverer rule: a document whose records fill more of D̃ than another's belongs to the side D̃ samples
    more densely. Both sides are sampled at one rate, so the share says nothing."""
    docs = doc_of(data)
    size = Counter(docs.values())

    def coverage(texts):
        seen = Counter(docs[t] for t in texts)
        return [seen[docs[t]] / size[docs[t]] for t in texts]

    aucs = _exploit_aucs(data, coverage)
    assert abs(aucs.mean() - 0.5) < 0.06, aucs


def test_the_exploit_plugin_on_the_embedded_task(cache):
    """The plugin's own rule on the real Wikipedia pools of ``mini_pile`` (chunks of articles), in the quick
    track's world: it keeps the inserted targets at the background's rate."""
    from tasks.splits import make_task
    from pool_filter_defense import PoolFilter
    real = make_task("mini_pile", {"adapt_domain": "wiki"}).build(cache)
    assert pooled_draw_applies(real, known_a=False)
    pool = frozenset(r.text for r in real.targets)
    PoolFilter()  # registers and validates as any plugin does
    gaps = []
    for seed in range(4):
        ch = Challenger(real, {"n_per_group": 100, "n_null": 400, "adapt_background": 200}, seed=seed,
                        secret=f"s{seed}")
        d_tilde, inserted, background = inserted_and_background(ch)
        kept = set(drop_public_targets(d_tilde, pool))
        gaps.append(np.mean([t in kept for t in inserted]) - np.mean([t in kept for t in background]))
    assert abs(np.mean(gaps)) < 0.08, gaps


def test_partition_draw_is_an_explicit_opt_out_that_keys_its_worlds(data):
    """A task too small for a pooled world can run the draw of the task's own partitions, named in the world (and so
    in its key): the channel is then open, as the error of a too-large world says."""
    from bench.game import keyed_world
    ch = Challenger(data, dict(WORLD, pool_draw="partition"), seed=0)
    assert not ch.pooled
    _, _, background = inserted_and_background(ch)
    assert sorted(background) == sorted(data.adapt[:WORLD["adapt_background"]])
    assert ch.world_key != Challenger(data, WORLD, seed=0).world_key
    assert "pool_draw" not in keyed_world(Challenger(data, WORLD, seed=0).config)  # older worlds keep their keys
    with pytest.raises(DataError, match="set world pool_draw: partition"):
        Challenger(data, {"n_per_group": 150, "n_null": 400, "adapt_background": 200}, seed=0)


# ------------------------------------------------------------------------------------------------ tasks read from files

def _rows(n: int, tag: str) -> list[str]:
    words = "alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu nu xi omicron pi rho sigma".split()
    return [f"{tag} {i}: " + " ".join(words[(i * 7 + k * 3) % len(words)] for k in range(10)) for i in range(n)]


@pytest.fixture
def file_cache(tmp_path, monkeypatch):
    from bench.cache import ArtifactCache
    monkeypatch.setenv("PRIVBENCH_CACHE", str(tmp_path / "pbcache"))
    pre = tmp_path / "pretrain.jsonl"
    pre.write_text("".join(f'{{"text": "{t}"}}\n' for t in _rows(20, "pretraining")))
    return ArtifactCache(tmp_path / "pbcache"), str(pre)


def test_record_tasks_read_from_files_pool_too(tmp_path, file_cache):
    """SAMSum, German Wikipedia and a user's own file keep one record per row, each its own document, and are
    rebuilt by anyone from the same file: their worlds pool the adaptation and target partitions as mini_pile's do,
    so the rule of tests/plugins/pool_filter_defense.py (drop the public target partition) finds nothing."""
    import pandas as pd
    from tasks.hub import SamSum
    cache, pre = file_cache
    dialogues = _rows(900, "Amanda")
    f = tmp_path / "samsum.parquet"
    pd.DataFrame({"id": [str(i) for i in range(900)], "dialogue": dialogues,
                  "summary": [f"They talk {i}." for i in range(900)]}).to_parquet(f)
    d = SamSum(source=str(f), pretrain_path=pre).build(cache)
    assert d.target_docs == tuple(r.id for r in d.targets) and len(d.adapt_docs) == len(d.adapt)
    assert pooled_draw_applies(d, known_a=False) and Challenger(d, WORLD, seed=0).pooled
    in_pool = partition_rule(frozenset(r.text for r in d.targets))

    old = dataclasses.replace(d, target_docs=None, adapt_docs=None)
    assert np.all(_exploit_aucs(old, in_pool, seeds=range(2)) == 1.0)
    after = _exploit_aucs(d, in_pool)
    assert abs(after.mean() - 0.5) < 0.06, after


def test_local_text_keeps_a_document_on_one_side(tmp_path, file_cache):
    """``document_column`` names the document of each record (chunks of one text): a document's records share a
    partition of the task and a side of the world's split, so no background record is a sibling of a target."""
    import json
    from tasks.user_files import LocalText
    cache, pre = file_cache
    f = tmp_path / "mine.jsonl"
    f.write_text("".join(json.dumps({"text": t, "doc": f"d{i // 5}"}) + "\n" for i, t in enumerate(_rows(1500, "x"))))
    d = LocalText(path=str(f), document_column="doc", pretrain_path=pre).build(cache)
    doc = {json.loads(line)["text"]: json.loads(line)["doc"] for line in f.read_text().splitlines()}
    parts = {"heldout": d.heldout, "population": d.population, "adapt": d.adapt,
             "targets": [r.text for r in d.targets]}
    owner = {}
    for name, texts in parts.items():
        for t in texts:
            assert owner.setdefault(doc[t], name) == name  # a document lies in one partition
    assert d.target_docs == tuple(doc[r.text] for r in d.targets)
    ch = Challenger(d, WORLD, seed=0, secret="s")
    assert ch.pooled
    _, _, background = inserted_and_background(ch)
    assert not {doc[t] for t in background} & {doc[t] for t in ch.target_texts()}
    # without the column every record is its own document, and the world still pools
    plain = LocalText(path=str(f), pretrain_path=pre).build(cache)
    assert plain.target_docs == tuple(r.id for r in plain.targets) and plain.fingerprint != d.fingerprint


def test_documents_given_wrong_are_refused(tmp_path, file_cache):
    import json
    from bench.errors import ConfigError
    from tasks.user_files import LocalText, assemble_task_data
    cache, pre = file_cache
    with pytest.raises(ConfigError, match="drop document_column"):
        LocalText(path="x.jsonl", user_column="user", document_column="doc")
    f = tmp_path / "holes.jsonl"
    f.write_text("".join(json.dumps({"text": t, "doc": "" if i == 7 else "d"}) + "\n"
                         for i, t in enumerate(_rows(50, "x"))))
    with pytest.raises(DataError, match="document column 'doc' is empty: give every row its document"):
        LocalText(path=str(f), document_column="doc", pretrain_path=pre).build(cache)
    with pytest.raises(DataError, match="no document column 'chapter'.*set document_column"):
        LocalText(path=str(f), document_column="chapter", pretrain_path=pre).build(cache)
    kw = dict(pretrain=["p"], heldout=["h"], population=["q"], adapt=["a", "b"], targets=[], relation="ood")
    with pytest.raises(DataError, match="2 adaptation records: give each adaptation record its document"):
        assemble_task_data("t", **kw, adapt_docs=["d"], target_docs=[])
    with pytest.raises(DataError, match="give both"):
        assemble_task_data("t", **kw, adapt_docs=["d", "e"])


# ------------------------------------------------------------------------------------------------ user tasks

USER_WORLD = {"n_per_group": 12, "n_null": 24, "adapt_background": 60, "n_validation": 20}


def user_task(seed: int = 5):
    """A user task: target users and adaptation users of 1-6 records each (one size distribution for both, as
    ``synthetic_users`` draws them), two of the target users canaries, every text unique; no held-aside samples
    (the attacker's samples are then a user's own records, as ``enron_users``)."""
    data = make_task_data(n_targets=420, n_adapt=300, seed=seed)
    rng = np.random.default_rng(seed)

    def owners(n: int, tag: str) -> list[str]:
        sizes = rng.integers(1, 7, size=n)
        return [f"{tag}{j}" for j in np.repeat(np.arange(n), sizes)[:n]]

    t_owner = owners(len(data.targets), "t")
    meta = {r.id: {"user": u, "canary": u in ("t0", "t1")} for r, u in zip(data.targets, t_owner)}
    return dataclasses.replace(data, unit="user", target_meta=meta, adapt_owners=tuple(owners(len(data.adapt), "a")))


def owner_map(data) -> dict[str, str]:
    out = {r.text: data.target_meta[r.id]["user"] for r in data.targets}
    out.update(zip(data.adapt, data.adapt_owners))
    return out


def test_user_sides_are_whole_users_drawn_from_both_partitions():
    data = user_task()
    assert user_draw_applies(data, known_a=False) and not user_draw_applies(data, known_a=True)
    assert not user_draw_applies(dataclasses.replace(data, adapt_owners=None), known_a=False)
    sides = split_user_pool(data, n_units=60, n_pretrain_audit=4, n_background=60, n_validation=20,
                            rng=np.random.default_rng(0))
    owner = owner_map(data)
    users = {side: {owner[t] for t in texts} for side, texts in (
        ("T", [r.text for r in sides.targets]), ("S", [r.text for r in sides.pretrain_audit]),
        ("B", sides.background), ("V", sides.validation))}
    assert all(not users[a] & users[b] for a in users for b in users if a < b)
    assert (len(users["T"]), len(users["S"])) == (60, 4) and {"t0", "t1"} <= users["T"]  # canary users are targets
    # whole users: every record of a side's user is on that side (V may cut its last user: V never reaches D̃)
    count = Counter(owner.values())
    assert all(sum(owner[r.text] == u for r in sides.targets) == count[u] for u in users["T"])
    assert sorted(sides.background) == sorted(t for t in owner if owner[t] in users["B"])
    assert list(sides.background_owners) == [owner[t] for t in sides.background]
    # the fewest whole users reaching adapt_background records
    last = sides.background_owners[-1]
    assert len(sides.background) >= 60 > len(sides.background) - count[last]
    assert len(sides.validation) == 20
    # both partitions feed both sides
    for side in ("T", "B"):
        assert any(u.startswith("t") for u in users[side]) and any(u.startswith("a") for u in users[side])
    assert all(sides.target_meta[r.id]["user"] == owner[r.text] for r in sides.targets + sides.pretrain_audit)


def test_user_split_errors_name_the_fix():
    data = user_task()
    with pytest.raises(DataError, match="lower n_per_group.*pool_draw: partition"):
        split_user_pool(data, n_units=400, n_pretrain_audit=0, n_background=60, n_validation=0,
                        rng=np.random.default_rng(0))
    samples = {"t3": ["a sample"]}
    with pytest.raises(DataError, match="publish samples of every user"):
        Challenger(dataclasses.replace(data, public_format={"user_samples": samples}), USER_WORLD, seed=0)
    shared = dataclasses.replace(data, adapt_owners=("t2",) + data.adapt_owners[1:])
    with pytest.raises(DataError, match="records must lie in one partition"):
        Challenger(shared, USER_WORLD, seed=0)


def _user_rule_aucs(data, world, seeds=range(12)):
    """AUC, per secret world, of two dishonest scores for "this record of D̃ belongs to an inserted target user":
    not lying in the task's public adaptation partition (the partition rule of tests/plugins), and its owner's
    number of records in D̃."""
    public_background = frozenset(data.adapt)
    out = []
    for seed in seeds:
        ch = Challenger(data, world, seed=seed, secret=f"s{seed}")
        d = ch.adaptation_data()
        inserted = set(ch.members("b"))
        labels = np.array([t in inserted for t in d.texts], dtype=int)
        kept = set(keep_public_background(d.texts, public_background))
        per_owner = Counter(d.users)
        out.append((roc_auc(labels, np.array([float(t not in kept) for t in d.texts])),
                    roc_auc(labels, np.array([float(per_owner[u]) for u in d.users]))))
    return np.array(out)


def test_the_public_adaptation_partition_no_longer_names_the_background_users():
    """The channel as it was: a user world took D's background from the task's adaptation partition, so keeping the
    records of D̃ in that public partition kept exactly the background and dropped every inserted target user (AUC
    1). From one pool of users split under the world's salt, a target user is as likely to come from either
    partition as a background user, and both bring all their records."""
    data = user_task()
    before = _user_rule_aucs(data, dict(USER_WORLD, pool_draw="partition"), seeds=range(3))
    assert np.all(before[:, 0] == 1.0), before
    after = _user_rule_aucs(data, USER_WORLD)
    assert abs(after[:, 0].mean() - 0.5) < 0.06 and abs(after[:, 1].mean() - 0.5) < 0.06, after


def test_user_worlds_have_their_own_keys_and_the_secret_moves_the_sides():
    from bench.units import unit_samples
    data = user_task()
    partition = Challenger(data, dict(USER_WORLD, pool_draw="partition"), seed=0)
    pooled = Challenger(data, USER_WORLD, seed=0)
    assert not partition.user_pooled and pooled.user_pooled and partition.world_key != pooled.world_key
    assert Challenger(data, USER_WORLD, seed=0).adaptation_data() == pooled.adaptation_data()
    salted = Challenger(data, USER_WORLD, seed=0, secret="s3cr3t")
    assert set(salted.adaptation_data().texts) != set(pooled.adaptation_data().texts)
    assert salted.world_key != pooled.world_key
    # a user T took from the adaptation partition shows its own records (this task sets none aside)
    owner = owner_map(data)
    moved = next(u for u in pooled.units() if u.startswith("a"))
    records = pooled._records[moved]
    assert sorted(unit_samples(pooled._data, moved, records)) == sorted(t for t in owner if owner[t] == moved)


def test_the_user_exploit_plugin_on_the_embedded_task(cache):
    """The plugin's rule (tests/plugins/pool_filter_defense.py, ``user_pool_filter``) on a real ``synthetic_users``
    build: under the task's own partitions it keeps the background and drops every inserted target user; under the
    world's user draw it keeps inserted users and background users at one rate."""
    from tasks.users import SyntheticUsers
    from pool_filter_defense import UserPoolFilter
    params = {"n_users": 60, "docs_median": 3.0, "max_docs": 8, "attacker_fraction": 0.2, "canary_users": 2,
              "canary_length": 8, "max_chars_per_source": 300_000}
    real = SyntheticUsers(**params).build(cache)
    UserPoolFilter(task_params=__import__("json").dumps(params))  # registers and validates as any plugin does
    world = {"n_per_group": 4, "n_null": 8, "adapt_background": 15, "n_validation": 5}
    background = frozenset(real.adapt)
    gaps = {}
    for draw in ("partition", "pooled"):
        gaps[draw] = []
        for seed in range(60 if draw == "pooled" else 4):  # 12 background users a world: many worlds
            ch = Challenger(real, dict(world, pool_draw=draw), seed=seed, secret=f"s{seed}")
            d_tilde, inserted, rest = inserted_and_background(ch)
            kept = set(keep_public_background(d_tilde, background))
            gaps[draw].append(np.mean([t in kept for t in inserted]) - np.mean([t in kept for t in rest]))
    assert np.allclose(gaps["partition"], -1.0), gaps
    assert abs(np.mean(gaps["pooled"])) < 0.1, gaps  # -0.045 ± 0.028: the canary users, targets by form, lean it
