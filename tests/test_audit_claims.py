"""Claims checked: a DP defense whose noise is silently dropped is caught by the audit game; a correct one is not.

False-positive rate: a correct (ε, δ)-DP defense is flagged ``claim_violated`` with probability at most
1 − confidence = 5 % per (attack, seed) by construction (bench/audit.py, claim_row); the seed here is fixed.
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

import numpy as np
import pytest

from bench.audit import claim_row, claimed_epsilon
from bench.cache import ArtifactCache
from bench.runner import Runner
from bench.store import Store
from bench.suite import parse_suite

from worlds import TINY  # noqa: E402  (the shared tiny world)

sys.path.insert(0, str(Path(__file__).parent / "plugins"))
import broken_dp_defense  # noqa: E402,F401  (registers broken_dp)

CLAIM = "dp_claim@95%,delta=1e-05"


def test_claimed_epsilon_uses_the_group_bound_for_repeated_canaries():
    from bench.accounting import group_privacy
    eps_3, delta_3 = group_privacy(1.0, 1e-5, 3)
    g = {"name": "epsilon", "value": 1.0, "delta": 1e-5, "group_k": 3, "group_epsilon": eps_3, "group_delta": delta_3}
    assert claimed_epsilon(g, 1) == (1.0, 1e-5) and claimed_epsilon(g, 3) == (eps_3, delta_3)
    assert (eps_3, delta_3) == pytest.approx((3.0, 3 * math.e ** 2 * 1e-5), rel=1e-12)
    # a canary of 2 copies in data whose largest group is 3: checked against the bound for 2, not the looser one for 3
    assert claimed_epsilon(g, 2) == group_privacy(1.0, 1e-5, 2) == pytest.approx((2.0, 2 * math.e * 1e-5), rel=1e-12)
    assert claimed_epsilon(g, 4) is None  # the group bound does not cover 4 copies: no claim to check
    assert claimed_epsilon({"name": "epsilon", "value": float("inf"), "delta": None}, 1) is None
    assert claimed_epsilon(None, 1) is None


def test_claim_row_flags_a_perfect_attack_on_a_small_claim_only():
    y = np.r_[np.ones(100), np.zeros(100)].astype(int)
    s = y + np.random.default_rng(0).normal(0.0, 0.01, 200)  # every guess right
    claim = {"name": "epsilon", "value": 1.0, "delta": 1e-5}
    row = claim_row(y, s, claim)
    assert row.flag == "claim_violated" and row.ci_low > 1.0 and row.value == 1.0
    assert claim_row(y, s, dict(claim, value=50.0)).flag == "claim_ok"
    assert claim_row(y, np.random.default_rng(1).normal(size=200), claim).flag == "claim_ok"


def test_broken_dp_is_flagged_and_correct_dp_is_not(tmp_path):
    dp = {"epochs": 8, "lr": 0.01, "batch_size": 8, "delta": 1e-5, "epsilon": 1.0}
    raw = dict(TINY, games=["audit"], world=dict(TINY["world"], n_audit=100), attacks=["loss"],
               defenses=[{"name": "broken_dp", "params": dp}, {"name": "dp_adapt", "label": "dp1", "params": dp}])
    store = Store(str(tmp_path / "a.db"))
    result = Runner(parse_suite(raw), store, ArtifactCache(tmp_path / "cache"), quiet=True).run()
    verdicts = {r["defense"]: r for r in store.metric_rows(result.run_id) if r["metric"] == CLAIM}
    assert verdicts["broken_dp"]["flag"] == "claim_violated" and verdicts["broken_dp"]["ci_low"] > 1.0
    assert verdicts["dp1"]["flag"] == "claim_ok" and verdicts["dp1"]["value"] <= 1.0


@pytest.mark.slow
@pytest.mark.parametrize("epsilon", [4.0, 8.0])
def test_correct_dp_at_larger_epsilon_is_not_flagged(tmp_path, epsilon):
    dp = {"epochs": 8, "lr": 0.01, "batch_size": 8, "delta": 1e-5, "epsilon": epsilon}
    raw = dict(TINY, games=["audit"], world=dict(TINY["world"], n_audit=100), attacks=["loss"],
               defenses=[{"name": "dp_adapt", "params": dp}])
    store = Store(str(tmp_path / "a.db"))
    result = Runner(parse_suite(raw), store, ArtifactCache(tmp_path / "cache"), quiet=True).run()
    (row,) = [r for r in store.metric_rows(result.run_id) if r["metric"] == CLAIM]
    assert row["flag"] == "claim_ok" and row["ci_low"] <= epsilon


def test_a_record_level_claim_is_checked_over_a_whole_user_canary():
    """A user canary puts all of its user's records into D: a record-level (ε, δ) claim covers it only through
    group privacy over that many records, so the check must use the unit's size (4 here), not 1; a claim made
    per user covers each canary as one unit."""
    import dataclasses

    from fakes import make_task_data

    from bench.game import GAMES, Challenger
    from bench.jobs import audit_group_size

    data = make_task_data(n_targets=400, n_adapt=200)
    meta = {t.id: {"user": f"u{i // 4}"} for i, t in enumerate(data.targets)}
    users = dataclasses.replace(data, unit="user", target_meta=meta,
                                adapt_owners=tuple(f"bg{i}" for i in range(len(data.adapt))))
    world = {"n_per_group": 4, "n_null": 8, "adapt_background": 10, "n_audit": 40}
    ch = Challenger(users, world, seed=0)
    inst = ch.instance(GAMES["audit"])
    claim = {"name": "epsilon", "value": 1.0, "delta": 1e-5, "unit": "record"}
    assert audit_group_size(ch, inst.record_ids, users, claim) == 4
    assert audit_group_size(ch, inst.record_ids, users, dict(claim, unit="user")) == 1
    # a claim per identical text covers each of the user's 4 distinct texts as its own unit
    assert audit_group_size(ch, inst.record_ids, users, dict(claim, unit="text")) == 4
    records = Challenger(data, world, seed=0)
    assert audit_group_size(records, records.instance(GAMES["audit"]).record_ids, data, claim) == 1
    # a record canary inserted 3 times: 3 records for a record-level claim, one unit for a claim per text
    thrice = Challenger(data, dict(world, adapt_target_repeats=3), seed=0)
    ids = thrice.instance(GAMES["audit"]).record_ids
    assert audit_group_size(thrice, ids, data, claim) == 3
    assert audit_group_size(thrice, ids, data, dict(claim, unit="text")) == 1
    # a claim with no group bound for 4 records is not checked at all, rather than refuted at the wrong size
    labels = inst.labels
    scores = labels + np.linspace(0.0, 0.5, len(labels))  # separates members perfectly, without ties
    assert claim_row(labels, scores, claim, repeats=4) is None
    assert claim_row(labels, scores, claim, repeats=1).flag == "claim_violated"
