"""Unit-level membership (users, Kandpal et al. 2024; secrets, Ganesh et al. 2025) in the game, and the
user-inference attack.

Checked by definition: whole units go to one group, world sizes count units, labels are per unit, the
attacker sees only what it may know of a unit (a user's held-aside samples; a secret's carriers), the
defender's facts (owners, secrets) are there and mark no target, record-level worlds are unchanged, and
the scores follow their formulas (test-side float64 reimplementations).
"""

from __future__ import annotations

import json
from collections import Counter

import numpy as np
import pytest

from attacks.loss import LossAttack
from attacks.user_inference import UserInferenceAttack
from bench.attack import Attack, run_attack
from bench.errors import CapabilityError
from bench.game import DEFAULT_GAMES, GAMES, Challenger
from bench.hashing import content_hash
from bench.lm import TOKEN_LOGPROBS
from bench.metrics import MetricRow
from bench.units import canary_unit_metrics
from fakes import UnigramLM, make_task_data
from tasks.secrets import SECRET_RUN, Secrets
from tasks.users import SyntheticUsers, group_targets_by_unit

BUDGET = 300_000
# attacker_fraction 0.4: most users show two or more samples, so means over samples are exercised
USERS = dict(max_chars_per_source=BUDGET, n_users=40, docs_median=4.0, docs_sigma=0.6, min_docs=3, max_docs=12,
             canary_users=3, canary_length=8, attacker_fraction=0.4)
SECRETS = dict(max_chars_per_source=BUDGET, n_secrets=30, records_per_secret_min=2, records_per_secret_max=5,
               secret_kind="mixed")
WORLD = {"n_per_group": 4, "n_null": 8, "adapt_background": 10}
SIZES = {(0, 0): 4, (0, 1): 4, (1, 0): 4, (1, 1): 4}   # and a null pool of 8 units of its own
# positives / negatives per game, written out from the table of bench/game.py's docstring
TABLE = {"pretrain": ({(1, 0), (1, 1)}, {(0, 0), (0, 1)}), "adapt": ({(0, 1), (1, 1)}, {(0, 0), (1, 0)}),
         "joint/fresh": ({(0, 1)}, {(0, 0)}), "joint/seen": ({(1, 1)}, {(1, 0)}),
         "joint/both": ({(1, 1)}, {(0, 0)}), "post_adapt": ({(1, 0)}, {(0, 0)})}


@pytest.fixture(scope="module")
def users(cache):
    return SyntheticUsers(**USERS).build(cache)


@pytest.fixture(scope="module")
def secrets(cache):
    return Secrets(**SECRETS).build(cache)


@pytest.fixture(scope="module", params=["users", "secrets"])
def unit_data(request, users, secrets):
    return users if request.param == "users" else secrets


def _models(data, ch):
    pre = UnigramLM(list(data.pretrain[:300]) + ch.pretraining_inserts(), name="theta")
    ad = UnigramLM(list(data.pretrain[:300]) + list(ch.adaptation_data().texts), name="theta'")
    return pre, ad, UnigramLM(data.population[:300], name="ref")


# ------------------------------------------------------------------------------------ worlds by definition

def test_unit_world_by_definition(unit_data):
    ch = Challenger(unit_data, WORLD, seed=0)
    unit_data = ch._data  # a user world draws its units from both partitions' users (bench.pools.split_user_pool)
    units = group_targets_by_unit(unit_data)
    ids = {unit_data.targets[i].id: u for u, idx in units.items() for i in idx}
    drawn = {u for u in units if unit_data.targets[units[u][0]].id in ch._group}
    # every record of a drawn unit is in the world, with the unit's group; no other record is
    assert set(ch._group) == {unit_data.targets[i].id for u in drawn for i in units[u]}
    for u in drawn:
        assert len({ch.group_of(unit_data.targets[i].id) for i in units[u]}) == 1
        assert all(ch.unit_of(unit_data.targets[i].id) == u for i in units[u])
    # world sizes count units
    assert Counter(ch.unit_group(u) for u in drawn) == Counter(SIZES)
    null_units = set(ch.null_units())
    assert len(null_units) == WORLD["n_null"] and not null_units & drawn
    assert len(ch.target_texts()) == sum(len(units[u]) for u in drawn | null_units) > len(drawn)
    for name, (pos, neg) in TABLE.items():
        inst = ch.instance(GAMES[name])
        assert len(set(inst.record_ids)) == len(inst.targets) == len(inst.labels)
        assert set(inst.record_ids) <= drawn
        for u, y in zip(inst.record_ids, inst.labels):
            assert ch.unit_group(u) in (pos if y == 1 else neg), (name, u)
        assert inst.n_pos == sum(SIZES[g] for g in pos) and inst.n_neg == sum(SIZES[g] for g in neg)
    null = ch.instance(GAMES["null"])
    assert inst.n_pos + inst.n_neg and null.n_pos == null.n_neg == 4
    assert set(null.record_ids) == null_units
    assert set(ids) >= set(ch._group)


