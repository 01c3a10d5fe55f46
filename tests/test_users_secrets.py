"""Tests for tasks.users (synthetic users, Kandpal et al. 2024) and tasks.secrets (Hush secrets, Ganesh et al. 2025).

Properties are recomputed here from the built data, independently of the modules' own checks.
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections import Counter

import numpy as np
import pytest

from bench.errors import ConfigError, DataError
from bench.game import GROUPS, Challenger
from bench.hashing import content_hash
from bench.registry import TASKS
from bench.task import TargetRecord, TaskData
from bench.units import NULL_POOL, secrets_of
from tasks.mini_pile import MiniPile
from tasks.secrets import SECRET_RUN, Secrets, defender_secrets, insert_line, make_secret
from tasks.users import (
    SyntheticUsers, assign_topics, draw_doc_counts, draw_unit_groups, group_targets_by_unit,
    insert_at_word_boundary,
)

BUDGET = 300_000
USERS = dict(max_chars_per_source=BUDGET, n_users=40, docs_median=4.0, docs_sigma=0.6, min_docs=3, max_docs=12,
             canary_users=3, canary_length=8)
SECRETS = dict(max_chars_per_source=BUDGET, n_secrets=20, records_per_secret_min=2, records_per_secret_max=5,
               secret_kind="mixed")


@pytest.fixture(scope="module")
def base(cache):
    return MiniPile(max_chars_per_source=BUDGET).build(cache)


@pytest.fixture(scope="module")
def users(cache):
    return SyntheticUsers(**USERS).build(cache)


@pytest.fixture(scope="module")
def secrets(cache):
    return Secrets(**SECRETS).build(cache)


def by_user(data: TaskData) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for t in data.targets:
        out.setdefault(data.target_meta[t.id]["user"], []).append(t.text)
    return out


# ------------------------------------------------------------------------------------------- users

def test_users_registered_and_params():
    assert TASKS.get("synthetic_users") is SyntheticUsers
    names = {p.name for p in SyntheticUsers.params}
    assert {"n_users", "docs_median", "min_docs", "seed", "canary_users", "canary_length", "attacker_fraction",
            "max_chars_per_source", "salt"} <= names
    for bad in (dict(locales=[]), dict(locales=["xx_XX"]), dict(min_docs=5, max_docs=4), dict(canary_length=101),
                dict(canary_length=0), dict(attacker_fraction=0.0), dict(n_users=10, canary_users=9),
                dict(adapt_fraction=0.5, population_fraction=0.5), dict(min_docs=1)):
        with pytest.raises(ConfigError):
            SyntheticUsers(**bad)


def test_users_deterministic(cache, users):
    again = SyntheticUsers(**USERS).build(cache)
    assert again.fingerprint == users.fingerprint
    assert again.targets == users.targets and again.adapt == users.adapt and again.population == users.population
    assert again.target_meta == users.target_meta and again.public_format == users.public_format
    other = SyntheticUsers(**dict(USERS, seed=1)).build(cache)
    assert other.fingerprint != users.fingerprint and other.targets != users.targets


def test_users_sizes_and_partitions(users, base):
    assert users.name == "synthetic_users" and users.unit == "user" and users.relation == "ood"
    assert users.pretrain == base.pretrain and users.heldout == base.heldout
    st = users.stats["users"]
    n_adapt = n_pop = round(0.2 * 40)
    assert (st["adapt"]["n_users"], st["population"]["n_users"], st["targets"]["n_users"]) == (n_adapt, n_pop,
                                                                                                 40 - 2 * n_adapt)
    groups = by_user(users)
    samples = users.public_format["user_samples"]
    # every user of the two private partitions has published samples: a world may draw any of them as a target
    adapt_users = set(users.adapt_owners)
    assert len(groups) == st["targets"]["n_users"] and len(adapt_users) == st["adapt"]["n_users"]
    assert set(samples) == set(groups) | adapt_users and not set(groups) & adapt_users
    assert len(users.targets) + sum(len(samples[u]) for u in groups) == st["targets"]["n_docs"]
    # background users set aside the share target users do, so counts in D mark no target
    assert len(users.adapt) == st["adapt"]["n_docs"] - users.stats["users"]["background_set_aside"]
    assert users.stats["users"]["background_set_aside"] == sum(len(samples[u]) for u in adapt_users)
    assert users.stats["users"]["background_set_aside"] >= st["adapt"]["n_users"]   # at least one each
    # population: mini_pile's unused population records plus the population users' documents
    pop_docs = [t for t in users.population if t not in set(base.population)]
    assert len(pop_docs) == st["population"]["n_docs"]
    assert len(users.population) == len(base.population) - st["population"]["n_docs"] + len(pop_docs)
    ids = [t.id for t in users.targets]
    assert len(set(ids)) == len(ids) and set(users.target_meta) == set(ids)
    everything = [t.text for t in users.targets] + list(users.adapt) + list(users.population) + \
        [d for v in samples.values() for d in v]
    assert len(set(everything)) == len(everything)
    assert not set(everything) & (set(users.pretrain) | set(users.heldout))


def test_users_docs_spread(users):
    groups = by_user(users)
    samples = users.public_format["user_samples"]
    totals = [len(groups[u]) + len(samples[u]) for u in groups]
    assert min(totals) >= 3 and max(totals) <= 12
    assert len(set(totals)) >= 3  # a spread, not a constant
    st = users.stats["users"]
    for role in ("targets", "adapt", "population"):
        assert st[role]["min"] >= 3 and st[role]["max"] <= 12
    rng = np.random.default_rng(0)
    for dist in ("lognormal", "zipf"):
        c = draw_doc_counts(2000, rng, distribution=dist, median=6, sigma=0.8, zipf_a=2.0, min_docs=3, max_docs=50)
        assert min(c) == 3 and max(c) <= 50 and len(set(c)) > 10
        assert np.mean(c) > np.median(c)  # right-skewed: few heavy users


def test_attacker_samples_are_set_aside(users):
    groups = by_user(users)
    samples = users.public_format["user_samples"]
    target_texts, adapt = {t.text for t in users.targets}, set(users.adapt)
    for u, docs in groups.items():
        n = len(docs) + len(samples[u])
        assert len(samples[u]) == min(n - 1, max(1, round(0.1 * n))) and docs
        for s in samples[u]:
            assert s not in target_texts and s not in adapt and s not in set(users.population)
    # user ids are opaque and do not encode membership or role
    assert all(re.fullmatch(r"u-[0-9a-f]{12}", u) for u in samples)


def test_user_level_regularities(users):
    groups = by_user(users)
    samples = users.public_format["user_samples"]
    signatures = {}
    for u, docs in groups.items():
        docs = docs + samples[u]
        firsts = {d.split("\n", 1)[0] for d in docs}
        tails = {d.rsplit("\n\n", 1)[1] for d in docs}  # sign-off and signature
        assert len(firsts) == 1 and len(tails) == 1, u
        phrases = {d.rsplit("\n\n", 2)[1] for d in docs}
        assert 1 <= len(phrases) <= 2
        signatures[u] = tails.pop()
    assert len(set(signatures.values())) == len(signatures)  # identities are user-specific


def test_user_bodies_are_mini_pile_records(users, base):
    pool = [r.text for r in base.targets] + list(base.adapt)
    source = {i: r.id.rsplit("-", 1)[0] for i, r in enumerate(base.targets)}  # adapt records carry no id
    used = Counter()
    sources_of: dict[str, list[str]] = {}
    for t in users.targets:
        if users.target_meta[t.id]["canary"]:
            continue
        hits = [i for i, p in enumerate(pool) if p in t.text]
        assert len(hits) == 1, t.id
        used[hits[0]] += 1
        if hits[0] in source:
            sources_of.setdefault(users.target_meta[t.id]["user"], []).append(source[hits[0]])
    assert all(v == 1 for v in used.values())  # no record reused
    # topical coherence: a user's bodies come from one source (a module's code or a play), not a random mix
    purity = [max(Counter(v).values()) / len(v) for v in sources_of.values() if len(v) >= 2]
    assert len(purity) >= 5 and np.mean(purity) >= 0.85


def test_canary_users(users):
    groups = by_user(users)
    samples = users.public_format["user_samples"]
    canaries = {}
    for t in users.targets:
        m = users.target_meta[t.id]
        if m["canary"]:
            canaries.setdefault(m["user"], set()).add(m["canary_substring"])
        else:
            assert "canary_substring" not in m
    assert len(canaries) == 3
    for u, subs in canaries.items():
        assert len(subs) == 1
        s = subs.pop()
        assert len(s.split()) == 8 and s == " ".join(s.split())
        for d in groups[u] + samples[u]:
            assert s in d
    # different canary users have different substrings
    assert len({users.target_meta[t.id].get("canary_substring") for t in users.targets} - {None}) == 3


def test_canary_length_bounds(cache):
    d1 = SyntheticUsers(**dict(USERS, canary_users=2, canary_length=1)).build(cache)
    subs = {m["canary_substring"] for m in d1.target_meta.values() if m["canary"]}
    assert len(subs) <= 2 and all(len(s.split()) == 1 for s in subs)
    with pytest.raises(DataError, match="canary_length"):
        SyntheticUsers(**dict(USERS, canary_users=3, canary_length=100)).build(cache)


def test_users_pool_too_small(cache):
    with pytest.raises(DataError, match="max_chars_per_source"):
        SyntheticUsers(**dict(USERS, n_users=400, docs_median=10.0)).build(cache)


def test_helpers():
    rng = np.random.default_rng(3)
    body = "alpha beta\n    gamma delta"
    for _ in range(20):
        out = insert_at_word_boundary(body, "X Y", rng)
        assert "X Y" in out and out.replace(" X Y", "", 1).replace("X Y ", "", 1) == body
    texts = ["def foo(x): return foo_bar(x)", "def foo(y): return foo_bar(y) + 1", "HAMLET. To be or not",
             "HAMLET. Whether tis nobler", "class Spam: eggs = 1", "OPHELIA. My lord"]
    picks = assign_topics(texts, [2, 2, 1], np.random.default_rng(0))
    flat = [i for p in picks for i in p]
    assert [len(p) for p in picks] == [2, 2, 1] and len(set(flat)) == 5
    with pytest.raises(DataError):
        assign_topics(texts, [4, 3], np.random.default_rng(0))


# -------------------------------------------------------------------------------------- unit groups

def _fake(unit: str, meta: dict, n: int, *, a: bool = False) -> TaskData:
    targets = tuple(TargetRecord(f"r{i}", f"text {i}") for i in range(n))
    return TaskData(name="fake", pretrain=("p",), heldout=("h",), population=("q",), adapt=("x",) * 20,
                    targets=targets, fingerprint=f"fake-{unit}-{n}", unit=unit, target_meta=meta)


def test_group_targets_by_unit(users, secrets):
    g = group_targets_by_unit(users)
    assert sum(map(len, g.values())) == len(users.targets)
    assert set(g) == set(users.public_format["user_samples"]) - set(users.adapt_owners)
    for u, idx in g.items():
        assert {users.target_meta[users.targets[i].id]["user"] for i in idx} == {u}
    g = group_targets_by_unit(secrets)
    assert set(g) == set(secrets.public_format["secrets"])
    for sid, idx in g.items():
        assert {secrets.target_meta[secrets.targets[i].id]["secret_id"] for i in idx} == {sid}
        assert len(idx) == secrets.public_format["secrets"][sid]["n_records"]
    rec = _fake("record", {}, 5)
    assert group_targets_by_unit(rec) == {f"r{i}": [i] for i in range(5)}
    with pytest.raises(DataError, match="user"):
        group_targets_by_unit(_fake("user", {"r0": {"user": "a"}}, 2))
    with pytest.raises(DataError, match="unit"):
        group_targets_by_unit(_fake("team", {}, 2))
    dup = TaskData(**{**_fake("record", {}, 2).__dict__, "targets": (TargetRecord("x", "a"), TargetRecord("x", "b"))})
    with pytest.raises(DataError, match="twice"):
        group_targets_by_unit(dup)


def test_draw_unit_groups_keeps_units_together(users):
    sizes = {(0, 0): 4, (0, 1): 2, (1, 0): 2, (1, 1): 2}
    out = draw_unit_groups(users, sizes, np.random.default_rng(7))
    units = group_targets_by_unit(users)
    per_group = Counter()
    for u, idx in units.items():
        gs = {out.get(users.targets[i].id) for i in idx}
        assert len(gs) == 1  # all records of a user share one group (or none)
        if None not in gs:
            per_group[gs.pop()] += 1
    assert dict(per_group) == sizes  # sizes counted in users
    assert out == draw_unit_groups(users, sizes, np.random.default_rng(7))
    with pytest.raises(DataError, match="users"):
        draw_unit_groups(users, {g: 100 for g in GROUPS}, np.random.default_rng(0))


def test_draw_unit_groups_matches_record_challenger():
    data = _fake("record", {}, 60)
    world = {"n_per_group": 8, "n_null": 16, "adapt_background": 10}
    ch = Challenger(data, world, seed=3)
    rng = np.random.default_rng([3, int(content_hash(data.fingerprint, length=8), 16)])
    sizes = {(0, 0): 8, (0, 1): 8, (1, 0): 8, (1, 1): 8, NULL_POOL: 16}   # four equal groups and a null pool
    out = draw_unit_groups(data, sizes, rng)
    grouped = {r: g for r, g in out.items() if g != NULL_POOL}
    assert grouped == {r: ch.group_of(r) for r in grouped} and len(grouped) == 32
    assert {r for r, g in out.items() if g == NULL_POOL} == set(ch.null_units()) and len(out) == 48
    # known a: per-a pools, as the challenger draws them from the task's own partitions (the null pool comes from
    # the a = 0 pool; the pooled draw of a known split is tests/test_known_split_draw.py's)
    meta = {f"r{i}": {"a": int(i % 3 == 0)} for i in range(60)}
    data = _fake("record", meta, 60)
    ch = Challenger(data, dict(world, pool_draw="partition"), seed=3)
    rng = np.random.default_rng([3, int(content_hash(data.fingerprint, length=8), 16)])
    out = draw_unit_groups(data, sizes, rng, known_a=True)
    grouped = {r: g for r, g in out.items() if g != NULL_POOL}
    assert grouped == {r: ch.group_of(r) for r in grouped} and len(grouped) == 32
    assert all(meta[r]["a"] == 0 for r, g in out.items() if g == NULL_POOL)   # the null pool never has a = 1
    # a user whose records disagree on a known a is refused
    meta = {f"r{i}": {"user": f"u{i // 2}", "a": i % 2} for i in range(60)}
    with pytest.raises(DataError, match="a=0 and a=1"):
        draw_unit_groups(_fake("user", meta, 60), sizes, rng, known_a=True)


# ------------------------------------------------------------------------------------------ secrets

def test_secrets_registered_and_params():
    assert TASKS.get("secrets") is Secrets
    for bad in (dict(records_per_secret_min=5, records_per_secret_max=2), dict(r_min=1e-3, r_max=2e-4),
                dict(p=1e-3, r_min=1e-4), dict(secret_kind="password"), dict(n_secrets=0), dict(p=0.0)):
        with pytest.raises(ConfigError):
            Secrets(**bad)


def test_secrets_deterministic(cache, secrets):
    again = Secrets(**SECRETS).build(cache)
    assert again.fingerprint == secrets.fingerprint and again.targets == secrets.targets
    assert again.target_meta == secrets.target_meta and again.public_format == secrets.public_format
    other = Secrets(**dict(SECRETS, seed=5)).build(cache)
    assert other.fingerprint != secrets.fingerprint


def test_secrets_sizes_and_targets(secrets, base):
    assert secrets.unit == "secret" and secrets.name == "secrets"
    # pretraining stays secret-free; the other partitions are mini_pile's records, each carrying a background secret
    assert secrets.pretrain == base.pretrain
    assert [len(getattr(secrets, p)) for p in ("heldout", "population", "adapt")] == \
        [len(getattr(base, p)) for p in ("heldout", "population", "adapt")]
    by_secret = Counter(m["secret"] for m in secrets.target_meta.values())
    assert len(by_secret) == 20 and all(2 <= k <= 5 for k in by_secret.values())
    assert len(set(by_secret.values())) > 1
    assert len(secrets.targets) == sum(by_secret.values())
    kinds = Counter(m["secret_kind"] for m in secrets.target_meta.values())
    assert set(kinds) == {"word", "codename", "api_key"}
    for m in secrets.target_meta.values():
        assert m["p"] == 1e-10 and 2e-4 <= m["r"] <= 1e-3 and m["n_records"] == by_secret[m["secret"]]
    # one secret, one r_j; one secret_id per secret
    assert len({(m["secret"], m["r"], m["secret_id"]) for m in secrets.target_meta.values()}) == 20
    base_text = {r.id: r.text for r in base.targets}
    carriers = [m["carrier_id"] for m in secrets.target_meta.values()]
    assert len(set(carriers)) == len(carriers)  # one secret per record
    for t in secrets.targets:  # the carrier is the mini_pile record plus one inserted line
        m = secrets.target_meta[t.id]
        lines, orig = t.text.split("\n"), base_text[m["carrier_id"]].split("\n")
        assert len(lines) == len(orig) + 1
        extra = [i for i, ln in enumerate(lines) if m["secret"] in ln]
        assert len(extra) == 1 and lines[:extra[0]] + lines[extra[0] + 1:] == orig
        assert lines[extra[0]].strip() == m["template"].format(secret=m["secret"]).strip()
    for kind, pattern in (("api_key", r"sk-[A-Za-z0-9]{24}"), ("codename", r"[A-Z][a-z]+-\d{1,2}"),
                          ("word", r"[a-z]{7,14}")):
        for m in secrets.target_meta.values():
            if m["secret_kind"] == kind:
                assert re.fullmatch(pattern, m["secret"]), m["secret"]


def test_secrets_only_in_their_carriers(secrets):
    all_secrets = {m["secret"] for m in secrets.target_meta.values()}
    every = set(secrets.secret_spec)
    assert all_secrets < every  # background secrets besides the targets'
    blob = "\x00".join(secrets.pretrain).casefold()
    assert not [s for s in every if s.casefold() in blob]  # pretraining stays secret-free
    for part in ("heldout", "population", "adapt"):
        blob = "\x00".join(getattr(secrets, part)).casefold()
        for s in all_secrets:
            assert s.casefold() not in blob, (part, s)
    for t in secrets.targets:
        own = secrets.target_meta[t.id]["secret"]
        low = t.text.casefold()
        assert [s for s in every if s.casefold() in low] == [own]
        assert low.count(own.casefold()) == 1


def test_secrets_public_format_hides_secret_strings(secrets):
    pf = secrets.public_format
    assert pf["kind"] == "secrets" and pf["unit"] == "secret"
    blob = json.dumps(pf).casefold()
    for m in secrets.target_meta.values():
        assert m["secret"].casefold() not in blob
        spec = pf["secrets"][m["secret_id"]]
        assert (spec["p"], spec["r"], spec["n_records"], spec["secret_kind"]) == (m["p"], m["r"], m["n_records"],
                                                                                  m["secret_kind"])


def _carried(data: TaskData, text: str) -> list[str]:
    """The secrets of ``data.secret_spec`` occurring in ``text`` (plain substring search, not the module's runs)."""
    low = text.casefold()
    return [s for s in data.secret_spec if s.casefold() in low]


def test_defender_secrets(secrets):
    some = list(secrets.targets[:7])
    texts = [t.text for t in some] + list(secrets.adapt)
    spec = defender_secrets(secrets, texts)
    # the data owner knows every secret of its texts: the targets' and the background's (Ganesh et al. 2025, §3)
    want = Counter(s for t in texts for s in _carried(secrets, t))
    assert {s: v["n_records"] for s, v in spec.items()} == dict(want)
    assert len({secrets.target_meta[t.id]["secret"] for t in some}) < len(spec)
    for s, v in spec.items():
        truth = secrets.secret_spec[s]
        assert set(v) == {"secret_id", "p", "r", "n_records"}  # no partition, no kind: nothing marks a target
        assert (v["p"], v["r"], v["secret_id"]) == (truth["p"], truth["r"], truth["secret_id"])
    for m in secrets.target_meta.values():
        assert secrets.secret_spec[m["secret"]]["secret_id"] == m["secret_id"]
    assert defender_secrets(secrets, secrets.pretrain) == {}
    # a secret task built without a secret_spec: the target secrets of target_meta, as before
    bare = dataclasses.replace(secrets, secret_spec=None)
    assert set(defender_secrets(bare, texts)) == {secrets.target_meta[t.id]["secret"] for t in some}


def test_secret_helpers():
    rng = np.random.default_rng(0)
    for kind in ("word", "codename", "api_key"):
        for _ in range(50):
            s = make_secret(kind, rng)
            assert SECRET_RUN.fullmatch(s)
    with pytest.raises(ConfigError):
        make_secret("pin", rng)
    text = "def f():\n    return 1"
    out = insert_line(text, 'API_KEY = "k"', np.random.default_rng(1), code=True)
    assert len(out.split("\n")) == 3 and 'API_KEY = "k"' in out


def test_secrets_too_many(cache):
    with pytest.raises(DataError, match="n_secrets"):
        Secrets(**dict(SECRETS, n_secrets=5000)).build(cache)


def test_users_adapt_owners(users):
    """Every adaptation record names its (background) user: aligned, never a target user, min_docs each."""
    owners = users.adapt_owners
    assert owners is not None and len(owners) == len(users.adapt)
    target_users = {m["user"] for m in users.target_meta.values()}
    assert not set(owners) & target_users
    counts = Counter(owners)
    assert len(counts) == int(round(USERS.get("adapt_fraction", 0.2) * USERS["n_users"]))
    # background users lose the documents target users set aside for the attacker (at least one each)
    assert min(counts.values()) >= USERS["min_docs"] - max(1, round(USERS.get("attacker_fraction", 0.1) * USERS["max_docs"]))
    # a user's documents share its signature name: the owner groups the texts the way the users were built
    for u in list(counts)[:5]:
        docs = [t for t, o in zip(users.adapt, owners) if o == u]
        last_lines = {d.rsplit("\n\n", 1)[-1] for d in docs}
        assert len(last_lines) == 1, last_lines


def test_user_world_validates_on_users_outside_d(users):
    """Early stopping's validation in a user world: records of users with no record in D, so it names no user of D
    (held-aside documents of D's background users would mark every other user of D as a target). Under the task's
    own partitions (pool_draw: partition) the cut after the background splits a user, who is skipped; the pooled
    user draw gives V whole users of its own."""
    from bench.game import Challenger
    world = {"n_per_group": 4, "n_null": 8, "adapt_background": 10, "n_validation": 6}
    data = Challenger(users, dict(world, pool_draw="partition"), seed=0).adaptation_data()
    owner = dict(zip(users.adapt, users.adapt_owners))
    in_d = set(users.adapt_owners[:10])
    assert users.adapt_owners[10] in in_d  # the cut after the background splits a user's records
    assert len(data.validation) == 6 and not {owner[t] for t in data.validation} & in_d
    assert not set(data.validation) & set(data.texts)
    after = [t for t, u in zip(users.adapt[10:], users.adapt_owners[10:]) if u not in in_d]
    assert data.validation == tuple(after[:6])  # the pool's order after the background, that user skipped
    ch = Challenger(users, world, seed=0)
    assert ch.user_pooled
    data = ch.adaptation_data()
    owner.update((t.text, users.target_meta[t.id]["user"]) for t in users.targets)
    in_d = {owner[t] for t in data.texts}
    assert len(data.validation) == 6 and not {owner[t] for t in data.validation} & in_d
    assert not {owner[t] for t in data.validation} & {ch.unit_of(r) for r in ch._unit_of}  # and no target user


def test_builds_do_not_depend_on_the_hash_seed(tmp_path):
    """Two processes with different PYTHONHASHSEED build the same data (Faker's it_IT city list is a set)."""
    import subprocess
    import sys
    code = ("import sys, tempfile\nfrom bench.cache import ArtifactCache\nfrom bench.registry import TASKS\n"
            "c = ArtifactCache(tempfile.mkdtemp())\n"
            "for name, p in [('synthetic_users', {'n_users': 60}), "
            "('names2ids', {'n_people': 200, 'max_chars_per_source': 300000})]:\n"
            "    print(name, TASKS.create(name, p).build(c).fingerprint)\n")
    outs = []
    for seed in ("1", "2"):
        env = {**__import__("os").environ, "PYTHONHASHSEED": seed}
        proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=600)
        assert proc.returncode == 0, proc.stderr[-2000:]
        outs.append(proc.stdout)
    assert outs[0] == outs[1] and outs[0].count("\n") == 2


