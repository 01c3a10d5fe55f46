"""A fair game: every label channel and confound a dishonest plugin could use, each shown closed.

Each test is written against the plugin that would exploit the channel (or the confound it would hide behind)
and fails on a game that leaks it: the adapt game confounded with pretraining membership, pretraining hooks that
are handed the inserts, attack state carried across games, owner counts that mark target users, a draw that a
plugin can recompute from the public seed, labels a submission child could forge.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from bench.attack import Attack, run_attack
from bench.errors import PluginError
from bench.game import GAMES, AttackerView, Challenger, Target
from bench.lm import FINETUNE_REFERENCE, TOKEN_LOGPROBS, RestrictedModel
from bench.metrics import MetricRow, exposure_metrics, flag_underpowered_null, roc_auc
from fakes import NgramLM, UnigramLM, make_task_data


def _auc(ch: Challenger, game: str, attack: Attack, theta, theta_p) -> float:
    inst = ch.instance(GAMES[game])
    view = ch.view(inst, requires=attack.requires, pretrained=theta, adapted=theta_p, reference=None,
                   population=None)
    return roc_auc(inst.labels, run_attack(attack, view))


# ------------------------------------------------------------------------------ a ⊥ b: the adapt game's confound

def test_adapt_game_is_chance_when_theta_prime_is_theta_and_pretraining_memorises():
    """θ′ = θ (a release that does not adapt) after strong pretraining memorisation: the adapt game asks about b
    only, so it must sit at chance. With unequal groups its negatives held fewer a = 1 units than its positives,
    and the pretraining signal passed for adaptation leakage."""
    from attacks.min_k import MinKAttack as MinK
    data = make_task_data(n_targets=1400, n_adapt=100, n_pretrain=50, seed=3)
    ch = Challenger(data, {"n_per_group": 250, "n_null": 400, "adapt_background": 20,
                           "pretrain_target_repeats": 10}, seed=0)
    theta = NgramLM(list(data.pretrain) + ch.pretraining_inserts(), name="θ")
    pretrain_auc = _auc(ch, "pretrain", MinK(), theta, theta)
    assert pretrain_auc >= 0.8, pretrain_auc          # pretraining membership is strongly visible in θ ...
    adapt_auc = _auc(ch, "adapt", MinK(), theta, theta)
    assert abs(adapt_auc - 0.5) <= 0.05, adapt_auc    # ... yet the adapt game of θ′ = θ is at chance
    inst = ch.instance(GAMES["adapt"])
    a_bits = [ch.unit_group(u)[0] for u in inst.record_ids]
    pos = [a for a, y in zip(a_bits, inst.labels) if y == 1]
    neg = [a for a, y in zip(a_bits, inst.labels) if y == 0]
    assert np.mean(pos) == np.mean(neg) == 0.5        # a is independent of b by construction


def _in_s_aucs(data, world, seeds, theta_of=None):
    """Per world: AUC of "θ knows it" for "this record of D̃ is an inserted target" against D's background, with the
    S oracle (the strongest such rule) and, given ``theta_of``, with θ's loss as tests/plugins/theta_dedup_defense.py
    reads it."""
    oracle, by_theta = [], []
    for seed in seeds:
        ch = Challenger(data, world, seed=seed, secret=f"s{seed}")
        d_tilde = ch.adaptation_data().texts
        inserted = set(ch.members("b"))
        labels = np.array([t in inserted for t in d_tilde], dtype=int)
        in_s = set(ch.pretraining_inserts())
        oracle.append(roc_auc(labels, np.array([float(t in in_s) for t in d_tilde])))
        if theta_of is not None:
            theta = theta_of(ch)
            loss = np.array([-s.logprobs.mean() for s in theta.token_signals(d_tilde)])
            by_theta.append(roc_auc(labels, -loss))
    return np.array(oracle), np.array(by_theta)


def test_theta_memory_of_s_marks_targets_unless_the_background_shares_s():
    """D's background is never in S, while the (1,1) targets are: a defense that drops what θ knows best drops
    targets ahead of background (tests/plugins/theta_dedup_defense.py). With ``background_in_pretraining: matched``
    as large a share of the background is in S as of the inserted targets, and the rule finds nothing."""
    import sys
    sys.path.insert(0, str(Path(__file__).parent / "plugins"))
    from theta_dedup_defense import drop_what_theta_knows
    from bench.game import keyed_world
    data = make_task_data(n_targets=600, n_adapt=200, n_pretrain=50, seed=4)
    world = {"n_per_group": 40, "n_null": 40, "adapt_background": 160, "pretrain_target_repeats": 4}
    matched = dict(world, background_in_pretraining="matched")

    def theta_of(ch):
        return NgramLM(list(data.pretrain) + ch.pretraining_inserts(), name="θ")

    oracle, by_theta = _in_s_aucs(data, world, range(3), theta_of)
    assert np.all(oracle == 0.75)                     # half the inserted targets are in S, no background record
    assert by_theta.mean() > 0.7, by_theta
    oracle, by_theta = _in_s_aucs(data, matched, range(6), theta_of)
    assert np.all(np.abs(oracle - 0.5) < 0.01), oracle
    assert abs(by_theta.mean() - 0.5) < 0.06, by_theta
    # what changes is S alone: D̃, the groups and the other inserts are the same, and the world has its own key
    plain, mixed = Challenger(data, world, seed=0), Challenger(data, matched, seed=0)
    assert plain.adaptation_data() == mixed.adaptation_data() and plain.members("a") == mixed.members("a")
    extra = mixed.background_in_pretraining()
    assert len(extra) == 80 and set(extra) <= set(data.adapt[:160]) and not plain.background_in_pretraining()
    assert sorted(mixed.pretraining_inserts()) == sorted((plain.members("a") + extra) * 4)
    assert plain.world_key != mixed.world_key and "background_in_pretraining" not in keyed_world(plain.config)
    # the defense's rule drops a quarter of D̃: in the plain world most of the (1,1) targets go, in the matched
    # world (1,1) targets and background go alike
    for ch, bound in ((plain, None), (mixed, 0.12)):
        theta = theta_of(ch)
        d_tilde = ch.adaptation_data().texts
        kept = set(drop_what_theta_knows(d_tilde, [-s.logprobs.mean() for s in theta.token_signals(d_tilde)], 0.25))
        seen = set(ch.members("a")) & set(ch.members("b"))
        s_background = set(ch.background_in_pretraining()) or set(data.adapt[:160])
        gap = np.mean([t not in kept for t in seen]) - np.mean([t not in kept for t in s_background])
        if bound is None:
            assert gap > 0.5, gap
        else:
            assert abs(gap) < bound, gap


def _unit_task(unit: str, seed: int = 8):
    """A user or secret task of 4 records per target unit and background units of 1-5 records each (owners, or
    secrets carried by several background records), every text unique."""
    import dataclasses
    data = make_task_data(n_targets=480, n_adapt=400, seed=seed)
    rng = np.random.default_rng(seed)
    sizes = rng.integers(1, 6, size=len(data.adapt))
    bg_unit = np.repeat(np.arange(len(sizes)), sizes)[:len(data.adapt)]
    if unit == "user":
        meta = {r.id: {"user": f"u{i // 4}"} for i, r in enumerate(data.targets)}
        return dataclasses.replace(data, unit="user", target_meta=meta,
                                   adapt_owners=tuple(f"bg{j}" for j in bg_unit))
    meta = {r.id: {"secret": f"key{i // 4}x", "secret_id": f"t{i // 4}", "p": 0.5, "r": 0.5}
            for i, r in enumerate(data.targets)}
    targets = tuple(dataclasses.replace(r, text=f"{r.text} key{i // 4}x") for i, r in enumerate(data.targets))
    adapt = tuple(f"{t} bgkey{j}x" for t, j in zip(data.adapt, bg_unit))
    spec = {f"bgkey{j}x": {"secret_id": f"b{j}", "p": 0.5, "r": 0.5} for j in set(bg_unit.tolist())}
    spec.update({m["secret"]: {"secret_id": m["secret_id"], "p": 0.5, "r": 0.5} for m in meta.values()})
    return dataclasses.replace(data, unit="secret", target_meta=meta, targets=targets, adapt=adapt, secret_spec=spec)


@pytest.mark.parametrize("unit", ["user", "secret"])
def test_matched_background_shares_s_by_whole_units(unit):
    """On user and secret tasks a defense reads the units of D̃ (owners, secrets carried) and asks of each how much
    of it θ has seen: a target unit is wholly in S or wholly out of it. Matching the background record by record
    leaves every background unit of several records partly in S, and "wholly in or wholly out" marks the targets;
    drawing the background's units whole, as ``matched`` does, leaves that rule and "wholly in S" at chance."""
    data = _unit_task(unit)
    world = {"n_per_group": 20, "n_null": 8, "adapt_background": 400, "n_validation": 0,
             "background_in_pretraining": "matched"}

    def unit_aucs(ch):
        d = ch.adaptation_data()
        keys = d.users if unit == "user" else [s[0] for s in d.secrets]
        in_s, inserted = set(ch.pretraining_inserts()), set(ch.members("b"))
        share, target = {}, {}
        for k, t in zip(keys, d.texts):
            share.setdefault(k, []).append(t in in_s)
            target[k] = t in inserted
        ks = sorted(share)
        labels = np.array([target[k] for k in ks], dtype=int)
        whole = np.array([float(all(share[k])) for k in ks])
        extreme = np.array([float(all(share[k]) or not any(share[k])) for k in ks])
        return roc_auc(labels, whole), roc_auc(labels, extreme)

    by_unit = np.array([unit_aucs(Challenger(data, world, seed=s, secret=f"s{s}")) for s in range(4)])
    assert np.all(np.abs(by_unit - 0.5) < 0.05), by_unit
    # the exploit against a record-level match of the same share
    by_record = []
    for s in range(4):
        ch = Challenger(data, world, seed=s, secret=f"s{s}")
        ch._background_units = lambda n=ch.n_background: [[i] for i in range(n)]
        by_record.append(unit_aucs(ch))
    assert np.mean([e for _, e in by_record]) > 0.7, by_record    # 0.75-0.81 per seed
    ch = Challenger(data, world, seed=0)
    units = ch._background_units()
    # whole units reaching 400 records (a user world's background is whole users), several records per unit
    assert sum(map(len, units)) == ch.n_background and 400 <= ch.n_background < 410 and len(units) < 200
    assert 0.3 < len(ch.background_in_pretraining()) / ch.n_background < 0.7


