"""The audit game: a pool of canaries, each in the adaptation data with probability 1/2, and its one-run ε bound."""

from __future__ import annotations

import dataclasses

import pytest

from bench.cache import ArtifactCache
from bench.errors import ConfigError
from bench.game import GAMES, Challenger, resolve_games
from bench.registry import TASKS
from bench.runner import Runner
from bench.store import Store
from bench.suite import parse_suite

from worlds import TINY  # noqa: E402  (the shared tiny world)

WORLD = dict(TINY["world"])


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    return ArtifactCache(tmp_path_factory.mktemp("cache"))


@pytest.fixture(scope="module")
def data(cache):
    return TASKS.create("mini_pile", TINY["tasks"][0]["params"]).build(cache)


def test_audit_pool_is_separate_independent_and_inserted_when_c_is_1(data):
    plain = Challenger(data, WORLD, 0)
    ch = Challenger(data, dict(WORLD, n_audit=100), 0)
    # no audit pool: the world key of worlds written before it existed
    assert Challenger(data, dict(WORLD, n_audit=0), 0).world_key == plain.world_key != ch.world_key
    # with one, the 2×2 groups are unchanged where the target pool is the task's; a pooled world (bench/pools.py)
    # sizes its target side for the audit units too, so its split, and with it the groups, moves
    unpooled = dataclasses.replace(data, adapt_docs=None, target_docs=None)
    for g in ("adapt", "null"):
        assert (Challenger(unpooled, WORLD, 0).instance(GAMES[g]).record_ids
                == Challenger(unpooled, dict(WORLD, n_audit=100), 0).instance(GAMES[g]).record_ids)
    assert plain.pooled and ch.pooled
    inst = ch.instance(GAMES["audit"])
    assert len(inst.labels) == 100 and 30 <= inst.n_pos <= 70  # Binomial(100, 1/2), not a fixed half
    assert not set(inst.record_ids) & (set(ch.instance(GAMES["adapt"]).record_ids) | set(ch.null_units()))
    d = set(ch.adaptation_data().texts)
    text = {t.id: t.text for t in ch.target_pool}
    assert all((text[u] in d) == bool(y) for u, y in zip(inst.record_ids, inst.labels))
    assert all(ch.never_inserted(u) == (not y) for u, y in zip(inst.record_ids, inst.labels))
    assert "audit" in ch.games_defined() and "audit" not in plain.games_defined()


def test_audit_game_is_opt_in_and_needs_its_pool():
    assert "audit" not in [g.name for g in resolve_games("all")]
    with pytest.raises(ConfigError, match="n_audit is 0: set world n_audit to at least"):
        parse_suite(dict(TINY, games=["adapt", "audit"]))


def test_audit_run_stores_a_positive_one_run_bound_for_a_memorising_model(cache, tmp_path):
    raw = dict(TINY, games=["audit"], world=dict(WORLD, n_audit=100), attacks=["loss"],
               defenses=[{"name": "finetune", "params": {"epochs": 5}}])
    store = Store(str(tmp_path / "a.db"))
    result = Runner(parse_suite(raw), store, cache, quiet=True).run()
    rows = {r["metric"]: r for r in store.metric_rows(result.run_id)}
    one_run = rows["eps_lb_one_run@95%,delta=1e-05"]
    assert one_run["value"] > 0.5 and one_run["flag"] is None and one_run["n_pos"] + one_run["n_neg"] == 100
    assert rows["eps_lb_roc@95%,delta=1e-05"]["flag"] == "indicative"


def test_pretraining_audit_pool_is_separate_and_inserted_into_pretraining_when_c_is_1(data):
    plain = Challenger(data, WORLD, 0)
    ch = Challenger(data, dict(WORLD, n_audit=60, n_audit_pretrain=100), 0)
    assert Challenger(data, dict(WORLD, n_audit_pretrain=0), 0).world_key == plain.world_key != ch.world_key
    unpooled = dataclasses.replace(data, adapt_docs=None, target_docs=None)
    for g in ("adapt", "pretrain", "null"):  # the 2×2 groups and the null pool do not move (unpooled: see above)
        assert (Challenger(unpooled, WORLD, 0).instance(GAMES[g]).record_ids
                == Challenger(unpooled, dict(WORLD, n_audit=60, n_audit_pretrain=100), 0).instance(GAMES[g]).record_ids)
    pre, post = ch.instance(GAMES["audit/pretrain"]), ch.instance(GAMES["audit"])
    assert len(pre.labels) == 100 and 30 <= pre.n_pos <= 70 and len(post.labels) == 60
    assert not set(pre.record_ids) & set(post.record_ids)
    assert not set(pre.record_ids) & (set(ch.instance(GAMES["adapt"]).record_ids) | set(ch.null_units()))
    text = {t.id: t.text for t in ch.target_pool}
    s, d = set(ch.pretraining_inserts()), set(ch.adaptation_data().texts)
    assert all((text[u] in s) == bool(y) for u, y in zip(pre.record_ids, pre.labels))
    assert not any(text[u] in d for u in pre.record_ids)  # C_S never reaches the adaptation data
    assert not any(text[u] in s for u in post.record_ids)  # nor C the pretraining data
    assert all(ch.never_inserted(u) == (not y) for u, y in zip(pre.record_ids, pre.labels))
    assert {"audit", "audit/pretrain"} <= ch.games_defined()
    # the bits of C_S come from a stream of their own: they are not C's bits
    assert list(pre.labels[:60]) != list(post.labels) or pre.n_pos != post.n_pos


def test_pretraining_audit_game_needs_its_own_pool():
    assert "audit/pretrain" not in [g.name for g in resolve_games("all")]
    with pytest.raises(ConfigError, match="n_audit_pretrain is 0: set world n_audit_pretrain to at least"):
        parse_suite(dict(TINY, games=["audit/pretrain"], world=dict(WORLD, n_audit=100)))


def test_pretraining_audit_run_bounds_theta_and_checks_no_adaptation_claim(cache, tmp_path):
    """θ memorises canaries inserted 8 times into S: a positive one-run bound; a DP ledger of the adaptation is
    not a claim about θ, so the audit/pretrain game stores no claim row for the DP defense."""
    raw = dict(TINY, games=["audit/pretrain"], world=dict(WORLD, n_audit_pretrain=100, pretrain_target_repeats=8),
               attacks=["loss"], reference=False,
               defenses=[{"name": "dp_adapt", "params": {"epsilon": 1.0, "delta": 1e-5, "epochs": 1}}])
    store = Store(str(tmp_path / "p.db"))
    result = Runner(parse_suite(raw), store, cache, quiet=True).run()
    rows = store.metric_rows(result.run_id)
    assert {r["game"] for r in rows} == {"audit/pretrain"}
    by_metric = {r["metric"]: r for r in rows}
    one_run = by_metric["eps_lb_one_run@95%,delta=1e-05"]
    assert one_run["value"] > 0.5 and one_run["n_pos"] + one_run["n_neg"] == 100
    assert not [m for m in by_metric if m.startswith("dp_claim@")]