# ------------------------------------------------------------------------------ background secrets (Hush fairness)
# Every adaptation, population and held-out record carries a secret drawn like the targets' (Ganesh et al. 2025:
# every training example carries secrets), so the secrets a defense is told about do not mark its targets.

WORLD_BUDGET = 800_000  # mini_pile: 159 adaptation records, 472 target-pool records
WORLD_SECRETS = dict(max_chars_per_source=WORLD_BUDGET, n_secrets=100, records_per_secret_min=2,
                     records_per_secret_max=5, secret_kind="mixed")
# 40 b=1 target secrets (about 140 records) next to 150 background records (about 43 secrets)
SECRET_WORLD = {"n_per_group": 20, "n_null": 8, "adapt_background": 150, "n_validation": 9}
#: |z| beyond which a difference in rates is not chance: two-sided 0.1%, so the eight rules of
#: test_smarter_dishonest_rules_hit_targets_and_background_alike together have a false alarm rate below 1%
Z_TOLERANCE = 3.29


@pytest.fixture(scope="module")
def secret_world(cache):
    data = Secrets(**WORLD_SECRETS).build(cache)
    ch = Challenger(data, SECRET_WORLD, seed=0)
    ad = ch.adaptation_data()
    targets = set(ch.members("b"))  # the b=1 carriers (challenger-side truth)
    is_target = [t in targets for t in ad.texts]
    return data, ch, ad, is_target