def test_theta_is_a_function_of_a_alone_so_theta_prime_equal_theta_is_chance_over_b():
    """What θ is trained on depends on the a bits only, and the attacker's reference model on the task alone: flip
    every unit's b bit and θ's training data stays byte for byte the same while D̃ changes. So in every game over
    b the scores of θ′ = θ are a stratified permutation of themselves, and `none`'s expected AUC is 0.5 whatever
    one draw shows (docs/guard.md: 0.572 over seeds 0-2 of the dp/guard world, 0.509 over seeds 3-9)."""
    data = make_task_data(n_targets=300, seed=5)
    ch = Challenger(data, {"n_per_group": 30, "n_null": 40, "adapt_background": 20,
                           "pretrain_target_repeats": 2}, seed=1)
    inserts, adapt = ch.pretraining_inserts(), ch.adaptation_data().texts
    flipped = Challenger(data, dict(ch.config), seed=1)
    flipped._group = {r: (a, 1 - b) for r, (a, b) in ch._group.items()}
    flipped._unit_group = {u: (a, 1 - b) for u, (a, b) in ch._unit_group.items()}
    assert flipped.pretraining_inserts() == inserts                      # θ does not see b ...
    assert sorted(flipped.adaptation_data().texts) != sorted(adapt)     # ... D̃ does
    assert {ch.unit_group(u)[1] for u in ch.units() if u in ch._unit_group} == {0, 1}
    import inspect
    from bench.world import Worlds
    # the reference model is one per (task, model), for every seed and draw
    assert list(inspect.signature(Worlds.reference_base).parameters) == ["self", "ti", "mi"]