def test_unit_world_seeds_and_too_few_units(users):
    a, b = Challenger(users, WORLD, seed=0), Challenger(users, WORLD, seed=1)
    assert a._group == Challenger(users, WORLD, seed=0)._group and a._group != b._group
    n_units = len(group_targets_by_unit(users))
    with pytest.raises(Exception, match="target users"):
        Challenger(users, {"n_per_group": n_units, "n_null": 8}, seed=0)


def test_pretraining_and_adaptation_take_whole_units(unit_data):
    ch = Challenger(unit_data, dict(WORLD, pretrain_target_repeats=2), seed=0)
    unit_data = ch._data  # the world's pools: in a user world, whole users of both partitions
    text = {r.id: r.text for r in unit_data.targets}
    a1 = [text[r] for r in ch._group if ch.group_of(r)[0] == 1]
    b1 = [text[r] for r in ch._group if ch.group_of(r)[1] == 1]
    assert Counter(ch.pretraining_inserts()) == Counter({t: 2 for t in a1})
    ad = ch.adaptation_data()
    assert Counter(ad.texts) == Counter(list(unit_data.adapt[:ch.n_background]) + b1)
    assert ch.n_background >= 10 and (ch.n_background == 10 or unit_data.unit == "user")


# ------------------------------------------------------------------------------------ what the attacker sees

def _everything_trained(ch) -> set[str]:
    return set(ch.target_texts()) | set(ch.adaptation_data().texts) | set(ch.pretraining_inserts())


def test_user_targets_show_only_held_aside_samples(users):
    ch = Challenger(users, WORLD, seed=0)
    samples = users.public_format["user_samples"]
    trained = _everything_trained(ch)
    pre, ad, ref = _models(users, ch)
    for name in ("adapt", "joint/both", "null"):
        inst = ch.instance(GAMES[name])
        view = ch.view(inst, requires=UserInferenceAttack.requires, pretrained=pre, adapted=ad, reference=ref,
                       population=None)
        assert view.unit == "user"
        for t, u in zip(view.targets, inst.record_ids):
            assert t.samples == tuple(samples[u]) and t.text == t.samples[0]
            assert not set(t.samples) & trained  # never a training record
            assert u not in t.id
        # no user id anywhere in what the attack receives (the samples map keyed by user id stays behind)
        dump = json.dumps(view.public_format) + repr(view.targets)
        assert "user_samples" not in view.public_format
        assert not [u for u in samples if u in dump]
    assert ch.sample_texts() and set(ch.sample_texts()) <= {s for v in samples.values() for s in v}