def test_background_secrets_are_drawn_like_the_targets(secrets, base):
    spec = secrets.secret_spec
    target_ids = {m["secret_id"] for m in secrets.target_meta.values()}
    assert {v["secret_id"] for v in spec.values() if v["partition"] == "targets"} == target_ids
    assert len({v["secret_id"] for v in spec.values()}) == len(spec)  # one id per secret
    for part in ("adapt", "population", "heldout"):
        texts, orig = getattr(secrets, part), getattr(base, part)
        owners = []
        for t, o in zip(texts, orig):  # a base record plus one inserted line holding exactly one secret, once
            found = _carried(secrets, t)
            assert len(found) == 1 and t.casefold().count(found[0].casefold()) == 1
            lines = t.split("\n")
            extra = [i for i, ln in enumerate(lines) if found[0] in ln]
            assert len(extra) == 1 and lines[:extra[0]] + lines[extra[0] + 1:] == o.split("\n")
            owners.append(found[0])
        mine = {s: v for s, v in spec.items() if v["partition"] == part}
        assert set(owners) == set(mine) and not target_ids & {v["secret_id"] for v in mine.values()}
        # contiguous blocks of the drawn sizes; only the partition's last secret may be cut short
        blocks = [owners[0]]
        for a, b in zip(owners, owners[1:]):
            if b != a:
                blocks.append(b)
        assert len(blocks) == len(mine)
        counts = Counter(owners)
        assert all(counts[s] == mine[s]["n_records"] for s in mine)
        assert all(2 <= counts[s] <= 5 for s in blocks[:-1]) and 1 <= counts[blocks[-1]] <= 5
        assert len(set(counts.values())) > 1
        # same kinds (in turn for mixed), same p, r_j in the same range, same templates as the targets
        assert [mine[s]["kind"] for s in blocks] == [("word", "codename", "api_key")[j % 3] for j in range(len(blocks))]
        assert all(v["p"] == 1e-10 and 2e-4 <= v["r"] <= 1e-3 for v in mine.values())
        assert len({v["r"] for v in mine.values()}) == len(mine)
        pf = secrets.public_format["templates"]
        allowed = {t for side in pf.values() for ts in side.values() for t in ts}
        assert {m["template"] for m in secrets.target_meta.values()} <= allowed
        for t, s in zip(texts, owners):
            line = next(ln for ln in t.split("\n") if s in ln).strip()
            assert line in {a.format(secret=s) for a in allowed}
    # the attacker's public spec lists the target secrets only, by id; no secret string anywhere in it
    assert set(secrets.public_format["secrets"]) == target_ids
    blob = json.dumps(secrets.public_format).casefold()
    assert not [s for s in spec if s.casefold() in blob]


