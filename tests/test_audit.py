"""Tests for bench.audit: ε lower bounds checked against hand computations, brute-force references and
simulated mechanisms whose true ε is known (validity: the bound rarely exceeds it; power: it is positive)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy.optimize import brentq
from scipy.special import expit
from scipy.stats import beta, binom, norm

from bench.audit import (
    best_one_run_audit,
    claim_check,
    epsilon_lower_bound,
    one_run_audit,
    one_run_epsilon_lb,
    one_run_guesses,
    one_run_p_value,
    roc_epsilon_row,
    roc_metric_name,
)
from bench.errors import MetricError


def _mc_ceiling(p: float, n: int, z: float = 3.0) -> float:
    """Largest Monte Carlo frequency consistent with a true rate p over n runs (p + z standard errors).

    Why slack: a valid procedure guarantees P(ε_lb > ε) <= 1 − confidence; a tight mechanism reaches it,
    so over 200 seeds the observed frequency is Binomial(200, ~0.05)/200 and exceeds 0.05 about half the time.
    """
    return p + z * math.sqrt(p * (1.0 - p) / n)


# ------------------------------------------------------------------- brute-force reference (independent)


def _ref_epsilon_lb(y, s, delta, confidence):
    """Loop over every threshold with explicit counts; Clopper–Pearson straight from scipy.stats.beta."""
    y = np.asarray(y)
    s = np.asarray(s, dtype=float)
    n_pos, n_neg = int((y == 1).sum()), int((y == 0).sum())
    a = (1 - confidence) / (2 * (n_pos + n_neg))

    def lo(k, n):
        return 0.0 if k == 0 else float(beta.ppf(a, k, n - k + 1))

    def hi(k, n):
        return 1.0 if k == n else float(beta.ppf(1 - a, k + 1, n - k))

    best, best_t = 0.0, None
    for t in np.unique(s):
        pred = s >= t
        tp = int((pred & (y == 1)).sum())
        fp = int((pred & (y == 0)).sum())
        cands = []
        if lo(tp, n_pos) - delta > 0:
            cands.append(math.log((lo(tp, n_pos) - delta) / hi(fp, n_neg)))
        if lo(n_neg - fp, n_neg) - delta > 0:
            cands.append(math.log((lo(n_neg - fp, n_neg) - delta) / hi(n_pos - tp, n_pos)))
        if cands and max(cands) > best:
            best, best_t = max(cands), float(t)
    return best, best_t


def _gaussian_delta(mu: float, eps: float) -> float:
    """Exact δ(ε) of the Gaussian mechanism N(μ,1) vs N(0,1) (Balle and Wang 2018, "Improving the Gaussian
    mechanism for differential privacy: analytical calibration and optimal denoising", Theorem 8)."""
    return norm.cdf(mu / 2 - eps / mu) - math.exp(eps) * norm.cdf(-mu / 2 - eps / mu)


# --------------------------------------------------------------------------- epsilon_lower_bound


def test_perfect_separation_matches_hand_computation():
    n = 1000
    y = np.r_[np.ones(n, int), np.zeros(n, int)]
    s = np.r_[10.0 + np.arange(n), -np.arange(n, dtype=float)]
    res = epsilon_lower_bound(y, s, delta=1e-5, confidence=0.95)
    a = 0.05 / (2 * 2 * n)  # Bonferroni over 2 (n_pos + n_neg) one-sided bounds
    tpr_lo = beta.ppf(a, n, 1)  # all n members above the threshold
    fpr_hi = beta.ppf(1 - a, 1, n)  # no non-member above it
    expected = math.log((tpr_lo - 1e-5) / fpr_hi)
    assert expected == pytest.approx(4.4782, abs=1e-3)  # the number itself, as a sanity anchor
    assert res["epsilon_lb"] == pytest.approx(expected, rel=1e-9)
    assert res["tpr_lo"] == pytest.approx(a ** (1 / n), rel=1e-9)  # closed form of the same bound
    assert res["fpr_hi"] == pytest.approx(1 - a ** (1 / n), rel=1e-9)
    assert res["threshold"] == 10.0  # lowest member score: predict member iff score >= 10
    assert res["correction"] == "bonferroni" and res["k_thresholds"] == 2 * n
    assert res["alpha_per_bound"] == pytest.approx(a)
    assert (res["n_pos"], res["n_neg"], res["delta"], res["confidence"]) == (n, n, 1e-5, 0.95)


@pytest.mark.parametrize("seed", range(6))
def test_matches_brute_force_reference_with_ties(seed):
    rng = np.random.default_rng(seed)
    n = 150
    y = rng.integers(0, 2, n)
    y[:2] = [0, 1]
    s = np.round(rng.normal(size=n) + 2.5 * y, 1)  # rounding creates tie blocks mixing both classes
    delta = [0.0, 1e-5, 0.01][seed % 3]
    conf = [0.95, 0.8][seed % 2]
    ref, ref_t = _ref_epsilon_lb(y, s, delta, conf)
    res = epsilon_lower_bound(y, s, delta=delta, confidence=conf)
    assert ref > 0.5  # the data leak, so the comparison is not trivially 0 == 0
    assert res["epsilon_lb"] == pytest.approx(ref, rel=1e-7)
    assert res["threshold"] == ref_t


def test_nonmember_side_and_label_symmetry():
    """Half the non-members score far below everyone: only "predict non-member" rules are confident."""
    rng = np.random.default_rng(1)
    n = 2000
    y = np.r_[np.ones(n, int), np.zeros(n, int)]
    neg = rng.normal(size=n)
    neg[: n // 2] -= 20.0
    s = np.r_[rng.normal(size=n), neg]
    res = epsilon_lower_bound(y, s, delta=1e-5)
    assert res["side"] == "non-member"
    # the member side can show at most log(TPR/FPR) <= log(1/0.5): the bound must come from the other side
    assert res["epsilon_lb"] > 2 * math.log(2.0)
    # relabelling members <-> non-members and negating the scores swaps the two forms: same bound
    flipped = epsilon_lower_bound(1 - y, -s, delta=1e-5)
    assert flipped["side"] == "member"
    assert flipped["epsilon_lb"] == pytest.approx(res["epsilon_lb"], rel=1e-9)


def test_pure_noise_false_positive_rate():
    """Validity: with no leak (ε = 0) a positive bound is a false claim; it may happen in <= 5% of games."""
    n_seeds, conf = 200, 0.95
    lbs = []
    for seed in range(n_seeds):
        rng = np.random.default_rng(seed)
        y = rng.integers(0, 2, 400)
        y[:2] = [0, 1]
        lbs.append(epsilon_lower_bound(y, rng.normal(size=400), delta=1e-5, confidence=conf)["epsilon_lb"])
    lbs = np.array(lbs)
    assert (lbs > 0).mean() <= _mc_ceiling(1 - conf, n_seeds)
    assert (lbs < 0.3).mean() >= 0.99


def test_randomized_response_validity_and_power():
    """ε = 2 randomized response is exactly (2, 0)-DP and the tightest mechanism at that ε."""
    eps, n = 2.0, 5000
    keep = math.exp(eps) / (1 + math.exp(eps))
    y = np.r_[np.ones(n, int), np.zeros(n, int)]
    lbs = []
    for seed in range(50):
        rng = np.random.default_rng(seed)
        out = np.where(rng.random(2 * n) < keep, y, 1 - y)  # the released bit is the score
        lbs.append(epsilon_lower_bound(y, out, delta=1e-5)["epsilon_lb"])
    lbs = np.array(lbs)
    assert lbs.max() <= eps  # validity in every seed
    assert lbs.min() > 1.5  # power: 10^4 trials certify most of ε = 2


def test_gaussian_mechanism_validity_and_power():
    eps, delta = 2.0, 1e-5
    mu = brentq(lambda m: _gaussian_delta(m, eps) - delta, 0.05, 10.0)  # members ~ N(mu,1): exactly (2, 1e-5)-DP
    assert _gaussian_delta(mu, eps) == pytest.approx(delta, rel=1e-6)
    assert 0.45 < mu < 0.55
    n = 2000
    y = np.r_[np.ones(n, int), np.zeros(n, int)]
    lbs = []
    for seed in range(50):
        rng = np.random.default_rng(seed)
        lbs.append(epsilon_lower_bound(y, rng.normal(size=2 * n) + mu * y, delta=delta)["epsilon_lb"])
    assert max(lbs) <= eps
    big = 20000
    yb = np.r_[np.ones(big, int), np.zeros(big, int)]
    res = epsilon_lower_bound(yb, np.random.default_rng(7).normal(size=2 * big) + mu * yb, delta=delta)
    assert 0.3 < res["epsilon_lb"] <= eps


@pytest.mark.parametrize(
    "labels, scores, kwargs, match",
    [
        ([1, 1, 1], [0.1, 0.2, 0.3], {"delta": 1e-5}, "only one class"),
        ([0, 1, 1], [0.1, float("nan"), 0.3], {"delta": 1e-5}, "NaN or infinite"),
        ([0, 1, 1], [0.1, float("inf"), 0.3], {"delta": 1e-5}, "NaN or infinite"),
        ([0, 1], [0.1, 0.2, 0.3], {"delta": 1e-5}, "exactly one score"),
        ([0, 1], [0.1, 0.2], {"delta": 1.0}, r"outside \[0, 1\)"),
        ([0, 1], [0.1, 0.2], {"delta": -1e-5}, r"outside \[0, 1\)"),
        ([0, 1], [0.1, 0.2], {"delta": float("nan")}, r"outside \[0, 1\)"),
        ([0, 1], [0.1, 0.2], {"delta": 1e-5, "confidence": 1.0}, r"outside \(0, 1\)"),
        ([0, 1], [0.1, 0.2], {"delta": 1e-5, "confidence": 0.0}, r"outside \(0, 1\)"),
    ],
)
def test_epsilon_lower_bound_validation(labels, scores, kwargs, match):
    with pytest.raises(MetricError, match=match):
        epsilon_lower_bound(labels, scores, **kwargs)


# --------------------------------------------------------------------------------- one-run audit


def test_one_run_guesses_extremes_and_ties():
    g = one_run_guesses([5.0, 4.0, 3.0, 2.0, 1.0, 0.0], 2, 1)
    assert g.tolist() == [1, 1, 0, 0, 0, -1]
    # a tie block straddling the "in" cut is not guessed at all; one that fits is guessed whole
    assert one_run_guesses([3.0, 3.0, 2.0, 1.0], 1, 0).tolist() == [0, 0, 0, 0]
    assert one_run_guesses([3.0, 3.0, 2.0, 1.0], 2, 1).tolist() == [1, 1, 0, -1]
    assert one_run_guesses([3.0, 1.0, 1.0, 1.0], 1, 2).tolist() == [1, 0, 0, 0]
    # random tie-breaking makes exactly k_plus / k_minus guesses
    g = one_run_guesses(np.zeros(100), 30, 20, seed=0)
    assert ((g == 1).sum(), (g == -1).sum()) == (30, 20)


def test_tie_breaking_does_not_leak_the_input_order():
    """All scores tied and members listed first: a positional tie-break would guess every member right."""
    m = 1000
    y = np.r_[np.ones(m // 2, int), np.zeros(m // 2, int)]
    s = np.zeros(m)
    assert one_run_audit(y, s, k_plus=100, k_minus=100, delta=0.0)["n_guesses_made"] == 0
    precisions = []
    for seed in range(50):
        res = one_run_audit(y, s, k_plus=100, k_minus=100, delta=0.0, seed=seed)
        assert res["n_guesses_made"] == 200
        precisions.append(res["n_correct"] / 200)
    assert abs(np.mean(precisions) - 0.5) < 0.02  # SE of the mean ≈ 0.005; positional order would give 1.0


@pytest.mark.parametrize(
    "v, r, conf", [(60, 100, 0.95), (150, 200, 0.95), (731, 1000, 0.95), (90, 100, 0.99), (7, 7, 0.9)]
)
def test_one_run_epsilon_lb_pure_dp_brute_force(v, r, conf):
    eps = one_run_epsilon_lb(v, r, confidence=conf)
    alpha = 1 - conf
    assert eps > 0
    assert binom.sf(v - 1, r, expit(eps)) <= alpha  # rejected at the returned ε ...
    assert binom.sf(v - 1, r, expit(eps + 1e-6)) > alpha  # ... but not just above it
    assert binom.sf(v - 1, r, math.exp(eps) / (1 + math.exp(eps))) == pytest.approx(alpha, rel=1e-4)
    root = brentq(lambda e: binom.sf(v - 1, r, expit(e)) - alpha, 0.0, 30.0, xtol=1e-12)
    assert eps == pytest.approx(root, abs=1e-7)


def test_one_run_epsilon_lb_zero_when_not_significant():
    assert binom.sf(54, 100, 0.5) > 0.05
    assert one_run_epsilon_lb(55, 100) == 0.0
    assert one_run_epsilon_lb(0, 10) == 0.0


def _paper_p_value(m, r, v, eps, delta):
    """Steinke, Nasr and Jagielski 2023's bound written as their loop, independently of bench.audit."""
    q = 1 / (1 + math.exp(-eps))
    p = binom.sf(v - 1, r, q)
    best, acc = 0.0, 0.0
    for i in range(1, v + 1):
        acc += binom.pmf(v - i, r, q)
        best = max(best, acc / i)
    return min(1.0, p + 2 * m * delta * best)


@pytest.mark.parametrize("m, r, v, eps, delta", [(1000, 200, 130, 0.5, 1e-5), (5000, 1000, 760, 1.0, 1e-6),
                                                 (100, 50, 45, 2.0, 1e-3), (300, 300, 150, 0.0, 1e-4)])
def test_one_run_p_value_matches_paper_formula(m, r, v, eps, delta):
    assert one_run_p_value(v, r, eps, delta=delta, n_canaries=m) == pytest.approx(
        _paper_p_value(m, r, v, eps, delta), rel=1e-9
    )


def test_one_run_epsilon_lb_with_delta():
    m, r, v = 5000, 1000, 780
    e0 = one_run_epsilon_lb(v, r)
    e1 = one_run_epsilon_lb(v, r, delta=1e-5, n_canaries=m)
    e2 = one_run_epsilon_lb(v, r, delta=1e-4, n_canaries=m)
    assert 0 < e2 < e1 < e0  # the δ term only adds to the p-value, so the bound shrinks with δ
    p = lambda e: _paper_p_value(m, r, v, e, 1e-5)  # noqa: E731
    assert p(e1) <= 0.05 < p(e1 + 1e-6)
    with pytest.raises(MetricError, match="n_canaries"):
        one_run_epsilon_lb(v, r, delta=1e-5)


def test_one_run_null_validity():
    """ε = 0: coin-flip inclusion, scores independent of labels; m = 1000 canaries, 100 + 100 guesses."""
    n_seeds, conf = 200, 0.95
    lbs = []
    for seed in range(n_seeds):
        rng = np.random.default_rng(seed)
        y = rng.integers(0, 2, 1000)
        lbs.append(one_run_audit(y, rng.normal(size=1000), k_plus=100, k_minus=100, delta=0.0)["epsilon_lb"])
    lbs = np.array(lbs)
    assert (lbs == 0).mean() >= 1 - _mc_ceiling(1 - conf, n_seeds)
    # exact size of the test: here the number correct is exactly Binomial(200, 1/2)
    r = 200
    size = sum(binom.pmf(v, r, 0.5) for v in range(r // 2, r + 1) if one_run_epsilon_lb(v, r) > 0)
    assert 0.02 < size <= 1 - conf  # valid, and not vacuously conservative


def test_one_run_randomized_response():
    """Randomized response with ε = 1 on every canary: exactly 1-DP, and the binomial bound is tight for it."""
    eps, m, k, n_seeds, conf = 1.0, 5000, 500, 200, 0.95
    keep = math.exp(eps) / (1 + math.exp(eps))
    lbs = []
    for seed in range(n_seeds):
        rng = np.random.default_rng(seed)
        y = rng.integers(0, 2, m)
        out = np.where(rng.random(m) < keep, y, 1 - y)
        res = one_run_audit(y, out, k_plus=k, k_minus=k, delta=0.0, confidence=conf, seed=10**6 + seed)
        assert res["n_guesses"] == res["n_guesses_made"] == 2 * k
        lbs.append(res["epsilon_lb"])
    lbs = np.array(lbs)
    assert (lbs <= eps).mean() >= 1 - _mc_ceiling(1 - conf, n_seeds)
    assert lbs.mean() > 0.6  # power; the expected bound is about 0.88
    # exact size: the number correct is Binomial(1000, e/(1+e)); P(ε_lb > 1) must be <= 5%
    r = 2 * k
    size = sum(binom.pmf(v, r, keep) for v in range(int(r * keep), r + 1) if one_run_epsilon_lb(v, r) > eps)
    assert 0.03 < size <= 1 - conf


def test_one_run_audit_counts_by_hand():
    y = [1, 1, 0, 1, 0, 0, 1, 0]
    s = [9.0, 8.0, 7.0, 6.0, 5.0, 4.0, 3.0, 2.0]  # in: 9, 8, 7 (2 right); out: 3, 2 (1 right)
    res = one_run_audit(y, s, k_plus=3, k_minus=2, delta=0.0)
    assert (res["n_correct_plus"], res["n_correct_minus"], res["n_correct"]) == (2, 1, 3)
    assert (res["n_guesses"], res["n_guesses_made"], res["n_canaries"]) == (5, 5, 8)
    assert res["epsilon_lb"] == 0.0
    # ties shrink the guesses made, never the r used in the bound
    tied = one_run_audit(y, [9.0, 8.0, 8.0, 8.0, 5.0, 4.0, 3.0, 2.0], k_plus=3, k_minus=2, delta=0.0)
    assert (tied["n_guesses"], tied["n_guesses_made"]) == (5, 3)


def test_best_one_run_audit_is_bonferroni_over_grid():
    rng = np.random.default_rng(3)
    m = 4000
    y = rng.integers(0, 2, m)
    s = rng.normal(size=m) + 1.5 * y
    grid = [(100, 100), (300, 0), (0, 300), (500, 500), (100, 100)]  # one duplicate
    best = best_one_run_audit(y, s, delta=1e-6, confidence=0.95, grid=grid)
    assert best["grid_size"] == 4 and best["correction"] == "bonferroni"
    assert best["confidence_each"] == pytest.approx(1 - 0.05 / 4)
    each = [
        one_run_audit(y, s, k_plus=a, k_minus=b, delta=1e-6, confidence=1 - 0.05 / 4)["epsilon_lb"] for a, b in grid
    ]
    assert best["epsilon_lb"] == pytest.approx(max(each))
    assert best["confidence"] == 0.95
    uncorrected = max(one_run_audit(y, s, k_plus=a, k_minus=b, delta=1e-6)["epsilon_lb"] for a, b in grid)
    assert 0 < best["epsilon_lb"] < uncorrected


@pytest.mark.parametrize(
    "call, match",
    [
        (lambda: one_run_guesses([1.0, 2.0], 2, 1), "exceeds the 2 canaries"),
        (lambda: one_run_guesses([1.0, 2.0], 0, 0), "makes no guess"),
        (lambda: one_run_guesses([1.0, 2.0], -1, 1), "below 0"),
        (lambda: one_run_guesses([1.0, 2.0], 1.5, 0), "not an integer"),
        (lambda: one_run_guesses([1.0, float("nan")], 1, 0), "NaN or infinite"),
        (lambda: one_run_epsilon_lb(11, 10), "exceeds n_guesses"),
        (lambda: one_run_epsilon_lb(5, 0), "below 1"),
        (lambda: one_run_epsilon_lb(5, 10, confidence=1.5), r"outside \(0, 1\)"),
        (lambda: one_run_epsilon_lb(5, 10, delta=1e-5, n_canaries=5), "below n_guesses"),
        (lambda: one_run_p_value(5, 10, -1.0), "finite number >= 0"),
        (lambda: one_run_audit([0, 1, 1], [0.1, 0.2, 0.3], k_plus=1, k_minus=1, delta=2.0), r"outside \[0, 1\)"),
        (lambda: best_one_run_audit([0, 1], [0.1, 0.2], delta=0.0, grid=[]), "grid is empty"),
        (lambda: best_one_run_audit([0, 1], [0.1, 0.2], delta=0.0, grid=[3]), "pairs"),
    ],
)
def test_one_run_validation(call, match):
    with pytest.raises(MetricError, match=match):
        call()


# ------------------------------------------------------------------------------------- claim_check


def test_claim_check():
    n = 1000
    y = np.r_[np.ones(n, int), np.zeros(n, int)]
    audited = epsilon_lower_bound(y, np.r_[np.ones(n), np.zeros(n)], delta=1e-5)  # ε_lb ≈ 4.48
    assert claim_check(1.0, audited) == {
        "claimed": 1.0, "epsilon_lb": audited["epsilon_lb"], "violated": True, "confidence": 0.95, "delta": 1e-5,
    }
    assert claim_check(8.0, audited)["violated"] is False
    assert claim_check(audited["epsilon_lb"], audited)["violated"] is False  # equal is not a violation
    assert claim_check(1.0, audited, claimed_delta=1e-6)["violated"] is True  # audit at larger δ still refutes
    with pytest.raises(MetricError, match="rerun the audit with delta"):
        claim_check(1.0, audited, claimed_delta=1e-3)
    with pytest.raises(MetricError, match="epsilon_lb"):
        claim_check(1.0, {"eps": 3.0})
    with pytest.raises(MetricError, match=">= 0"):
        claim_check(-1.0, audited)


def test_roc_epsilon_row_names_level_and_delta_and_flags_dependent_targets():
    rng = np.random.default_rng(0)
    y = np.r_[np.ones(500), np.zeros(500)]
    s = np.r_[rng.normal(3.0, 1.0, 500), rng.normal(0.0, 1.0, 500)]  # a strong, clearly separable attack
    row = roc_epsilon_row(y, s, delta=1e-5, confidence=0.95)
    assert row.metric == roc_metric_name(delta=1e-5, confidence=0.95) == "eps_lb_roc@95%,delta=1e-05"
    assert row.value == pytest.approx(epsilon_lower_bound(y, s, delta=1e-5, confidence=0.95)["epsilon_lb"])
    assert row.value > 0.5 and (row.n_pos, row.n_neg) == (500, 500)
    assert row.flag == "indicative" and row.ci_low is None
    assert roc_epsilon_row(y, s, delta=1e-5, independent=True).flag is None
    chance = roc_epsilon_row(y, rng.normal(size=1000), delta=1e-5, confidence=0.99)
    assert chance.metric.startswith("eps_lb_roc@99%") and chance.value < 0.5
    with pytest.raises(MetricError, match="delta"):
        roc_epsilon_row(y, s, delta=2.0)


def test_one_run_grid_is_fixed_by_m_and_fits():
    from bench.audit import one_run_grid
    assert one_run_grid(100) == [(5, 5), (10, 10), (25, 25), (5, 0), (10, 0), (25, 0)]
    assert all(kp + km <= 20 and kp >= 1 for kp, km in one_run_grid(20))
    with pytest.raises(MetricError, match="n_canaries"):
        one_run_grid(1)