def test_null_pool_is_its_own_and_power_is_flagged():
    data = make_task_data(n_targets=400, seed=1)
    ch = Challenger(data, {"n_per_group": 20, "n_null": 40, "adapt_background": 10}, seed=0)
    null = set(ch.null_units())
    assert len(null) == 40
    for name, game in GAMES.items():
        shown = set(ch.instance(game).record_ids)
        assert (shown == null) if name == "null" else not (shown & null), name
    rows = [MetricRow("auc", 0.6, 0.4, 0.8, 20, 20), MetricRow("tpr@1%fpr", 0.0, 0.0, 0.1, 20, 20, "fpr_below_resolution")]
    flagged = flag_underpowered_null(rows)
    assert flagged[0].flag == "underpowered" and flagged[1].flag == "fpr_below_resolution,underpowered"
    assert flag_underpowered_null([MetricRow("auc", 0.5, 0.45, 0.55, 200, 200)])[0].flag is None


def test_exposure_baseline_counts_only_never_inserted_units():
    labels = [1, 1, 0, 0, 0, 0]
    exposure = [6.0, 5.0, 4.0, 4.0, 1.0, 2.0]   # the first two negatives were inserted in pretraining
    rows = {r.metric: r.value for r in exposure_metrics(labels, exposure,
                                                        never_inserted=[False, False, False, False, True, True])}
    assert rows["exposure_mean_neg"] == pytest.approx(2.75)
    assert rows["exposure_mean_never"] == pytest.approx(1.5)