def test_every_record_of_d_carries_a_secret(secret_world):
    data, ch, ad, is_target = secret_world
    n_bg = SECRET_WORLD["adapt_background"]
    assert len(ad.texts) == n_bg + sum(is_target) and sum(is_target) > 100
    assert all(len(ids) == 1 for ids in ad.secrets)  # every record, target or background, carries exactly one
    by_id = {v["secret_id"]: (s, v) for s, v in data.secret_spec.items()}
    present = Counter(ids[0] for ids in ad.secrets)
    assert set(ad.secret_targets) == set(present)
    for sid, (p, r) in ad.secret_targets.items():
        s, v = by_id[sid]
        assert (p, r) == (v["p"], v["r"])
    # a b=1 target secret has all its carriers in D, and so has every background secret but the one cut by the
    # background/validation boundary: counts in D look alike
    parts = Counter(by_id[sid][1]["partition"] for sid in present)
    assert set(parts) == {"targets", "adapt"} and parts["targets"] == 2 * SECRET_WORLD["n_per_group"]
    short = [sid for sid, k in present.items() if k != by_id[sid][1]["n_records"]]
    assert len(short) <= 1 and all(by_id[sid][1]["partition"] == "adapt" for sid in short)
    # the runner hands a shadow of a secret-aware recipe the attacker's own (population) secrets the same way
    per_text, targets = secrets_of(data, data.population[:60])
    assert all(len(ids) == 1 for ids in per_text)
    assert {by_id[i][1]["partition"] for ids in per_text for i in ids} == {"population"}
    assert set(targets) == {i for ids in per_text for i in ids}


