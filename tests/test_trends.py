"""Paper-trend checks decide by their stated rules, on synthetic per-seed rows (the suites themselves are slow).

Every rule has three outcomes, each exercised here: the claim holds, it does not, or it is inconclusive because a
precondition fails (the undefended model does not leak, a private model learned nothing, too few seeds).
"""

from __future__ import annotations

import pytest

from bench.errors import ConfigError
from bench.trends import (TRENDS, SuiteResults, check_dp, check_dp_matched, check_guard, check_iid_ood, check_naf,
                          check_naf_pii, run_trends, verdict)

SEEDS = (0, 1, 2)


def _m(defense, attack, values, game="adapt", task="t", metric="auc"):
    return [{"defense": defense, "game": game, "attack": attack, "metric": metric, "value": v, "task": task,
             "seed": s} for s, v in zip(SEEDS, values)]


def _u(defense, metric, values, dataset="heldout", role="adapted"):
    return [{"defense": defense, "role": role, "dataset": dataset, "metric": metric, "value": v, "seed": s}
            for s, v in zip(SEEDS, values)]


def _retained(defense, values):
    return _u(defense, "utility_retained", values, dataset="retained")


MIA = ("loss", "min_k", "reference")


def _dp(eps1=(0.50, 0.52, 0.49), epsinf=(0.80, 0.82, 0.79), ret8=(0.30, 0.35, 0.28)):
    rows = [r for a in MIA for r in _m("dp-full-eps1", a, eps1) + _m("dp-full-epsinf", a, epsinf)]
    util = _retained("dp-full-eps1", (0.10, 0.12, 0.09)) + _retained("dp-full-eps8", ret8) + \
        _retained("dp-full-epsinf", (0.9, 0.95, 0.92))
    return SuiteResults(rows, util)


def test_dp_trend_holds_fails_and_is_inconclusive_by_its_rule():
    assert check_dp(_dp()).holds is True
    res = check_dp(_dp(eps1=(0.60, 0.62, 0.61)))          # ε = 1 no longer near chance
    assert res.holds is False and "loss: 0.610" in res.numbers
    res = check_dp(_dp(epsinf=(0.55, 0.56, 0.54)))        # the ε = ∞ model does not leak: nothing to test
    assert res.holds is None and "does not leak" in res.why
    res = check_dp(_dp(ret8=(0.01, -0.02, 0.0)))          # DP at ε = 8 learned nothing: chance AUC is trivial
    assert res.holds is None and "learned nothing" in res.why
    two = SuiteResults([r for r in _dp().metrics if r["seed"] < 2], [r for r in _dp().utility if r["seed"] < 2])
    assert check_dp(two).holds is None and "fewer than 3 seeds" in check_dp(two).why


def test_dp_trend_rejects_utility_that_falls_with_epsilon():
    r = _dp()
    r.utility = _retained("dp-full-eps1", (0.6, 0.62, 0.61)) + _retained("dp-full-eps8", (0.3, 0.31, 0.29)) + \
        _retained("dp-full-epsinf", (0.9, 0.95, 0.92))
    assert check_dp(r).holds is False


def test_dp_matched_needs_a_clear_gap_at_the_same_utility():
    rows = [r for a in MIA for r in _m("finetune-matched-eps8", a, (0.80, 0.78, 0.82)) +
            _m("dp-full-eps8", a, (0.55, 0.57, 0.54))]
    util = _retained("dp-full-eps8", (0.3, 0.32, 0.29)) + _retained("finetune-matched-eps8", (0.31, 0.3, 0.3))
    assert check_dp_matched(SuiteResults(rows, util)).holds is True
    close = [r for a in MIA for r in _m("finetune-matched-eps8", a, (0.62, 0.60, 0.64)) +
             _m("dp-full-eps8", a, (0.60, 0.63, 0.61))]
    assert check_dp_matched(SuiteResults(close, util)).holds is False


def _guard(guard=(0.52, 0.50, 0.53), dp=(0.54, 0.55, 0.53), ret_dp=(0.2, 0.22, 0.19), bracketed=(1.0, 1.0, 1.0)):
    rows = [r for a in MIA for r in _m("guard", a, guard) + _m("dp-lora-eps8", a, dp) + _m("kd", a, (0.7,) * 3) +
            _m("finetune", a, (0.9, 0.92, 0.91))]
    util = _retained("guard", (0.2,) * 3) + _retained("kd", (0.21,) * 3) + _retained("dp-lora-eps8", ret_dp)
    util += _u("guard", "target_bracketed", bracketed, dataset="match") + \
        _u("kd", "target_bracketed", (1.0,) * 3, dataset="match")
    return SuiteResults(rows, util)