# ------------------------------------------------------------------------------ pretraining hooks get no labels

class InsertDropper:
    """A dishonest pretraining defense: drops whatever it is told are the challenger's inserts; told nothing,
    it drops the tail of the list, where appended inserts would sit."""

    name = "insert-dropper"
    pretrain_report = None

    def pretrain_texts(self, *args):
        if len(args) == 2:                      # a contract that hands the inserts over separately
            return args[0], []
        docs = args[0]
        return docs[: len(docs) * 9 // 10]


def test_pretraining_defense_cannot_find_the_inserts():
    from bench.artifacts import filter_pretraining
    data = make_task_data(n_targets=200, n_pretrain=900, seed=2)
    inserts = [r.text for r in data.targets[:100]] * 2
    kept_docs, kept_inserts, report = filter_pretraining(InsertDropper(), list(data.pretrain), inserts)
    kept_share_docs = len(kept_docs) / len(data.pretrain)
    kept_share_inserts = report["inserts_kept"] / report["inserts_in"]
    assert report["inserts_in"] == 200 and len(kept_inserts) == report["inserts_kept"]
    # the inserts survive at the rate of every other document: nothing marked them
    assert abs(kept_share_inserts - kept_share_docs) <= 0.06, (kept_share_inserts, kept_share_docs)
    assert kept_share_inserts >= 0.8


def test_pretraining_hook_order_does_not_depend_on_which_documents_are_inserts():
    from bench.artifacts import filter_pretraining
    seen = []

    class Spy:
        name = "spy"

        def pretrain_texts(self, docs):
            seen.append(list(docs))
            return docs

    data = make_task_data(n_targets=40, n_pretrain=60, seed=4)
    texts = list(data.pretrain) + [r.text for r in data.targets]
    filter_pretraining(Spy(), texts[:70], texts[70:])   # 30 inserts
    filter_pretraining(Spy(), texts[30:], texts[:30])   # another 30 are the inserts
    assert seen[0] == seen[1]


def test_pretraining_hook_must_return_texts():
    from bench.artifacts import filter_pretraining

    class Bad:
        name = "bad"

        def pretrain_texts(self, docs):
            return docs, []

    with pytest.raises(PluginError, match="list of strings"):
        filter_pretraining(Bad(), ["a", "b"], ["c"])


def test_old_two_list_hook_is_refused_with_the_fix():
    from bench.artifacts import filter_pretraining

    class Old:
        name = "old"

        def pretrain_texts(self, corpus, inserts):
            return corpus, inserts

    with pytest.raises(PluginError, match="one list"):
        filter_pretraining(Old(), ["a", "b"], ["c"])


# ------------------------------------------------------------------------------ no attack state across games

class Rememberer(Attack):
    """A dishonest, stateful attack: a text it saw in an earlier game scores 0, a new one 1.

    joint/fresh shows only a = 0 units; joint/both's negatives are (0, 0) units, so remembering joint/fresh's
    texts would score joint/both perfectly if the attack kept its state between games."""

    name = "rememberer"
    version = "0.0"
    requires = frozenset({TOKEN_LOGPROBS})

    def score(self, view):
        seen = getattr(self, "seen", set())
        scores = [0.0 if t.text in seen else 1.0 for t in view.targets]
        self.seen = seen | {t.text for t in view.targets}
        return scores


def test_stateful_attack_learns_nothing_across_games():
    data = make_task_data(n_targets=400, seed=5)
    ch = Challenger(data, {"n_per_group": 40, "n_null": 40, "adapt_background": 10}, seed=0)
    lm = UnigramLM(data.pretrain, name="θ")
    template = Rememberer()
    for game in ("joint/fresh", "joint/seen", "post_adapt"):
        _auc(ch, game, template, lm, lm)
    assert not hasattr(template, "seen")                 # nothing came back to the suite's instance
    assert _auc(ch, "joint/both", template, lm, lm) == 0.5


def test_stateful_attack_through_the_runner_learns_nothing(cache, tmp_path, monkeypatch):
    from bench.registry import ATTACKS
    from bench.runner import Runner
    from bench.store import Store
    from bench.suite import parse_suite
    from worlds import TINY

    monkeypatch.setitem(ATTACKS._classes, "rememberer", Rememberer)
    store = Store(str(tmp_path / "r.db"))
    raw = dict(TINY, attacks=["rememberer"], games=["joint/fresh", "post_adapt", "joint/both"])
    result = Runner(parse_suite(raw), store, cache, quiet=True).run()
    auc = {r["game"]: r["value"] for r in store.metric_rows(result.run_id) if r["metric"] == "auc"}
    assert auc == {"joint/fresh": 0.5, "post_adapt": 0.5, "joint/both": 0.5}


def test_unit_views_keep_the_trainer_for_self_prompt():
    """Record-level attacks on user and secret games score each sample as a record: the record view must keep
    everything the unit view had, the fine-tuning trainer of self-prompt included."""
    got = []

    class NeedsTrainer(Attack):
        name = "needs-trainer"
        version = "0.0"
        requires = frozenset({TOKEN_LOGPROBS, FINETUNE_REFERENCE})

        def score(self, view):
            got.append(view.trainer)
            return np.zeros(len(view.targets))

    trainer = object()
    lm = RestrictedModel(UnigramLM(["abc"]), frozenset({TOKEN_LOGPROBS}), "released")
    view = AttackerView("adapt", (Target("u1", "a", ("a", "b")), Target("u2", "c", ("c",))), lm, None, None, None,
                        unit="user", trainer=trainer)
    assert run_attack(NeedsTrainer(), view).tolist() == [0.0, 0.0]
    assert got == [trainer]


# ------------------------------------------------------------------------------ owners do not mark target users

def test_owner_counts_do_not_mark_target_users(tmp_path, monkeypatch):
    """A dishonest defense drops every owner with several records in its data. When background records had one
    owner each, that removed exactly the target users; with real owners it removes targets and background alike."""
    from bench.cache import ArtifactCache
    from bench.registry import TASKS
    monkeypatch.setenv("PRIVBENCH_CACHE", str(tmp_path / "c"))
    rng = np.random.default_rng(0)
    rows = []
    for u in range(900):
        for j in range(int(rng.integers(1, 6))):
            rows.append({"text": f"user {u} writes note {j}: " + " ".join(rng.choice(["alpha", "beta", "gamma", "delta",
                         "omega", "sigma"], size=8)), "user": f"u{u}"})
    path = tmp_path / "users.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    data = TASKS.create("local_text", {"path": str(path), "user_column": "user"}).build(ArtifactCache(tmp_path / "c"))
    assert data.adapt_owners is not None and len(data.adapt_owners) == len(data.adapt)
    ch = Challenger(data, {"n_per_group": 40, "n_null": 40, "adapt_background": 200, "n_validation": 0}, seed=0)
    d = ch.adaptation_data()
    b1 = set(ch.members("b"))
    counts = Counter(d.users)
    dropped = [counts[o] > 1 for o in d.users]
    is_target = [t in b1 for t in d.texts]
    rate_t = np.mean([x for x, t in zip(dropped, is_target) if t])
    rate_bg = np.mean([x for x, t in zip(dropped, is_target) if not t])
    assert 0.5 < rate_bg < 1.0 and abs(rate_t - rate_bg) <= 0.15, (rate_t, rate_bg)


def test_user_task_without_owners_is_refused():
    import dataclasses

    from bench.errors import DataError
    data = make_task_data(n_targets=200, seed=6)
    meta = {r.id: {"user": f"u{i // 4}"} for i, r in enumerate(data.targets)}
    users = dataclasses.replace(data, unit="user", target_meta=meta)
    ch = Challenger(users, {"n_per_group": 8, "n_null": 8, "adapt_background": 10}, seed=0)
    with pytest.raises(DataError, match="adapt_owners"):
        ch.adaptation_data()


# ------------------------------------------------------------------------------ a draw no plugin can recompute

def test_secret_draw_cannot_be_recomputed_from_the_public_seed():
    """A dishonest defense rebuilds the challenger from the task and the seed it is given, and drops what that
    world says are b = 1 targets. Against a public draw it finds them all (the documented trade-off of a
    reproducible draw); against a secret draw its guesses are no better than chance."""
    data = make_task_data(n_targets=400, seed=7)
    world = {"n_per_group": 40, "n_null": 40, "adapt_background": 10}
    guess = set(Challenger(data, world, seed=0).members("b"))
    public = Challenger(data, world, seed=0)
    assert set(public.members("b")) == guess
    salted = Challenger(data, world, seed=0, secret="s3cr3t")
    actual = set(salted.members("b"))
    hit = len(guess & actual) / len(actual)
    # chance: a b = 1 target of the salted world is among the 80 guesses out of 400 targets about 20% of the time
    assert hit <= 0.4, hit
    assert salted.world_key != public.world_key
    assert set(Challenger(data, world, seed=0, secret="s3cr3t").members("b")) == actual   # reproducible with it


def test_submission_labels_come_from_the_parent():
    from bench.submit import check_labels
    truth = {("t", 0, "adapt"): ("w", {"x": 1, "y": 0})}
    ev = {"eval_key": "e", "task": "t", "seed": 0, "game": "adapt", "world_key": "w", "target_ids": ["y", "x"],
          "labels": [0, 1]}
    check_labels([ev], truth)
    with pytest.raises(PluginError, match="labels differ"):
        check_labels([dict(ev, labels=[1, 0])], truth)
    with pytest.raises(PluginError, match="world key"):
        check_labels([dict(ev, world_key="forged")], truth)
    with pytest.raises(PluginError, match="target ids"):
        check_labels([dict(ev, target_ids=["x", "z"])], truth)


def test_docs_name_every_in_process_channel():
    docs = (Path(__file__).resolve().parents[1] / "docs" / "attacks.md").read_text()
    for phrase in ("fresh instance", "class or module level", "--secret-draw"):
        assert phrase in docs, phrase


# ------------------------------------------------------------------------------ shadows get what a recipe reads

def test_shadow_data_gives_each_recipe_what_it_reads():
    """RMIA's shadows apply the defense's own recipe to attacker data: a recipe that validates, limits users or
    protects secrets must get held-back records, owners or secrets built from the population, as D has them."""
    import dataclasses

    from bench.world import shadow_data
    from defenses.finetune import FineTune
    from defenses.mitigations import EarlyStop
    data = make_task_data(n_targets=40, n_population=60, seed=8)
    texts = tuple(data.population[:20])
    plain = shadow_data(data, texts, FineTune())
    assert plain.texts == texts and plain.validation is None and plain.users is None
    es = shadow_data(data, texts, EarlyStop())
    assert es.texts == texts[:16] and es.validation == texts[16:]     # trained on 4/5, validated on the rest
    owners = tuple(f"u{i % 7}" for i in range(len(data.population)))
    users = dataclasses.replace(data, unit="user", population_owners=owners)
    got = shadow_data(users, texts, FineTune()).users
    same = [got[i] == got[j] for i in range(20) for j in range(20)]
    assert same == [owners[i] == owners[j] for i in range(20) for j in range(20)]   # owners kept, pseudonymised
    assert not set(got) & set(owners)


def test_rmia_runs_against_a_defense_that_validates(cache, tmp_path):
    from bench.runner import Runner
    from bench.store import Store
    from bench.suite import parse_suite
    from worlds import TINY

    store = Store(str(tmp_path / "r.db"))
    raw = dict(TINY, defenses=[{"name": "early_stop", "params": {"epochs": 1}}], attacks=["rmia"], games=["adapt"],
               reference=True, shadows={"n": 2, "records": 20, "n_population": 40})
    result = Runner(parse_suite(raw), store, cache, quiet=True).run()
    assert result.status == "complete" and result.new_evaluations == 1


def test_none_control_suite_draws_the_dp_and_guard_world():
    """docs/guard.md reads the dp and guard suites' `none` anchor against examples/suites/none_control_dp_world.yaml
    (the same world over ten seeds): the control must keep drawing exactly that world, and release θ only."""
    from bench.suite import load_suite
    control = load_suite(str(Path(__file__).parent.parent / "examples/suites/none_control_dp_world.yaml"))
    assert [d.name for d in control.defenses] == ["none"] and len(control.seeds) >= 10
    for name in ("dp", "guard"):
        suite = load_suite(name)
        assert set(suite.seeds) <= set(control.seeds)
        assert [(e.name, e.instance.config) for e in control.tasks] == [(e.name, e.instance.config)
                                                                        for e in suite.tasks]
        assert [m.to_dict() for m in control.models] == [m.to_dict() for m in suite.models]
        assert control.world == suite.world and control.reference == suite.reference
        assert {"adapt", "null"} <= {g.name for g in control.games}