def test_secret_targets_show_their_carriers_and_no_other_secret(secrets):
    ch = Challenger(secrets, WORLD, seed=0)
    carriers: dict[str, set[str]] = {}
    for r in secrets.targets:
        carriers.setdefault(secrets.target_meta[r.id]["secret_id"], set()).add(r.text)
    secret_of = {m["secret_id"]: m["secret"] for m in secrets.target_meta.values()}
    pre, ad, ref = _models(secrets, ch)
    inst = ch.instance(GAMES["adapt"])
    view = ch.view(inst, requires=LossAttack.requires, pretrained=pre, adapted=ad, reference=ref, population=None)
    assert view.unit == "secret"
    all_secrets = {s.casefold() for s in secret_of.values()}
    for t, sid in zip(view.targets, inst.record_ids):
        assert set(t.samples) == carriers[sid] and len(t.samples) == len(carriers[sid])
        shown = {r for s in t.samples for r in SECRET_RUN.findall(s.casefold())} & all_secrets
        assert shown == {secret_of[sid].casefold()}  # its own secret (in its carriers), no other
        assert sid not in t.id
    # the public spec names secrets by id with (p, r, n_records), never their strings
    dump = json.dumps(view.public_format).casefold()
    assert not [s for s in all_secrets if s in dump]


def test_user_samples_capability_needs_a_unit_task():
    data = make_task_data(n_targets=200, n_adapt=50)
    ch = Challenger(data, WORLD, seed=0)
    m = UnigramLM(data.pretrain)
    with pytest.raises(CapabilityError, match="record-level"):
        ch.view(ch.instance(GAMES["adapt"]), requires=UserInferenceAttack.requires, pretrained=m, adapted=m,
                reference=m, population=None)


# ------------------------------------------------------------------------------------ what the defender gets

def test_adaptation_data_owners(users):
    ch = Challenger(users, WORLD, seed=0)
    ad = ch.adaptation_data()
    assert ad.users is not None and len(ad.users) == len(ad.texts) and ad.secrets is None
    owner_of_text = {r.text: users.target_meta[r.id]["user"] for r in users.targets}
    owner_of_text.update(zip(users.adapt, users.adapt_owners))
    truth = [owner_of_text[t] for t in ad.texts]
    # same true owner <=> same pseudonym, over background and target texts alike
    pairs = set(zip(truth, ad.users))
    assert len(pairs) == len(set(truth)) == len(set(ad.users))
    # pseudonyms: one format for every owner, none is a user id the attacker could look up
    raw = set(users.target_meta[r.id]["user"] for r in users.targets) | set(users.adapt_owners)
    assert not set(ad.users) & raw
    assert {len(u) for u in ad.users} == {12}
    # the background really has several owners with several texts each (owners come from the task)
    bg = Counter(users.adapt_owners[:10])
    assert max(bg.values()) > 1
    # a record-level world gives no owners (and its adapted-model keys stay as they were)
    rec = Challenger(make_task_data(n_targets=200, n_adapt=50), WORLD, seed=0).adaptation_data()
    assert rec.users is None and rec.secrets is None and rec.secret_targets is None


def test_adaptation_data_secrets(secrets):
    ch = Challenger(secrets, WORLD, seed=0)
    ad = ch.adaptation_data()
    assert ad.users is None and ad.secrets is not None and len(ad.secrets) == len(ad.texts)
    # every text of D carries exactly one secret, background records too (Ganesh et al. 2025: every example)
    spec = secrets.secret_spec
    by_id = {v["secret_id"]: v for v in spec.values()}
    for t, ids in zip(ad.texts, ad.secrets):
        assert ids == tuple(v["secret_id"] for s, v in spec.items() if s.casefold() in t.casefold()) and len(ids) == 1
    b1 = {secrets.target_meta[r.id]["secret_id"] for r in secrets.targets if r.text in set(ad.texts)}
    assert len(b1) == 8 and b1 <= set(ad.secret_targets)
    assert {by_id[i]["partition"] for i in set(ad.secret_targets) - b1} == {"adapt"}
    for sid, (p, r) in ad.secret_targets.items():
        assert (p, r) == (by_id[sid]["p"], by_id[sid]["r"])
    # ids only: no secret string outside the texts themselves
    blob = json.dumps([list(ad.secrets), sorted(ad.secret_targets.items())]).casefold()
    assert not [m["secret"] for m in secrets.target_meta.values() if m["secret"].casefold() in blob]


# ------------------------------------------------------------------------------------ record worlds unchanged