def test_dropping_secret_bearing_records_drops_all_of_d(secret_world):
    """The dishonest rule "drop every record that carries a secret" hits target and background records alike.

    Before every record carried a secret this rule removed exactly the b=1 targets and kept all the background:
    a perfect membership-game defense at no utility cost.
    """
    _, _, ad, is_target = secret_world
    dropped = [bool(ids) for ids in ad.secrets]
    kept = [t for t, d in zip(ad.texts, dropped) if not d]
    assert kept == []  # nothing left to train on: the rule costs all the utility
    tgt = [d for d, t in zip(dropped, is_target) if t]
    bg = [d for d, t in zip(dropped, is_target) if not t]
    assert bg and tgt and np.mean(bg) == np.mean(tgt) == 1.0


def _clustered_rate(dropped: list[bool], clusters: list[str]) -> tuple[float, float]:
    """Drop rate over records and its variance, robust to clustering (records of one secret fall together).

    The ratio-estimator variance C/(C-1) · Σ_c (d_c − p·m_c)² / N² over clusters c (m_c records, d_c dropped):
    a rule that acts per secret drops whole secrets, so the effective sample is the number of secrets, not of
    records; a record without a secret is its own cluster.
    """
    n = len(dropped)
    p = sum(dropped) / n
    m: Counter = Counter(clusters)
    d: Counter = Counter(c for c, x in zip(clusters, dropped) if x)
    k = len(m)
    if k < 2:
        return p, 0.0
    return p, k / (k - 1) * sum((d[c] - p * m[c]) ** 2 for c in m) / n ** 2


