"""Tests for bench.metrics (checked against scikit-learn and hand/brute-force computations)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from sklearn.metrics import roc_auc_score, roc_curve

from bench.errors import MetricError
from bench.metrics import (
    MetricRow,
    _stratified_resamples,
    bootstrap_auc_ci,
    bootstrap_tpr_ci,
    clopper_pearson,
    membership_metrics,
    metric_name_for_fpr,
    roc_auc,
    roc_curve_points,
    tpr_at_fpr,
    validate_scores,
)


def _data(n: int, shift: float = 0.5, seed: int = 0, decimals: int | None = None):
    rng = np.random.default_rng(seed)
    y = rng.integers(0, 2, size=n)
    y[:2] = [0, 1]
    s = rng.normal(size=n) + shift * y
    if decimals is not None:
        s = np.round(s, decimals)
    return y, s


def _brute_tpr_at_fpr(y, s, target):
    """Independent reference: try every threshold in unique(s) ∪ {inf} with the >= rule."""
    y = np.asarray(y)
    s = np.asarray(s, dtype=float)
    n_pos, n_neg = (y == 1).sum(), (y == 0).sum()
    best = (0.0, 0.0, math.inf)
    for t in list(np.unique(s)) + [math.inf]:
        pred = s >= t
        fpr = (pred & (y == 0)).sum() / n_neg
        tpr = (pred & (y == 1)).sum() / n_pos
        if fpr <= target + 1e-12 and tpr > best[0]:
            best = (tpr, fpr, t)
    return best


# ---------------------------------------------------------------- roc_auc


@pytest.mark.parametrize("seed", range(5))
def test_auc_matches_sklearn_random(seed):
    y, s = _data(500, seed=seed)
    assert roc_auc(y, s) == pytest.approx(roc_auc_score(y, s), abs=1e-12)


@pytest.mark.parametrize("seed", range(5))
def test_auc_matches_sklearn_heavy_ties(seed):
    y, s = _data(800, seed=seed, decimals=1)
    assert len(np.unique(s)) < 100  # really tie-heavy
    assert roc_auc(y, s) == pytest.approx(roc_auc_score(y, s), abs=1e-12)


def test_auc_all_equal_is_half():
    y = [0, 1, 0, 1, 1]
    s = [3.0] * 5
    assert roc_auc(y, s) == 0.5 == roc_auc_score(y, s)


def test_auc_separated_and_inverted():
    y = np.array([0, 0, 0, 1, 1])
    s = np.array([0.1, 0.2, 0.3, 0.8, 0.9])
    assert roc_auc(y, s) == 1.0
    assert roc_auc(y, -s) == 0.0
    assert roc_auc_score(y, -s) == 0.0


def test_auc_hand_case_with_ties():
    # pos {0.9, 0.5}, neg {0.5, 0.1}; pairs: (0.9>0.5)=1, (0.9>0.1)=1, (0.5=0.5)=1/2, (0.5>0.1)=1
    # -> (1 + 1 + 0.5 + 1) / 4 = 0.875
    assert roc_auc([1, 1, 0, 0], [0.9, 0.5, 0.5, 0.1]) == pytest.approx(0.875, abs=1e-15)


def test_auc_on_large_input_equals_scikit_learn():
    """200,000 samples (an O(n^2) pair count would not finish; its speed is in docs/benchmarks.md, not timed here)."""
    from sklearn.metrics import roc_auc_score
    y, s = _data(200_000, seed=1)
    assert roc_auc(y, s) == pytest.approx(roc_auc_score(y, s), abs=1e-12)


# ---------------------------------------------------------------- roc_curve_points


@pytest.mark.parametrize("decimals", [None, 1])
def test_roc_points_match_sklearn(decimals):
    y, s = _data(300, seed=3, decimals=decimals)
    fpr, tpr, thr = roc_curve_points(y, s)
    sk_fpr, sk_tpr, _ = roc_curve(y, s, drop_intermediate=False)
    ours = set(zip(np.round(fpr, 12), np.round(tpr, 12)))
    theirs = set(zip(np.round(sk_fpr, 12), np.round(sk_tpr, 12)))
    assert ours == theirs
    assert len(fpr) == len(np.unique(s)) + 1  # one per distinct score plus (0, 0)
    assert np.all(np.diff(fpr) >= 0) and np.all(np.diff(tpr) >= 0)
    assert (fpr[0], tpr[0], thr[0]) == (0.0, 0.0, math.inf)
    assert (fpr[-1], tpr[-1]) == (1.0, 1.0)


def test_roc_points_threshold_rule_is_ge():
    y = np.array([1, 1, 0, 0])
    s = np.array([0.9, 0.5, 0.5, 0.1])
    fpr, tpr, thr = roc_curve_points(y, s)
    for f, t, th in zip(fpr, tpr, thr):
        pred = s >= th
        assert f == (pred & (y == 0)).sum() / 2
        assert t == (pred & (y == 1)).sum() / 2
    # the 0.5 tie switches as one block: (0, .5) -> (.5, 1), never (0, 1)
    assert list(zip(fpr, tpr)) == [(0, 0), (0, 0.5), (0.5, 1.0), (1.0, 1.0)]


# ---------------------------------------------------------------- tpr_at_fpr


def test_tpr_at_fpr_le_rule_allows_exactly_target():
    # 10 negatives, 5 positives; target 0.1 allows exactly one false positive.
    neg = [0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.95]
    pos = [0.99, 0.98, 0.9, 0.85, 0.05]
    y = [0] * 10 + [1] * 5
    s = neg + pos
    # threshold 0.85 -> 1 FP (0.95), 4 TP: fpr 0.1 <= 0.1 qualifies
    assert tpr_at_fpr(y, s, 0.1) == (0.8, 0.1, 0.85)
    # just below 0.1, no FP allowed: only 0.99, 0.98 above the top negative
    assert tpr_at_fpr(y, s, 0.0999) == (0.4, 0.0, 0.98)


def test_tpr_at_fpr_tie_block_not_split():
    # positives 1.0, 0.5, 0.5 ; negatives 0.5, 0.5, 0.0, 0.0 -> tie block at 0.5 has 2 pos + 2 neg
    y = [1, 1, 1, 0, 0, 0, 0]
    s = [1.0, 0.5, 0.5, 0.5, 0.5, 0.0, 0.0]
    # the block adds fpr 0.5 at once; target 0.25 cannot take "half" the block
    assert tpr_at_fpr(y, s, 0.25) == pytest.approx((1 / 3, 0.0, 1.0))
    assert tpr_at_fpr(y, s, 0.5) == pytest.approx((1.0, 0.5, 0.5))


def test_tpr_at_fpr_nothing_qualifies():
    y = [0, 1, 0, 1]
    s = [0.9, 0.1, 0.8, 0.2]  # top score is a negative
    assert tpr_at_fpr(y, s, 0.1) == (0.0, 0.0, math.inf)


@pytest.mark.parametrize("bad", [0.0, 1.0, -0.1, 1.5])
def test_tpr_at_fpr_rejects_bad_target(bad):
    with pytest.raises(MetricError):
        tpr_at_fpr([0, 1], [0.0, 1.0], bad)


def test_tpr_at_fpr_matches_brute_force():
    rng = np.random.default_rng(42)
    for _ in range(50):
        n = int(rng.integers(10, 120))
        y = rng.integers(0, 2, size=n)
        y[:2] = [0, 1]
        s = np.round(rng.normal(size=n) + y, 1)  # tie-heavy
        target = float(rng.choice([0.01, 0.05, 0.1, 0.2, 0.25, 0.5, rng.uniform(0.001, 0.9)]))
        got = tpr_at_fpr(y, s, target)
        want = _brute_tpr_at_fpr(y, s, target)
        assert got[0] == pytest.approx(want[0], abs=1e-12)
        assert got[1] == pytest.approx(want[1], abs=1e-12)
        assert got[1] <= target + 1e-12


# ---------------------------------------------------------------- bootstrap_auc_ci


def test_bootstrap_brackets_point_and_is_deterministic():
    y, s = _data(400, seed=5)
    lo, hi = bootstrap_auc_ci(y, s, n_boot=500, seed=7)
    auc = roc_auc(y, s)
    assert lo < auc < hi
    assert bootstrap_auc_ci(y, s, n_boot=500, seed=7) == (lo, hi)
    assert bootstrap_auc_ci(y, s, n_boot=500, seed=8) != (lo, hi)


def test_bootstrap_brackets_with_ties_and_below_half():
    y, s = _data(400, shift=-0.4, seed=6, decimals=1)  # AUC < 0.5: catches a 1-AUC bug
    auc = roc_auc(y, s)
    assert auc < 0.45
    lo, hi = bootstrap_auc_ci(y, s, n_boot=500)
    assert lo <= auc <= hi


def test_bootstrap_width_shrinks_with_n():
    widths = []
    for n in (100, 1000, 10000):
        y, s = _data(n, seed=9)
        lo, hi = bootstrap_auc_ci(y, s, n_boot=300)
        widths.append(hi - lo)
    assert widths[0] > widths[1] > widths[2]


def test_bootstrap_separated_data_near_one():
    y, s = _data(500, shift=6.0, seed=2)
    lo, hi = bootstrap_auc_ci(y, s, n_boot=300)
    assert lo > 0.99 and hi <= 1.0


def test_bootstrap_mean_matches_point_estimate_independent():
    # Independent loop-based stratified bootstrap using sklearn; its mean must sit near the
    # point AUC (not 1-AUC), and its percentiles near ours.
    y, s = _data(300, shift=0.8, seed=11)
    pos, neg = s[y == 1], s[y == 0]
    rng = np.random.default_rng(0)
    aucs = []
    for _ in range(300):
        p = rng.choice(pos, size=len(pos), replace=True)
        q = rng.choice(neg, size=len(neg), replace=True)
        aucs.append(roc_auc_score(np.r_[np.ones(len(p)), np.zeros(len(q))], np.r_[p, q]))
    auc = roc_auc(y, s)
    assert auc > 0.65
    assert np.mean(aucs) == pytest.approx(auc, abs=0.01)
    lo, hi = bootstrap_auc_ci(y, s, n_boot=1000)
    ref_lo, ref_hi = np.quantile(aucs, [0.025, 0.975])
    assert lo == pytest.approx(ref_lo, abs=0.02) and hi == pytest.approx(ref_hi, abs=0.02)
    assert (lo + hi) / 2 == pytest.approx(auc, abs=0.02)


def test_bootstrap_width_matches_delong():
    # Resampling both classes gives a CI about as wide as DeLong's normal interval; a bootstrap
    # that forgot to resample one class would be clearly narrower (~0.7x here).
    y, s = _data(2000, shift=0.8, seed=12)
    pos, neg = s[y == 1], s[y == 0]
    psi = (pos[:, None] > neg[None, :]) + 0.5 * (pos[:, None] == neg[None, :])
    se = np.sqrt(psi.mean(1).var(ddof=1) / len(pos) + psi.mean(0).var(ddof=1) / len(neg))
    lo, hi = bootstrap_auc_ci(y, s, n_boot=1000)
    assert (hi - lo) / (2 * 1.959964 * se) == pytest.approx(1.0, abs=0.12)


def test_bootstrap_on_a_large_world_is_seeded_and_brackets_the_auc():
    y, s = _data(2000, seed=4)
    lo, hi = bootstrap_auc_ci(y, s, n_boot=1000, seed=3)
    assert (lo, hi) == bootstrap_auc_ci(y, s, n_boot=1000, seed=3) and lo < roc_auc(y, s) < hi


def test_bootstrap_rejects_bad_args():
    with pytest.raises(MetricError):
        bootstrap_auc_ci([0, 1], [0.0, 1.0], n_boot=0)
    with pytest.raises(MetricError):
        bootstrap_auc_ci([0, 1], [0.0, 1.0], alpha=1.5)


# ---------------------------------------------------------------- bootstrap_tpr_ci


def _reference_tpr_ci(y, s, fprs, n_boot, alpha, seed):
    """Slow reference: per resample, call tpr_at_fpr on the resampled arrays (same resample indices)."""
    pos, neg = s[y == 1], np.sort(s[y == 0])
    vals = []
    for pi, ni in _stratified_resamples(len(pos), len(neg), n_boot, seed):
        for p_idx, n_idx in zip(pi, ni):
            yy = np.r_[np.ones(len(p_idx), dtype=int), np.zeros(len(n_idx), dtype=int)]
            ss = np.r_[pos[p_idx], neg[n_idx]]
            vals.append([tpr_at_fpr(yy, ss, f)[0] for f in fprs])
    vals = np.array(vals)
    assert vals.shape == (n_boot, len(fprs))
    q = np.quantile(vals, [alpha / 2, 1 - alpha / 2], axis=0)
    return [(float(q[0, j]), float(q[1, j])) for j in range(len(fprs))], vals


@pytest.mark.parametrize("decimals, n_neg", [(None, 120), (1, 120), (0, 60), (1, 7)])
def test_bootstrap_tpr_equals_reference_loop(decimals, n_neg):
    from bench.metrics import _bootstrap_tpr_values

    rng = np.random.default_rng(21)
    y = np.r_[np.ones(90, dtype=int), np.zeros(n_neg, dtype=int)]
    s = rng.normal(size=len(y)) + 0.8 * y
    if decimals is not None:
        s = np.round(s, decimals)
    fprs = [0.001, 0.01, 0.05, 0.1, 1 / 3, 0.5]  # 1/3: an exact k/n target for n_neg divisible by 3
    want, want_vals = _reference_tpr_ci(y, s, fprs, n_boot=150, alpha=0.1, seed=4)
    got_vals = _bootstrap_tpr_values(y, s, fprs, 150, 4)
    np.testing.assert_array_equal(got_vals, want_vals)  # every resample, exactly
    assert bootstrap_tpr_ci(y, s, fprs, n_boot=150, alpha=0.1, seed=4) == want
    if decimals is not None and n_neg >= 60:
        assert len(np.unique(s)) < len(s) / 3  # really tie-heavy, ties between members and non-members
        assert np.isin(s[y == 1], s[y == 0]).mean() > 0.5
    assert len(np.unique(want_vals[:, 2])) > 3  # the resamples differ: the check is not vacuous


@pytest.mark.parametrize("seed", range(3))
def test_bootstrap_tpr_contains_point_estimate(seed):
    y, s = _data(600, shift=1.0, seed=seed)
    fprs = (0.01, 0.05, 0.1)
    cis = bootstrap_tpr_ci(y, s, fprs, n_boot=1000, seed=seed)
    for f, (lo, hi) in zip(fprs, cis):
        tpr = tpr_at_fpr(y, s, f)[0]
        assert lo < tpr < hi
        assert 0.0 <= lo < hi <= 1.0


def test_bootstrap_tpr_wider_than_clopper_pearson_with_few_negatives():
    # 300 members, 30 non-members: the threshold at 5% FPR (one false positive) rests on the top two
    # non-members, whose sampling error a binomial interval on the members ignores.
    rng = np.random.default_rng(5)
    y = np.r_[np.ones(300, dtype=int), np.zeros(30, dtype=int)]
    s = rng.normal(size=len(y)) + 1.0 * y
    tpr = tpr_at_fpr(y, s, 0.05)[0]
    cp_lo, cp_hi = clopper_pearson(round(tpr * 300), 300)
    (lo, hi), = bootstrap_tpr_ci(y, s, [0.05], n_boot=1000, seed=0)
    assert 0.05 < tpr < 0.95
    assert hi - lo > 1.5 * (cp_hi - cp_lo)
    row = {r.metric: r for r in membership_metrics(y, s, fprs=(0.05,), n_boot=1000)}["tpr@5%fpr"]
    assert (row.ci_low, row.ci_high) == (lo, hi)


def test_bootstrap_tpr_is_seeded():
    y, s = _data(400, seed=8, decimals=1)
    a = bootstrap_tpr_ci(y, s, [0.01, 0.05], n_boot=300, seed=3)
    assert bootstrap_tpr_ci(y, s, [0.01, 0.05], n_boot=300, seed=3) == a
    assert bootstrap_tpr_ci(y, s, [0.01, 0.05], n_boot=300, seed=4) != a
    # one fpr at a time gives the same interval as all together (same resamples)
    assert bootstrap_tpr_ci(y, s, [0.05], n_boot=300, seed=3) == [a[1]]


def test_bootstrap_tpr_rejects_bad_args():
    with pytest.raises(MetricError, match="outside"):
        bootstrap_tpr_ci([0, 1], [0.0, 1.0], [0.0])
    with pytest.raises(MetricError, match="no target FPR"):
        bootstrap_tpr_ci([0, 1], [0.0, 1.0], [])
    with pytest.raises(MetricError, match="n_boot"):
        bootstrap_tpr_ci([0, 1], [0.0, 1.0], [0.1], n_boot=0)


# ---------------------------------------------------------------- clopper_pearson


def test_clopper_pearson_known_values():
    lo, hi = clopper_pearson(0, 10)
    assert lo == 0.0
    assert hi == pytest.approx(1 - 0.025 ** (1 / 10), abs=1e-10)
    assert hi == pytest.approx(0.3085, abs=1e-4)
    lo, hi = clopper_pearson(10, 10)
    assert hi == 1.0 and lo == pytest.approx(0.025 ** (1 / 10), abs=1e-10)
    lo, hi = clopper_pearson(5, 10)
    assert lo == pytest.approx(0.1871, abs=1e-4) and hi == pytest.approx(0.8129, abs=1e-4)


def test_clopper_pearson_errors():
    with pytest.raises(MetricError):
        clopper_pearson(0, 0)
    with pytest.raises(MetricError):
        clopper_pearson(11, 10)


# ---------------------------------------------------------------- membership_metrics


@pytest.mark.parametrize(
    "f, name", [(0.001, "tpr@0.1%fpr"), (0.01, "tpr@1%fpr"), (0.05, "tpr@5%fpr"), (0.0025, "tpr@0.25%fpr")]
)
def test_metric_name_for_fpr(f, name):
    assert metric_name_for_fpr(f) == name


def test_membership_metrics_rows():
    rng = np.random.default_rng(3)
    y = np.r_[np.ones(150, dtype=int), np.zeros(100, dtype=int)]
    s = rng.normal(size=250) + y
    rows = membership_metrics(y, s, n_boot=200)
    assert all(isinstance(r, MetricRow) for r in rows)
    assert [r.metric for r in rows] == ["auc", "tpr@0.1%fpr", "tpr@1%fpr", "tpr@5%fpr"]
    assert all((r.n_pos, r.n_neg) == (150, 100) for r in rows)
    by = {r.metric: r for r in rows}
    assert by["auc"].value == pytest.approx(roc_auc_score(y, s), abs=1e-12)
    assert by["auc"].ci_low <= by["auc"].value <= by["auc"].ci_high
    assert by["tpr@0.1%fpr"].flag == "fpr_below_resolution"  # 0.001 < 1/100
    assert by["tpr@1%fpr"].flag is None  # 0.01 == 1/100 is measurable
    assert by["tpr@5%fpr"].flag is None
    # TPR intervals: the joint stratified bootstrap with the same seed and n_boot (not Clopper-Pearson)
    cis = bootstrap_tpr_ci(y, s, (0.001, 0.01, 0.05), n_boot=200, seed=0)
    for f, ci in zip((0.001, 0.01, 0.05), cis):
        r = by[metric_name_for_fpr(f)]
        assert r.value == tpr_at_fpr(y, s, f)[0]
        assert (r.ci_low, r.ci_high) == ci
        assert r.ci_low <= r.value <= r.ci_high


@pytest.mark.parametrize(
    "labels, scores, needle",
    [
        ([0, 1, 0], [0.1, float("nan"), 0.3], "finite"),
        ([0, 1, 0], [0.1, float("inf"), 0.3], "finite"),
        ([1, 1, 1], [0.1, 0.2, 0.3], "one class"),
        ([0, 1, 0], [0.1, 0.2], "3 labels but 2 scores"),
        ([], [], "no samples"),
        ([0, 2, 1], [0.1, 0.2, 0.3], "0 (non-member) or 1"),
    ],
)
def test_membership_metrics_errors(labels, scores, needle):
    with pytest.raises(MetricError, match=needle.replace("(", r"\(").replace(")", r"\)")) as exc:
        membership_metrics(labels, scores)
    assert "\n" not in str(exc.value)


def test_validate_scores_types_and_nan_count():
    y, s = validate_scores([True, False], [1, 2])
    assert y.dtype.kind == "i" and s.dtype == np.float64
    assert y.tolist() == [1, 0]
    with pytest.raises(MetricError, match="2 of 4 scores"):
        validate_scores([0, 1, 0, 1], [np.nan, 1.0, np.inf, 0.0])