def _world_digest(ch) -> str:
    inst = {g: (list(ch.instance(GAMES[g]).record_ids), [t.id for t in ch.instance(GAMES[g]).targets],
                ch.instance(GAMES[g]).labels.tolist()) for g in DEFAULT_GAMES}  # the games pinned (no audit pool)
    ad = ch.adaptation_data()
    return content_hash(ch.world_key, sorted((r, list(g)) for r, g in ch._group.items()), inst, list(ad.texts),
                        ch.pretraining_inserts(), ad.key_parts())


def test_record_level_worlds_are_unchanged():
    """Digests of record-level worlds (pinned when the challenger began drawing units, re-pinned when the world
    gained ``n_validation``, which enters the world key and the adaptation data, and when game version 2 gave the
    four groups equal sizes and the null game its own pool): identical draws, ids, keys."""
    data = make_task_data(n_targets=400, n_adapt=200)
    world = {"n_per_group": 20, "n_null": 40, "adapt_background": 10}
    for seed, key, digest in ((0, "6ad3577af0ee927f", "2c81d090f6c50631"), (3, "ddaebb7a09c90356", "66b6375196da11b4")):
        ch = Challenger(data, world, seed=seed)
        assert ch.world_key == key and _world_digest(ch) == digest
        assert ch.sample_texts() == [] and all(t.samples == () for t in ch.instance(GAMES["adapt"]).targets)
    import dataclasses
    known = dataclasses.replace(data, target_meta={r.id: {"a": i % 2} for i, r in enumerate(data.targets)})
    ch = Challenger(known, world, seed=1)
    inst = {g: ([t.id for t in ch.instance(GAMES[g]).targets], ch.instance(GAMES[g]).labels.tolist())
            for g in DEFAULT_GAMES}
    # re-pinned when a known split took the pooled draw (privbench 0.5.1, tests/test_known_split_draw.py)
    assert content_hash(ch.world_key, sorted((r, list(g)) for r, g in ch._group.items()), inst,
                        list(ch.adaptation_data().texts)) == "4da256330432e605"
    # `pool_draw: partition` keeps the task's own draw: the groups and D̃ of the world pinned before 0.5.1, under a
    # key of its own (which orders the games' instances)
    own = Challenger(known, dict(world, pool_draw="partition"), seed=1)
    assert content_hash(sorted((r, list(g)) for r, g in own._group.items()),
                        list(own.adaptation_data().texts)) == "3ec3d781976054c9"


# ------------------------------------------------------------------------------------ scores

def _unigram_seq_logp(lm: UnigramLM, text: str) -> float:
    """log p(x) = sum, in float64, of the per-byte log-probabilities the model reports (float32 values, as its
    token signals carry them; summing the float64 table instead differs by ~1e-5 on long samples)."""
    b = np.frombuffer(text.encode("utf-8"), dtype=np.uint8)
    return float(np.sum(lm.logp.astype(np.float32).astype(np.float64)[b]))


@pytest.mark.parametrize("game", ["adapt", "joint/fresh"])
def test_user_inference_formula(users, game):
    ch = Challenger(users, WORLD, seed=0)
    pre, ad, ref = _models(users, ch)
    inst = ch.instance(GAMES[game])
    view = ch.view(inst, requires=UserInferenceAttack.requires, pretrained=pre, adapted=ad, reference=ref,
                   population=None)
    got = run_attack(UserInferenceAttack(), view)
    calib = pre if GAMES[game].releases_base else ref  # θ where released, else the attacker's reference
    want = [np.mean([_unigram_seq_logp(ad, s) - _unigram_seq_logp(calib, s) for s in t.samples])
            for t in view.targets]
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-5 * max(1.0, float(np.max(np.abs(want)))))
    # per-token variant: each sample's ratio divided by its token (byte) count
    tok = run_attack(UserInferenceAttack(normalize="token"), view)
    want_tok = [np.mean([(_unigram_seq_logp(ad, s) - _unigram_seq_logp(calib, s)) / len(s.encode("utf-8"))
                         for s in t.samples]) for t in view.targets]
    np.testing.assert_allclose(tok, want_tok, rtol=0, atol=1e-5)
    # users with several samples exist, so the mean is really over samples
    assert max(len(t.samples) for t in view.targets) > 1