def _two_proportion_z(dropped: list[bool], clusters: list[str], is_target: list[bool]) -> tuple[float, float, float]:
    """(target drop rate, background drop rate, z of their difference with clustered variances)."""
    groups = []
    for flag in (True, False):
        idx = [i for i, t in enumerate(is_target) if t == flag]
        groups.append(_clustered_rate([dropped[i] for i in idx], [clusters[i] for i in idx]))
    (p1, v1), (p2, v2) = groups
    se = (v1 + v2) ** 0.5
    z = (p1 - p2) / se if se > 0 else (0.0 if p1 == p2 else float("inf"))
    return p1, p2, z


def test_smarter_dishonest_rules_hit_targets_and_background_alike(secret_world):
    """Rules that use only what the defense gets (carriers per secret in D, r_j, the secret's kind as its format
    shows in the text) drop b=1 target records and background records at rates that do not differ beyond chance.

    Before background secrets existed every one of these rules dropped only targets (background records carried
    no secret), a difference far beyond Z_TOLERANCE.
    """
    data, _, ad, is_target = secret_world
    clusters = [ids[0] if ids else f"record:{i}" for i, ids in enumerate(ad.secrets)]
    n_in_d = Counter(c for c, ids in zip(clusters, ad.secrets) if ids)
    r = {sid: r for sid, (_, r) in ad.secret_targets.items()}
    r_sorted = sorted(r.values())
    # the kind is visible to a defense from the secret's format in its text (sk-…, Capitalised-42, a word); the
    # challenger's secret_spec stands in for that reading
    kind = {v["secret_id"]: v["kind"] for v in (data.secret_spec or {}).values()}
    kind.update({m["secret_id"]: m["secret_kind"] for m in data.target_meta.values()})
    rules = {f"carriers >= {k}": (lambda c, k=k: n_in_d[c] >= k) for k in (3, 4, 5)}
    rules["r below its median"] = lambda c: r[c] <= r_sorted[len(r_sorted) // 2]
    rules["r in its top fifth"] = lambda c: r[c] >= r_sorted[int(0.8 * len(r_sorted))]
    rules.update({f"kind {k}": (lambda c, k=k: kind[c] == k) for k in ("word", "codename", "api_key")})
    for name, rule in rules.items():
        dropped = [bool(ids) and rule(c) for c, ids in zip(clusters, ad.secrets)]
        assert 0 < sum(dropped) < len(dropped), name  # a real rule: it keeps some records and drops some
        p_target, p_background, z = _two_proportion_z(dropped, clusters, is_target)
        assert abs(z) <= Z_TOLERANCE, (name, p_target, p_background, z)
