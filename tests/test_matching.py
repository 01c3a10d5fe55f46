"""Matched utility: the runner keeps the grid value whose validation loss is closest to the target."""

from __future__ import annotations

import pytest

from bench.artifacts import ensure_adapted, ensure_pretrained, ensure_tokenizer
from bench.device import select_device
from bench.errors import ConfigError
from bench.game import Challenger
from bench.lm import HFLanguageModel
from bench.matching import pick
from bench.modeling import load_model
from bench.registry import DEFENSES
from bench.runner import Runner
from bench.store import Store
from bench.suite import parse_suite
from bench.utility import heldout_metrics
from worlds import TINY

MATCH = {"param": "epochs", "grid": [1, 3], "target_loss": 100.0, "n_validation": 10}


def _suite(match):
    return parse_suite({**TINY, "defenses": [{"name": "finetune", "params": {"epochs": 1}, "match": match}],
                        "reference": False, "utility": {"n_heldout": 12, "n_generate": 0}})


def test_pick_is_closest_and_prefers_the_cheaper_on_ties():
    assert pick([(1, 5.0), (2, 4.0), (4, 3.5)], 4.1) == (2, 4.0)
    assert pick([(1, 5.0), (2, 3.0)], 4.0) == (1, 5.0)


def test_a_target_outside_the_grid_is_not_a_match():
    from bench.matching import brackets
    assert brackets([5.0, 4.0, 3.5], 4.1) and brackets([5.0, 4.0], 4.0)
    assert not brackets([6.8, 6.7, 6.5], 7.1)      # every grid value overshoots the target utility
    assert not brackets([6.8, 6.7], 6.0)


def test_match_is_validated():
    with pytest.raises(ConfigError, match="needs exactly one of target_loss"):
        _suite({"param": "epochs", "grid": [1]})
    with pytest.raises(ConfigError, match="epochs"):
        _suite({**MATCH, "grid": [0]})            # not a valid finetune configuration
    with pytest.raises(ConfigError, match="unknown keys"):
        parse_suite({**TINY, "attacks": [{"name": "loss", "match": MATCH}]})


def test_runner_keeps_the_value_closest_to_the_target(cache, tmp_path):
    suite = _suite(MATCH)
    store = Store(str(tmp_path / "m.db"))
    result = Runner(suite, store, cache, quiet=True).run()
    got = {r["metric"]: r["value"] for r in store.utility_rows(result.run_id) if r["dataset"] == "match"}
    # independent: adapt both candidates (cache hits) and measure the same validation records
    data = suite.tasks[0].instance.build(cache)
    spec, device = suite.models[0], select_device("cpu")
    tok = ensure_tokenizer(cache, spec, data)
    ch = Challenger(data, suite.world, 0)
    base = ensure_pretrained(cache, spec, data, tok, ch.pretraining_inserts(), 0, device, progress=False)
    val = list(data.heldout[12:22])
    losses = {}
    for epochs in (1, 3):
        path, key, _ = ensure_adapted(cache, spec, base, DEFENSES.create("finetune", {"epochs": epochs}),
                                      ch.adaptation_data(), 0, device, progress=False)
        model, t = load_model(path, device=device)
        losses[epochs] = heldout_metrics(HFLanguageModel(model, t, fingerprint=key, max_length=spec.context_length,
                                                         cache=None, progress=False), val)[0]["loss"]
    want = max(losses, key=losses.get)  # target 100 nats: the candidate with the higher loss is closer
    assert got["chosen_epochs"] == want
    assert got["validation_loss"] == pytest.approx(losses[want], rel=1e-5)
    assert got["target_bracketed"] == 0.0   # no grid value reaches 100 nats: stored as not at matched utility


def test_match_to_another_defense_is_validated():
    from bench.suite import parse_suite
    from worlds import TINY
    ok = dict(TINY, defenses=["finetune", {"name": "lora", "match": {"param": "epochs", "grid": [1, 2],
                                                                      "target_defense": "finetune"}}])
    assert parse_suite(ok).defenses[1].match["target_defense"] == "finetune"
    for target in ("nope", "lora"):   # unknown, or itself (a matched defense)
        bad = dict(TINY, defenses=["finetune", {"name": "lora", "match": {"param": "epochs", "grid": [1, 2],
                                                                           "target_defense": target}}])
        with pytest.raises(ConfigError, match="is not an unmatched defense of this suite"):
            parse_suite(bad)
    both = dict(TINY, defenses=["finetune", {"name": "lora", "match": {"param": "epochs", "grid": [1],
                                                                        "target_defense": "finetune",
                                                                        "target_loss": 5.0}}])
    with pytest.raises(ConfigError, match="exactly one of target_loss"):
        parse_suite(both)