def test_record_attack_scores_a_unit_by_its_mean_sample_score(unit_data):
    ch = Challenger(unit_data, WORLD, seed=0)
    pre, ad, ref = _models(unit_data, ch)
    inst = ch.instance(GAMES["adapt"])
    view = ch.view(inst, requires=LossAttack.requires, pretrained=pre, adapted=ad, reference=ref, population=None)
    got = run_attack(LossAttack(), view)
    want = [np.mean([_unigram_seq_logp(ad, s) / len(s.encode("utf-8")) for s in t.samples]) for t in view.targets]
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-5)
    assert len(got) == len(inst.targets) and any(len(t.samples) > 1 for t in view.targets)


def test_attack_that_scores_units_receives_the_unit_view(users):
    seen = {}

    class CountSamples(Attack):
        version = "0.0"
        name = "count_samples"
        requires = frozenset({TOKEN_LOGPROBS})
        scores_units = True

        def score(self, view):
            seen["n"] = len(view.targets)
            return [float(len(t.samples)) for t in view.targets]

    ch = Challenger(users, WORLD, seed=0)
    pre, ad, ref = _models(users, ch)
    inst = ch.instance(GAMES["adapt"])
    view = ch.view(inst, requires=CountSamples.requires, pretrained=pre, adapted=ad, reference=ref, population=None)
    assert run_attack(CountSamples(), view).tolist() == [float(len(t.samples)) for t in view.targets]
    assert seen["n"] == len(inst.targets)


def test_non_membership_attack_is_refused_on_unit_games(users):
    class Extract(Attack):
        version = "0.0"
        name = "extract_like"
        family = "extraction"

        def score(self, view):
            return np.zeros(len(view.targets))

    ch = Challenger(users, WORLD, seed=0)
    pre, ad, ref = _models(users, ch)
    view = ch.view(ch.instance(GAMES["adapt"]), requires=Extract.requires, pretrained=pre, adapted=ad, reference=ref,
                   population=None)
    with pytest.raises(CapabilityError, match="record-level task"):
        run_attack(Extract(), view)


# ------------------------------------------------------------------------------------ canary metrics

def _pairwise_auc(pos: np.ndarray, neg: np.ndarray) -> float:
    return float(np.mean([(p > n) + 0.5 * (p == n) for p in pos for n in neg]))


def test_canary_unit_metrics_against_pairwise_auc():
    rng = np.random.default_rng(0)
    y = rng.integers(0, 2, size=60)
    c = rng.random(60) < 0.3
    s = rng.normal(size=60) + 1.5 * y * c
    s[:5] = 0.25  # ties
    rows = {r.metric: r for r in canary_unit_metrics(y, s, c.tolist())}
    for name, mask in (("auc_canary_units", c), ("auc_ordinary_units", ~c)):
        want = _pairwise_auc(s[mask & (y == 1)], s[mask & (y == 0)])
        assert isinstance(rows[name], MetricRow) and abs(rows[name].value - want) < 1e-12
        assert (rows[name].n_pos, rows[name].n_neg) == (int((mask & (y == 1)).sum()), int((mask & (y == 0)).sum()))
        assert rows[name].flag == ("underpowered" if min(rows[name].n_pos, rows[name].n_neg) < 20 else None)
    assert rows["auc_canary_units"].flag == "underpowered"      # about 9 vs 9 canary units: too few to read
    assert canary_unit_metrics(y, s, [False] * 60) == []
    only_pos = canary_unit_metrics(np.array([1, 1, 0, 0]), np.arange(4.0), [True, True, False, False])
    assert only_pos == []  # neither subset has both classes


def test_canary_users_are_known_to_the_challenger(users):
    ch = Challenger(users, WORLD, seed=0)
    canary = {m["user"] for m in users.target_meta.values() if m.get("canary")}
    assert {u for u in ch.units() if ch.is_canary_unit(u)} == canary & set(ch.units())


# ------------------------------------------------------------------------------------ a real run

RUN_USERS = dict(max_chars_per_source=900_000, n_users=160, docs_median=4.0, docs_sigma=0.5, min_docs=3, max_docs=10,
                 attacker_fraction=0.3, canary_users=8, canary_length=10)
