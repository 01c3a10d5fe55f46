"""Paper-trend checks decide by their stated rules, on synthetic stored rows (the suites themselves are slow)."""

from __future__ import annotations

import pytest

from bench.errors import ConfigError
from bench.trends import TRENDS, SuiteResults, check_dp, check_guard, check_iid_ood, check_naf, run_trends


def _auc(defense, attack, value, game="adapt", task="t"):
    return {"defense": defense, "game": game, "attack": attack, "metric": "auc", "value": value, "task": task}


def _util(defense, metric, value, role="adapted"):
    return {"defense": defense, "role": role, "dataset": "heldout", "metric": metric, "value": value}


def test_dp_trend_needs_chance_at_small_epsilon_and_a_clear_gap_at_infinity():
    rows = [_auc("dp-full-eps1", a, 0.52) for a in ("loss", "min_k", "reference")]
    rows += [_auc("dp-full-epsinf", a, 0.75) for a in ("loss", "min_k", "reference")]
    assert check_dp(SuiteResults(rows, [])).holds
    rows[0] = _auc("dp-full-eps1", "loss", 0.60)  # ε = 1 no longer near chance for one attack
    res = check_dp(SuiteResults(rows, []))
    assert not res.holds and "loss: ε=1 0.600 vs ε=∞ 0.750" in res.numbers


def test_guard_trend_compares_utility_cost_with_dp():
    attacks = ("loss", "min_k", "reference")
    rows = ([_auc("guard", a, 0.53) for a in attacks] + [_auc("dp-lora-eps8", a, 0.52) for a in attacks] +
            [_auc("finetune", a, 0.9) for a in attacks])
    util = [_util("-", "loss", 6.0, role="pretrained"), _util("guard", "loss", 6.05), _util("dp-lora-eps8", "loss", 6.2)]
    assert check_guard(SuiteResults(rows, util)).holds
    util[1] = _util("guard", "loss", 6.3)  # GUARD costs more than DP at the same AUC
    assert not check_guard(SuiteResults(rows, util)).holds


def test_naf_trend_requires_lower_exposure_at_similar_accuracy():
    def rows_for(exp):
        return [{"defense": d, "game": "adapt", "attack": "exposure", "metric": "exposure_mean_pos", "value": v,
                 "task": "c"} for d, v in exp.items()]
    acc = [_util(d, "next_token_accuracy", 0.12) for d in ("finetune", "cp_delta", "scp_delta_r_b", "scp_delta_r_c")]
    good = {"finetune": 6.5, "cp_delta": 2.4, "scp_delta_r_b": 1.8, "scp_delta_r_c": 1.9}
    assert check_naf(SuiteResults(rows_for(good), acc)).holds
    assert not check_naf(SuiteResults(rows_for({**good, "scp_delta_r_c": 2.5}), acc)).holds
    acc[2] = _util("scp_delta_r_b", "next_token_accuracy", 0.05)  # bought with utility: not "similar accuracy"
    assert not check_naf(SuiteResults(rows_for(good), acc)).holds


def test_iid_ood_trend_compares_each_attack():
    rows = [dict(_auc("finetune", a, v, task=t)) for a, v, t in
            (("loss", 0.8, "pile_subset:iid"), ("loss", 0.6, "pile_subset:ood"),
             ("min_k", 0.9, "pile_subset:iid"), ("min_k", 0.7, "pile_subset:ood"))]
    assert check_iid_ood(SuiteResults(rows, [])).holds
    rows[3]["value"] = 0.95
    assert not check_iid_ood(SuiteResults(rows, [])).holds


def test_unknown_trend_is_a_clear_error():
    with pytest.raises(ConfigError, match="unknown trend"):
        run_trends(["nope"], store=None, cache=None)
    assert set(TRENDS) == {"dp", "iid_ood", "naf_canaries", "naf_pii", "guard", "hush"}


def test_hush_trend_is_computed_not_run():
    (row,) = run_trends(["hush"], store=None, cache=None)
    assert row["holds"] == "yes" and "σ Hush" in row["numbers"]
