"""privbench as a library: the plugin contract in one namespace, the packages under it, and evaluate()."""

from __future__ import annotations

import importlib

import pytest


def test_the_namespace_gives_the_same_modules_not_copies():
    import bench.game
    import bench.registry
    game = importlib.import_module("privbench.bench.game")
    assert game is bench.game
    from privbench.bench.registry import ATTACKS
    assert ATTACKS is bench.registry.ATTACKS                       # one registry, whichever name imported it
    from privbench.attacks.min_k import MinKAttack
    from attacks.min_k import MinKAttack as Same
    assert MinKAttack is Same


def test_the_contract_is_importable_from_privbench():
    import privbench
    from bench.attack import Attack
    from bench.defense import Adapted, Defense
    assert privbench.Attack is Attack and privbench.Defense is Defense and privbench.Adapted is Adapted
    for name in privbench.__all__:
        assert hasattr(privbench, name), name


def test_evaluate_runs_a_suite_and_returns_frames(cache):
    import privbench
    from worlds import TINY
    r = privbench.evaluate(dict(TINY), db=None, cache=cache.root)
    assert r.status == "complete" and r.run_id >= 1
    assert {"defense", "game", "attack", "metric", "value"} <= set(r.metrics.columns)
    assert set(r.metrics["game"]) == {"adapt", "null"} and len(r.metrics.head()) == 5
    assert {"loss"} <= set(r.utility["metric"])
    again = privbench.evaluate(dict(TINY), db=None, cache=cache.root)   # cached models and signals
    key = ["defense", "game", "attack", "metric"]
    assert again.metrics.sort_values(key)["value"].tolist() == r.metrics.sort_values(key)["value"].tolist()


def test_evaluate_refuses_an_unknown_suite():
    import privbench
    from bench.errors import ConfigError
    with pytest.raises(ConfigError, match="unknown suite"):
        privbench.evaluate("no-such-suite")