def test_guard_trend_at_matched_utility():
    assert check_guard(_guard()).holds is True
    assert check_guard(_guard(guard=(0.64, 0.66, 0.65))).holds is False        # not near chance
    assert check_guard(_guard(guard=(0.55, 0.56, 0.555), dp=(0.50, 0.505, 0.50))).holds is False  # worse than DP
    assert check_guard(_guard(ret_dp=(0.0, 0.01, -0.01))).holds is None        # DP-LoRA learned nothing
    missed = check_guard(_guard(bracketed=(1.0, 0.0, 1.0)))                     # GUARD's grid missed in seed 1
    assert missed.holds is None and "not a comparison at matched utility" in missed.why


def _naf(scp_b=(1.8, 1.9, 1.7), ft=(6.5, 6.2, 6.8), acc_b=0.12):
    exp = {"finetune": ft, "cp_delta": (2.6, 2.5, 2.7), "scp_delta_r_b": scp_b, "scp_delta_r_c": (1.9, 1.8, 2.0)}
    rows = [r for d, v in exp.items() for r in _m(d, "exposure", v, metric="exposure_mean_pos")]
    rows += _m("finetune", "exposure", (1.4, 1.5, 1.45), metric="exposure_mean_never")
    util = [r for d in exp for r in _u(d, "next_token_accuracy", (acc_b if d == "scp_delta_r_b" else 0.12,) * 3)]
    return SuiteResults(rows, util)


def test_naf_trend_requires_memorisation_lower_exposure_and_similar_accuracy():
    assert check_naf(_naf()).holds is True
    assert check_naf(_naf(scp_b=(2.5, 2.4, 2.6))).holds is False               # not clearly below CP-Δ
    assert check_naf(_naf(acc_b=0.05)).holds is False                          # bought with utility
    assert check_naf(_naf(ft=(2.0, 2.1, 1.9))).holds is None                   # nothing memorised


def test_naf_pii_trend_needs_full_extraction_first():
    def rows(fer_ft):
        out = []
        for d, ael, fer in (("finetune", 6.0, fer_ft), ("cp_delta", 3.0, 0.0), ("scp_delta_r_b", 1.0, 0.0),
                            ("scp_delta_r_c", 1.1, 0.0)):
            out += _m(d, "pii_extraction", (ael, ael + 0.1, ael - 0.1), metric="pii_ael_pos")
            out += _m(d, "pii_extraction", (fer,) * 3, metric="pii_fer_pos")
        util = [r for d in ("finetune", "cp_delta", "scp_delta_r_b", "scp_delta_r_c")
                for r in _u(d, "next_token_accuracy", (0.1,) * 3)]
        return SuiteResults(out, util)
    assert check_naf_pii(rows(0.3)).holds is True
    assert check_naf_pii(rows(0.0)).holds is None


def test_iid_ood_trend_compares_each_attack_with_a_margin():
    rows = (_m("finetune", "loss", (0.80, 0.82, 0.79), task="pile_subset:iid") +
            _m("finetune", "loss", (0.62, 0.60, 0.63), task="pile_subset:ood") +
            _m("finetune", "min_k", (0.90, 0.91, 0.89), task="pile_subset:iid") +
            _m("finetune", "min_k", (0.70, 0.72, 0.69), task="pile_subset:ood"))
    assert check_iid_ood(SuiteResults(rows, [])).holds is True
    for r in rows[9:]:
        r["value"] = 0.9  # min_k on OOD as high as on IID
    assert check_iid_ood(SuiteResults(rows, [])).holds is False


def test_verdicts_and_unknown_trends():
    assert verdict(check_dp(_dp())) == "yes"
    assert verdict(check_dp(_dp(epsinf=(0.5, 0.5, 0.5)))).startswith("inconclusive (")
    with pytest.raises(ConfigError, match="unknown trend"):
        run_trends(["nope"], store=None, cache=None)
    assert set(TRENDS) == {"dp", "dp_matched", "iid_ood", "naf_canaries", "naf_pii", "guard", "hush"}


def test_none_anchor_is_context_beside_the_numbers_never_part_of_the_rule():
    """dp and guard print `none`'s adapt AUCs (where this world's chance sits for these seeds) when the run has
    them; the verdict is the same with or without them."""
    r = _dp(eps1=(0.57, 0.56, 0.58))
    bare = check_dp(r)
    assert "none" not in bare.numbers
    r.metrics += [row for a in MIA for row in _m("none", a, (0.57, 0.55, 0.59))]
    with_none = check_dp(r)
    assert "none (θ′ = θ, this world's chance) loss 0.570±0.012" in with_none.numbers
    assert with_none.holds == bare.holds
    g = _guard()
    plain = check_guard(g)
    g.metrics += [row for a in MIA for row in _m("none", a, (0.50, 0.49, 0.51))]
    assert "reference 0.500±0.006" in check_guard(g).numbers and check_guard(g).holds == plain.holds