USER_SUITE = {
    "name": "tiny-users",
    "seeds": [0],
    "tasks": [{"name": "synthetic_users", "params": RUN_USERS}],
    "models": [{"name": "nano", "params": {"pretrain_tokens": 20000, "reference_tokens": 10000}}],
    "defenses": [{"name": "finetune", "params": {"epochs": 6, "chunk_length": 160}}],
    "attacks": ["loss", "user_inference"],
    "games": ["adapt", "null"],
    "world": {"n_per_group": 12, "n_null": 40, "adapt_background": 40},
    "reference": True,
    "metrics": {"n_boot": 50},
    "utility": {"n_heldout": 20},
}


@pytest.mark.slow
def test_runner_user_world(cache, tmp_path):
    """A user world end to end: whole users fine-tuned on, user inference on held-aside samples finds them
    (Kandpal et al. 2024), the null game stays at chance, canary users are reported, scores are stored per user."""
    from bench.runner import Runner
    from bench.store import Store
    from bench.suite import parse_suite

    store = Store(str(tmp_path / "u.db"))
    result = Runner(parse_suite(USER_SUITE), store, cache, quiet=True).run()
    assert result.status == "complete" and result.new_evaluations == 4
    rows = {(r["game"], r["attack"], r["metric"]): r for r in store.metric_rows(result.run_id)}
    auc = {(g, a): rows[(g, a, "auc")]["value"] for g in ("adapt", "null") for a in ("loss", "user_inference")}
    print("user world AUC:", {f"{g}/{a}": round(v, 3) for (g, a), v in auc.items()},
          {m: round(r["value"], 3) for (g, a, m), r in rows.items() if g == "adapt" and m.endswith("_units")})
    assert rows[("adapt", "user_inference", "auc")]["n_pos"] == 24  # counted in users
    assert rows[("adapt", "user_inference", "auc")]["n_neg"] == 24  # (·,0): two groups of 12 users, as (·,1)
    assert auc[("adapt", "user_inference")] > 0.6, auc
    assert abs((auc[("null", "loss")] + auc[("null", "user_inference")]) / 2 - 0.5) <= 0.1, auc
    assert ("adapt", "user_inference", "auc_ordinary_units") in rows, sorted(rows)


@pytest.mark.slow
def test_runner_user_level_dp_claims_epsilon_per_user(cache, tmp_path):
    """dp_adapt with ``unit: user`` through the runner: the stored guarantee bounds one user (n counts the users in
    D, δ = 1/(2n)), beside the record-level run of the same recipe, and the board shows the unit."""
    from bench.runner import Runner
    from bench.store import Store
    from bench.suite import parse_suite
    from boards import board_of

    dp = {"method": "head", "epsilon": 8.0, "epochs": 2, "chunk_length": 160, "batch_size": 8}
    suite = dict(USER_SUITE, name="tiny-users-dp", attacks=["user_inference"],
                 defenses=[{"name": "dp_adapt", "label": "dp-user", "params": dict(dp, unit="user")},
                           {"name": "dp_adapt", "label": "dp-record", "params": dp}])
    store = Store(str(tmp_path / "u.db"))
    result = Runner(parse_suite(suite), store, cache, quiet=True).run()
    assert result.status == "complete"
    g = {r["defense"]: r for r in store.guarantee_rows(result.run_id)}
    user, record = g["dp-user"]["details"], g["dp-record"]["details"]
    assert user["unit"] == "user" and record["unit"] == "record"
    assert user["n_records"] == record["n_records"] and user["n_units"] < user["n_records"]
    assert user["delta"] == pytest.approx(1 / (2 * user["n_units"]))
    assert record["group_by"] == "user" and record["group_k"] == user["unit_records_max"] > 1
    board = board_of(tmp_path / "u.db")
    text = {r["defense"]: r["guarantee"] for r in next(iter(board.groups.values())).ranking.to_dict("records")}
    assert text["dp-user"].endswith("per user") and "per" not in text["dp-record"]
