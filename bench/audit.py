"""Privacy auditing: turn membership-attack results into a statistically valid LOWER bound on ε.

Why: a DP defense *claims* an upper bound (ε, δ) on the privacy loss of a release. An attack can only ever
show a lower bound, and only a lower bound that holds at a stated confidence is evidence: a point estimate
such as log(TPR/FPR) at the best threshold is biased upwards (the best of many noisy thresholds), so it
would "refute" correct DP implementations by chance. Everything here returns ε_lb such that, if the release
is really (ε, δ)-DP, ``P(ε_lb > ε) <= 1 - confidence``; :func:`claim_check` then compares it with the claim.

Two procedures, for two experimental designs:

* :func:`epsilon_lower_bound` — the classical audit (Jagielski, Ullman and Oprea 2020, "Auditing
  differentially private machine learning: how private is private SGD?"; Nasr, Song, Thakurta, Papernot
  and Carlini 2021, "Adversary instantiation: lower bounds for differentially private machine learning";
  Nasr, Hayes, Steinke, Balle, Tramèr, Jagielski, Carlini and Terzis 2023, "Tight auditing of
  differentially private machine learning"). It needs every score to be an *independent* trial of the
  membership game (typically one training run per trial), members' scores i.i.d. from one distribution
  and non-members' from another. Clopper–Pearson bounds on the TPR and FPR of each threshold, corrected
  for the choice of threshold.
* :func:`one_run_audit` / :func:`best_one_run_audit` — auditing with one training run (Steinke, Nasr and
  Jagielski 2023, "Privacy auditing with one (1) training run", NeurIPS 2023). Many canaries are trained
  on at once, *each included independently with probability 1/2*; their scores need not be independent.

Conventions are those of :mod:`bench.metrics`: label 1 = member, higher score = more likely member,
"member" is predicted iff ``score >= threshold`` and tied scores switch together.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import numpy as np
from scipy.special import expit
from scipy.stats import beta, binom

from bench.accounting import group_privacy
from bench.errors import MetricError
from bench.metrics import MetricRow, roc_curve_points, validate_scores

__all__ = [
    "epsilon_lower_bound",
    "one_run_guesses",
    "one_run_p_value",
    "one_run_epsilon_lb",
    "one_run_audit",
    "best_one_run_audit",
    "claim_check",
    "roc_metric_name",
    "roc_epsilon_row",
    "FLAG_INDICATIVE",
    "one_run_grid",
    "one_run_row",
    "claim_row",
    "FLAG_CLAIM_VIOLATED",
    "FLAG_CLAIM_OK",
    "kl_lower_bound",
    "kl_metric_name",
    "kl_row",
    "secret_claim_row",
    "SECRET_CLAIM",
]

#: flag of an ε lower bound computed from targets that are not independent trials (all scored on one model)
FLAG_INDICATIVE = "indicative"


#: width (in ε) at which the bisection for the one-run bound stops; the lower end is returned
_EPS_TOL = 1e-9
#: grid points scanned for the first crossing of the one-run p-value when δ > 0 (see one_run_epsilon_lb)
_SCAN_POINTS = 64


# ----------------------------------------------------------------------------------------- validation


def _check_delta(delta: float) -> float:
    try:
        d = float(delta)
    except (TypeError, ValueError):
        raise MetricError(f"delta={delta!r} is not a number: pass the δ of the claim, e.g. delta=1e-5") from None
    if not (0.0 <= d < 1.0) or math.isnan(d):
        raise MetricError(f"delta={delta!r} is outside [0, 1): pass the δ of the claim, e.g. delta=1e-5")
    return d


def _check_confidence(confidence: float) -> float:
    try:
        c = float(confidence)
    except (TypeError, ValueError):
        raise MetricError(f"confidence={confidence!r} is not a number: use e.g. confidence=0.95") from None
    if not (0.0 < c < 1.0):
        raise MetricError(f"confidence={confidence!r} is outside (0, 1): use e.g. confidence=0.95")
    return c


def _check_count(name: str, value, minimum: int = 0) -> int:
    """An integer count >= minimum (bools and non-integral floats are refused: they hide caller bugs)."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
        raise MetricError(f"{name}={value!r} is not an integer: pass a whole count such as {name}={max(minimum, 1)}")
    if int(value) < minimum:
        raise MetricError(f"{name}={value} is below {minimum}: pass a count of at least {minimum}")
    return int(value)


# ------------------------------------------------------------------------ classical (many-run) audit


def _cp_lower(k: np.ndarray, n: int, a: float) -> np.ndarray:
    """One-sided Clopper–Pearson lower bound on p from k successes of n, each at error level ``a``.

    Closed forms at the ends (0 at k = 0, a**(1/n) at k = n) keep the extremes exact for tiny ``a``.
    """
    k = np.asarray(k, dtype=np.int64)
    out = np.zeros(k.shape)
    mid = (k > 0) & (k < n)
    out[mid] = beta.ppf(a, k[mid], n - k[mid] + 1)
    out[k == n] = math.exp(math.log(a) / n)
    return out


def _cp_upper(k: np.ndarray, n: int, a: float) -> np.ndarray:
    """One-sided Clopper–Pearson upper bound on p from k successes of n, each at error level ``a``.

    Always > 0: at k = 0 it is 1 - a**(1/n), computed as -expm1(log(a)/n) so it cannot round to 0;
    this is why a zero false-positive count never divides by zero in :func:`epsilon_lower_bound`.
    """
    k = np.asarray(k, dtype=np.int64)
    out = np.ones(k.shape)
    mid = (k > 0) & (k < n)
    out[mid] = beta.isf(a, k[mid] + 1, n - k[mid])
    out[k == 0] = -math.expm1(math.log(a) / n)
    return out


def _log_ratio(num: np.ndarray, den: np.ndarray) -> np.ndarray:
    """log(num / den) where num > 0, -inf elsewhere (a non-positive numerator gives no bound)."""
    out = np.full(num.shape, -np.inf)
    ok = num > 0
    out[ok] = np.log(num[ok]) - np.log(den[ok])
    return out


def _roc_counts(labels, scores, confidence: float) -> dict:
    """The ROC's thresholds with their true- and false-positive counts, and the Clopper–Pearson bounds TPR_lo and
    FPR_hi at each, every bound at level a = (1 − confidence) / (2 k), k = n_pos + n_neg (the Bonferroni count of
    :func:`epsilon_lower_bound`, which says why)."""
    y, _ = validate_scores(labels, scores)
    n_pos = int(y.sum())
    n_neg = int(len(y) - n_pos)
    fpr, tpr, thr = roc_curve_points(labels, scores)
    fp = np.rint(fpr * n_neg).astype(np.int64)
    tp = np.rint(tpr * n_pos).astype(np.int64)
    k = n_pos + n_neg
    a = (1.0 - confidence) / (2.0 * k)
    return {"thr": thr, "tp": tp, "fp": fp, "n_pos": n_pos, "n_neg": n_neg, "k": k, "a": a,
            "tpr_lo": _cp_lower(tp, n_pos, a), "fpr_hi": _cp_upper(fp, n_neg, a)}


def epsilon_lower_bound(labels, scores, *, delta: float, confidence: float = 0.95) -> dict:
    """Empirical lower bound on ε from one membership game's ROC, valid at ``confidence``.

    Why this form: if the release is (ε, δ)-DP then every rejection rule S satisfies
    TPR(S) <= e^ε FPR(S) + δ and, swapping the roles of the classes, TNR(S) <= e^ε FNR(S) + δ
    (Dwork and Roth 2014, "The algorithmic foundations of differential privacy", def. 2.4; used for audits
    by Jagielski, Ullman and Oprea 2020 and Nasr et al. 2021, 2023). So at each threshold t

        ε_t = max( log((TPR_lo − δ) / FPR_hi), log((TNR_lo − δ) / FNR_hi) )

    is a lower bound on ε whenever the Clopper–Pearson bounds hold (TPR_lo <= TPR, FPR_hi >= FPR; note that
    TNR_lo = 1 − FPR_hi and FNR_hi = 1 − TPR_lo for the same threshold). A non-positive numerator gives no
    bound at t. The result is max(0, max_t ε_t).

    Correction for the choice of threshold (Bonferroni): every one-sided Clopper–Pearson bound is taken at
    level a = (1 − confidence) / (2 (n_pos + n_neg)). Why this count: the first form is maximised, for each
    false-positive count j < n_neg, at the ROC point {score > j+1-th highest non-member score}; that
    threshold depends on the non-members only, so the members' count there is an exact binomial, and the
    non-members' true FPR there is a uniform order statistic for which the Clopper–Pearson upper bound is
    exact. The second form likewise needs n_pos thresholds set by the members. Each of these
    n_pos + n_neg thresholds can fail through two bounds, so 2 (n_pos + n_neg) events at level a each fail
    with total probability <= 1 − confidence. The count is fixed before the scores are seen (a count of
    the *realised* distinct thresholds would not be: thresholds placed at the data are data-dependent).
    Bonferroni rather than a held-out split because it is deterministic (the same scores always give the
    same bound, which a leaderboard needs) and uses every sample; its price grows only like
    log(n_pos + n_neg) in the bound's width. For continuous scores this argument is exact; with tied
    scores the same count still upper-bounds the number of distinct thresholds.

    Assumption a caller must meet: every score is an independent trial of the membership game (e.g. one
    training run per trial). Scores of many canaries from ONE model are not independent trials; use
    :func:`one_run_audit` for that design.

    Returns a dict: epsilon_lb (0.0 if no threshold gives a positive bound), threshold (predict member iff
    score >= threshold; None without a bound), side ("member": first form, "non-member": second form),
    tpr_lo, fpr_hi, tnr_lo, fnr_hi (at that threshold, None without a bound), confidence, delta,
    correction ("bonferroni"), k_thresholds, alpha_per_bound, n_pos, n_neg.
    """
    d = _check_delta(delta)
    c = _check_confidence(confidence)
    r = _roc_counts(labels, scores, c)
    thr, tp, fp, n_pos, n_neg, k, a, tpr_lo, fpr_hi = (r[x] for x in ("thr", "tp", "fp", "n_pos", "n_neg", "k", "a",
                                                                     "tpr_lo", "fpr_hi"))
    # Clopper–Pearson is symmetric (tnr_lo = 1 − fpr_hi, fnr_hi = 1 − tpr_lo: the same two events), but computing
    # the complements directly keeps fnr_hi > 0 exact instead of 1 − (a number that may round to 1)
    tnr_lo = _cp_lower(n_neg - fp, n_neg, a)
    fnr_hi = _cp_upper(n_pos - tp, n_pos, a)
    eps_member = _log_ratio(tpr_lo - d, fpr_hi)
    eps_nonmember = _log_ratio(tnr_lo - d, fnr_hi)
    eps_t = np.maximum(eps_member, eps_nonmember)

    result = {
        "epsilon_lb": 0.0,
        "threshold": None,
        "side": None,
        "tpr_lo": None,
        "fpr_hi": None,
        "tnr_lo": None,
        "fnr_hi": None,
        "confidence": c,
        "delta": d,
        "correction": "bonferroni",
        "k_thresholds": k,
        "alpha_per_bound": a,
        "n_pos": n_pos,
        "n_neg": n_neg,
    }
    i = int(np.argmax(eps_t))
    if eps_t[i] > 0.0:
        result.update(
            epsilon_lb=float(eps_t[i]),
            threshold=float(thr[i]),
            side="member" if eps_member[i] >= eps_nonmember[i] else "non-member",
            tpr_lo=float(tpr_lo[i]),
            fpr_hi=float(fpr_hi[i]),
            tnr_lo=float(tnr_lo[i]),
            fnr_hi=float(fnr_hi[i]),
        )
    return result


# ------------------------------------------------------------------------------ KL (Hush) audit


def kl_lower_bound(labels, scores, *, confidence: float = 0.95) -> dict:
    """Lower bound on the KL divergence between the releases of two neighbouring datasets, valid at ``confidence``.

    Why: a KL guarantee KL(M(D) ‖ M(D')) <= μ for neighbours D, D' (Hush, Ganesh et al. 2025, whose accountant
    bounds both directions) passes to every test T by the data-processing inequality:
    KL(Bern(TPR) ‖ Bern(FPR)) <= μ and KL(Bern(FPR) ‖ Bern(TPR)) <= μ, with TPR = P(T | D), FPR = P(T | D').
    Both divergences grow with TPR and shrink with FPR where TPR > FPR, so at a threshold t

        kl_t = max(KL(Bern(TPR_lo) ‖ Bern(FPR_hi)), KL(Bern(FPR_hi) ‖ Bern(TPR_lo)))   if TPR_lo > FPR_hi, else 0

    is a lower bound whenever the Clopper–Pearson bounds hold. The thresholds, their Bonferroni count and the
    level of each bound are those of :func:`epsilon_lower_bound` (the same two events per threshold: TNR_lo and
    FNR_hi are complements of FPR_hi and TPR_lo, and KL(Bern(1-a) ‖ Bern(1-b)) = KL(Bern(a) ‖ Bern(b)), so the
    thresholds the members set add nothing new). The result is max(0, max_t kl_t).

    Same assumption as :func:`epsilon_lower_bound`: every score an independent trial of the game. Targets scored
    on one model share it; then the bound is indicative (what it bounds in expectation still holds, see
    docs/audit.md, "Hush and NAF").

    Returns a dict: kl_lb, threshold (None without a bound), tpr_lo, fpr_hi, confidence, correction,
    k_thresholds, alpha_per_bound, n_pos, n_neg.
    """
    from bench.secret_accounting import bernoulli_kl

    c = _check_confidence(confidence)
    r = _roc_counts(labels, scores, c)
    thr, n_pos, n_neg, k, a, tpr_lo, fpr_hi = (r[x] for x in ("thr", "n_pos", "n_neg", "k", "a", "tpr_lo", "fpr_hi"))
    above = tpr_lo > fpr_hi
    kl_t = np.zeros(len(tpr_lo))
    if above.any():
        t, f = tpr_lo[above], fpr_hi[above]
        kl_t[above] = np.maximum(bernoulli_kl(t, f), bernoulli_kl(f, t))
    result = {"kl_lb": 0.0, "threshold": None, "tpr_lo": None, "fpr_hi": None, "confidence": c,
              "correction": "bonferroni", "k_thresholds": k, "alpha_per_bound": a, "n_pos": n_pos, "n_neg": n_neg}
    i = int(np.argmax(kl_t))
    if kl_t[i] > 0.0:
        result.update(kl_lb=float(kl_t[i]), threshold=float(thr[i]), tpr_lo=float(tpr_lo[i]),
                      fpr_hi=float(fpr_hi[i]))
    return result


# ------------------------------------------------------------------------------------ one-run audit


def one_run_guesses(scores, k_plus: int, k_minus: int, *, seed: int | None = None) -> np.ndarray:
    """The auditor's guesses: +1 ("in") for the k_plus highest scores, −1 ("out") for the k_minus lowest, 0 else.

    Why ties need care: the guesses must be a function of the scores alone (Steinke, Nasr and Jagielski
    2023 require T = A(M(S))). Breaking ties by position would leak the labels whenever the caller's order
    follows membership (members first), and inflate the audit. So, with ``seed=None``, a block of tied
    scores that straddles a cut is not guessed at all (fewer than k_plus / k_minus guesses are made); with
    an integer ``seed``, ties are broken by an independent random permutation (needed for discrete scores,
    e.g. randomized response, where whole halves of the canaries tie).
    """
    try:
        s = np.asarray(scores, dtype=np.float64)
    except (TypeError, ValueError) as exc:
        raise MetricError(f"scores are not numeric ({exc}): pass one number per canary") from None
    if s.ndim != 1 or len(s) == 0:
        raise MetricError(f"scores must be a non-empty 1-D array (got shape {s.shape}): pass one score per canary")
    if not np.isfinite(s).all():
        n_bad = int((~np.isfinite(s)).sum())
        raise MetricError(f"{n_bad} of {len(s)} scores are NaN or infinite: the attack must return finite scores")
    kp = _check_count("k_plus", k_plus)
    km = _check_count("k_minus", k_minus)
    m = len(s)
    if kp + km == 0:
        raise MetricError("k_plus + k_minus = 0 makes no guess: guess at least one canary, e.g. k_plus=k_minus=m//10")
    if kp + km > m:
        raise MetricError(
            f"k_plus + k_minus = {kp + km} exceeds the {m} canaries: guess each canary at most once"
        )
    if seed is not None:
        # rank by (score, independent random key): a strict order that carries no label information
        key = np.random.default_rng(seed).permutation(m)
        order = np.lexsort((key, s))  # ascending
        rank_asc = np.empty(m, dtype=np.int64)
        rank_asc[order] = np.arange(m)
        guesses = np.zeros(m, dtype=np.int8)
        guesses[rank_asc >= m - kp] = 1
        guesses[rank_asc < km] = -1
        return guesses
    srt = np.sort(s)
    n_ge = m - np.searchsorted(srt, s, side="left")  # how many scores are >= each score
    n_le = np.searchsorted(srt, s, side="right")  # how many scores are <= each score
    guesses = np.zeros(m, dtype=np.int8)
    # n_ge + n_le >= m + 1, so with kp + km <= m no canary satisfies both
    guesses[n_ge <= kp] = 1
    guesses[n_le <= km] = -1
    return guesses


def one_run_p_value(
    n_correct: int, n_guesses: int, epsilon: float, *, delta: float = 0.0, n_canaries: int | None = None
) -> float:
    """Upper bound on P[at least n_correct of n_guesses guesses are right] for an (ε, δ)-DP release.

    Steinke, Nasr and Jagielski 2023, main theorem (section 3; the same bound is their appendix code's
    ``p_value_DP_audit``): with m canaries each included with probability 1/2,
    at most r guesses and W the number of correct ones,

        P[W >= v] <= P[Binomial(r, q) >= v] + 2 m δ · max_{i = 1..v} (1/i) P[v − i <= Binomial(r, q) < v],

    with q = e^ε / (1 + e^ε), the accuracy of ε-DP randomized response. For δ = 0 this is the stochastic
    domination of W by Binomial(r, q). The maximum over i may stop at v: for i > v the probability no
    longer grows while 1/i shrinks. Capped at 1.
    """
    v = _check_count("n_correct", n_correct)
    r = _check_count("n_guesses", n_guesses, 1)
    if v > r:
        raise MetricError(f"n_correct={v} exceeds n_guesses={r}: count correct guesses among the guesses made")
    try:
        eps = float(epsilon)
    except (TypeError, ValueError):
        eps = math.nan
    if not (0.0 <= eps < math.inf):
        raise MetricError(f"epsilon={epsilon!r} must be a finite number >= 0: test a DP level such as epsilon=1.0")
    d = _check_delta(delta)
    m = _check_canaries(n_canaries, r, d)
    return _one_run_p(v, r, eps, d, m)


def _check_canaries(n_canaries, r: int, d: float) -> int:
    if n_canaries is None:
        if d > 0.0:
            raise MetricError(
                "delta > 0 needs n_canaries: the δ term of Steinke et al. 2023 scales with the number m of "
                "canaries (guessed or not); pass n_canaries=m"
            )
        return r
    m = _check_count("n_canaries", n_canaries, 1)
    if m < r:
        raise MetricError(f"n_canaries={m} is below n_guesses={r}: each canary is guessed at most once")
    return m


def _one_run_p(v: int, r: int, eps: float, d: float, m: int) -> float:
    q = float(expit(eps))
    p = float(binom.sf(v - 1, r, q))
    if d > 0.0 and v > 0:
        pmf_down = binom.pmf(np.arange(v - 1, -1, -1), r, q)  # pmf(v−1), pmf(v−2), ..., pmf(0)
        alpha = float(np.max(np.cumsum(pmf_down) / np.arange(1, v + 1)))
        p += 2.0 * m * d * alpha
    return min(p, 1.0)


def one_run_epsilon_lb(
    n_correct: int,
    n_guesses: int,
    *,
    delta: float = 0.0,
    confidence: float = 0.95,
    n_canaries: int | None = None,
) -> float:
    """Largest ε rejected at ``confidence`` by the one-run test: the audit's lower bound on ε (0.0 if none).

    ε is rejected when :func:`one_run_p_value` <= 1 − confidence. Why this is a valid lower bound: if the
    release is (ε*, δ)-DP, let R be the set of counts v at which ε* is rejected; then
    P[W ∈ R] <= P[W >= min R] <= p(min R) <= 1 − confidence, whatever the shape of p in v.

    Search: for δ = 0 the p-value P[Binomial(r, q) >= v] increases with q, hence with ε, so plain
    bisection finds the crossing exactly. For δ > 0 the paper's code also bisects, but monotonicity of the
    δ term in ε is not proved there, so we first scan a grid of ε values for the *first* ε that is not
    rejected and bisect only below it: the returned bound never skips over an ε that is not rejected
    (up to the grid's resolution). The lower end of the final bracket is returned (width 1e-9).

    ``n_canaries`` (m, all canaries, guessed or not) is needed only when δ > 0.
    """
    v = _check_count("n_correct", n_correct)
    r = _check_count("n_guesses", n_guesses, 1)
    if v > r:
        raise MetricError(f"n_correct={v} exceeds n_guesses={r}: count correct guesses among the guesses made")
    d = _check_delta(delta)
    c = _check_confidence(confidence)
    m = _check_canaries(n_canaries, r, d)
    level = 1.0 - c

    def rejected(eps: float) -> bool:
        return _one_run_p(v, r, eps, d, m) <= level

    if not rejected(0.0):
        return 0.0
    hi = 1.0
    while rejected(hi):  # q = expit(ε) reaches 1.0 in floating point near ε ≈ 37, where p = 1: terminates
        hi *= 2.0
    lo = 0.0
    if d > 0.0:
        for e in np.linspace(0.0, hi, _SCAN_POINTS + 1)[1:]:
            if not rejected(float(e)):
                hi = float(e)
                break
            lo = float(e)
    while hi - lo > _EPS_TOL:
        mid = 0.5 * (lo + hi)
        if rejected(mid):
            lo = mid
        else:
            hi = mid
    return lo


def one_run_audit(
    labels,
    scores,
    *,
    k_plus: int,
    k_minus: int,
    delta: float,
    confidence: float = 0.95,
    seed: int | None = None,
) -> dict:
    """One-run audit (Steinke, Nasr and Jagielski 2023): guess the extremes, count hits, bound ε.

    ``labels`` are the canaries' inclusion coins (1 = trained on), which MUST have been drawn independently
    with probability 1/2 each — a fixed half/half split does not meet the theorem's assumption. The bound
    uses r = k_plus + k_minus, fixed in advance, even when ties make fewer guesses (``seed=None``): the
    theorem needs a bound on the number of guesses that does not depend on the outcome, and a smaller
    realised r would give a larger, unjustified ε.

    Returns: epsilon_lb, n_canaries (m), k_plus, k_minus, n_guesses (r used in the bound), n_guesses_made,
    n_correct (v), n_correct_plus, n_correct_minus, delta, confidence.
    """
    d = _check_delta(delta)
    c = _check_confidence(confidence)
    y, s = validate_scores(labels, scores)
    g = one_run_guesses(s, k_plus, k_minus, seed=seed)
    hit_plus = int(((g == 1) & (y == 1)).sum())
    hit_minus = int(((g == -1) & (y == 0)).sum())
    m = len(y)
    r = int(k_plus) + int(k_minus)
    v = hit_plus + hit_minus
    return {
        "epsilon_lb": one_run_epsilon_lb(v, r, delta=d, confidence=c, n_canaries=m),
        "n_canaries": m,
        "k_plus": int(k_plus),
        "k_minus": int(k_minus),
        "n_guesses": r,
        "n_guesses_made": int((g != 0).sum()),
        "n_correct": v,
        "n_correct_plus": hit_plus,
        "n_correct_minus": hit_minus,
        "delta": d,
        "confidence": c,
    }


def best_one_run_audit(
    labels,
    scores,
    *,
    delta: float,
    confidence: float = 0.95,
    grid: Iterable[tuple[int, int]],
    seed: int | None = None,
) -> dict:
    """The best one-run audit over a grid of (k_plus, k_minus), Bonferroni-corrected over the grid.

    Why the correction: taking the largest of G bounds, each valid at confidence c, is valid only at
    1 − G (1 − c). Each grid point is therefore audited at confidence 1 − (1 − confidence) / G, so the
    maximum holds at ``confidence`` (union bound). Duplicate grid points are counted once (the same test
    twice is one test). The grid must be fixed without looking at the labels.

    Returns the winning :func:`one_run_audit` dict with ``confidence`` set to the overall level, plus
    correction ("bonferroni"), grid_size (G) and confidence_each.
    """
    c = _check_confidence(confidence)
    try:
        pairs = list(dict.fromkeys((kp, km) for kp, km in grid))
    except (TypeError, ValueError):
        raise MetricError(
            "grid must be an iterable of (k_plus, k_minus) pairs: pass e.g. grid=[(100, 100), (200, 0)]"
        ) from None
    if not pairs:
        raise MetricError("grid is empty: pass at least one (k_plus, k_minus) pair, e.g. grid=[(100, 100)]")
    g = len(pairs)
    c_each = 1.0 - (1.0 - c) / g
    best = None
    for kp, km in pairs:
        res = one_run_audit(labels, scores, k_plus=kp, k_minus=km, delta=delta, confidence=c_each, seed=seed)
        if best is None or res["epsilon_lb"] > best["epsilon_lb"]:
            best = res
    best = dict(best)
    best.update(confidence=c, correction="bonferroni", grid_size=g, confidence_each=c_each)
    return best


# ------------------------------------------------------------------------------------------ claims


def claim_check(claimed_epsilon: float, audited: dict, *, claimed_delta: float | None = None) -> dict:
    """Does the audit refute the claim? violated iff epsilon_lb > claimed_epsilon.

    The audited bound already holds at its confidence, so a violation is significant at that confidence
    (no further correction — unless the caller checks many claims or audits and reports the worst).
    An audit at δ_a refutes an (ε, δ) claim only if δ_a >= δ (an (ε, δ)-DP release is also (ε, δ_a)-DP
    then); pass ``claimed_delta`` to have that checked.
    """
    try:
        eps_c = float(claimed_epsilon)
    except (TypeError, ValueError):
        raise MetricError(f"claimed_epsilon={claimed_epsilon!r} is not a number: pass the defense's ε") from None
    if not (eps_c >= 0.0):
        raise MetricError(f"claimed_epsilon={claimed_epsilon!r} must be >= 0 (or inf): pass the defense's ε")
    if not isinstance(audited, dict) or "epsilon_lb" not in audited:
        raise MetricError(
            "audited has no 'epsilon_lb': pass the dict returned by epsilon_lower_bound or one_run_audit"
        )
    lb = float(audited["epsilon_lb"])
    if claimed_delta is not None:
        dc = _check_delta(claimed_delta)
        da = audited.get("delta")
        if da is None or float(da) < dc:
            raise MetricError(
                f"the audit used delta={da!r}, below the claimed delta={dc}: it tests a stronger guarantee than "
                "claimed; rerun the audit with delta equal to the claimed δ"
            )
    return {
        "claimed": eps_c,
        "epsilon_lb": lb,
        "violated": bool(lb > eps_c),
        "confidence": audited.get("confidence"),
        "delta": audited.get("delta"),
    }


# ------------------------------------------------------------------------------- rows for the store


def _pct(confidence: float) -> str:
    return format(round(float(confidence) * 100.0, 10), ".10g")


def roc_metric_name(*, delta: float, confidence: float) -> str:
    """Metric name of the ROC ε lower bound: ``eps_lb_roc@95%,delta=1e-05`` (the level and δ travel with it)."""
    return f"eps_lb_roc@{_pct(_check_confidence(confidence))}%,delta={_check_delta(delta):g}"


def roc_epsilon_row(labels, scores, *, delta: float, confidence: float = 0.95,
                    independent: bool = False) -> MetricRow:
    """The :func:`epsilon_lower_bound` of one evaluation as a metric row (ci columns left empty: the bound *is*
    the lower end of a one-sided interval at the level named in the metric).

    When it is valid: only when every target is an independent trial of the membership game (one training run
    per target, or per disjoint batch of targets), which is what the Clopper–Pearson counts assume. The
    runner's games score many targets on *one* adapted model, so their outcomes are dependent and the bound is
    only indicative there: the row is flagged :data:`FLAG_INDICATIVE` unless ``independent=True``. The
    ``audit`` game (canaries included with probability 1/2 each, :func:`best_one_run_audit`) is the valid
    procedure for one training run.
    """
    res = epsilon_lower_bound(labels, scores, delta=delta, confidence=confidence)
    return MetricRow(roc_metric_name(delta=delta, confidence=confidence), float(res["epsilon_lb"]), None, None,
                     int(res["n_pos"]), int(res["n_neg"]), None if independent else FLAG_INDICATIVE)


#: fractions of the m canaries guessed at each end in the audit game's fixed grid (k = ⌈f m⌉)
ONE_RUN_FRACTIONS = (0.05, 0.1, 0.25)


def one_run_grid(n_canaries: int) -> list[tuple[int, int]]:
    """The audit game's fixed grid of (k_plus, k_minus), set from m alone (never from labels or scores): guess
    "in" for the top k, and either abstain on the rest or also guess "out" for the bottom k (Steinke, Nasr and
    Jagielski 2023 guess both ends or the top only)."""
    m = _check_count("n_canaries", n_canaries, 2)
    ks = sorted({max(1, math.ceil(f * m)) for f in ONE_RUN_FRACTIONS if 2 * max(1, math.ceil(f * m)) <= m})
    return [(k, k) for k in ks] + [(k, 0) for k in ks]


def one_run_row(labels, scores, *, delta: float, confidence: float = 0.95) -> MetricRow:
    """The audit game's one-run ε lower bound (:func:`best_one_run_audit` over :func:`one_run_grid`), valid at
    ``confidence`` from one training run because each canary was included independently with probability 1/2.
    Named like :func:`roc_metric_name` with ``one_run`` for ``roc``; never flagged indicative."""
    y = np.asarray(labels)
    res = best_one_run_audit(labels, scores, delta=delta, confidence=confidence, grid=one_run_grid(len(y)))
    name = roc_metric_name(delta=delta, confidence=confidence).replace("eps_lb_roc", "eps_lb_one_run")
    n_pos = int((y == 1).sum())
    return MetricRow(name, float(res["epsilon_lb"]), None, None, n_pos, int(len(y) - n_pos), None)


FLAG_CLAIM_VIOLATED = "claim_violated"
FLAG_CLAIM_OK = "claim_ok"
#: metric name of the secret-level (Hush) claim check: ``secret_claim@95%``
SECRET_CLAIM = "secret_claim"


def claimed_epsilon(guarantee: dict | None, repeats: int) -> tuple[float, float] | None:
    """The (ε, δ) a defense's guarantee claims for one audit canary inserted ``repeats`` times, or None when it
    claims nothing finite (no guarantee, ε = inf). A canary repeated r > 1 times is a group of r records, so the
    claim is the group-privacy bound for r (:func:`bench.accounting.group_privacy`), where the guarantee states
    group bounds up to ``group_k`` ≥ r; its ``group_epsilon`` is the looser bound for ``group_k`` itself."""
    if not guarantee or guarantee.get("name") != "epsilon" or guarantee.get("delta") is None:
        return None
    eps, delta = float(guarantee["value"]), float(guarantee["delta"])
    if not math.isfinite(eps):
        return None
    if repeats > 1:
        if int(guarantee.get("group_k") or 1) < repeats or "group_epsilon" not in guarantee:
            return None
        eps, delta = group_privacy(eps, delta, int(repeats))
    if not math.isfinite(eps) or not (0.0 <= delta < 1.0):
        return None
    return eps, delta


def claim_row(labels, scores, guarantee: dict | None, *, confidence: float = 0.95,
              repeats: int = 1) -> MetricRow | None:
    """The verdict on a defense's DP claim from one audit game: ``dp_claim@<confidence>%,delta=<claimed δ>`` with
    value = the claimed ε, ci_low = the one-run ε lower bound recomputed *at the claimed δ* (an audit at a smaller
    δ would test a stronger guarantee than claimed), flag :data:`FLAG_CLAIM_VIOLATED` iff ε_lb > claimed ε,
    else :data:`FLAG_CLAIM_OK`. None when the defense claims no finite (ε, δ).

    False positives: if the release really is (ε, δ)-DP, the one-run bound exceeds ε with probability at most
    1 − confidence (Steinke, Nasr and Jagielski 2023, with the grid's Bonferroni correction), so a correct
    defense is flagged violated in at most that fraction of seeds. Taking the worst of A attacks' verdicts
    raises this to A (1 − confidence) (union bound).
    """
    claim = claimed_epsilon(guarantee, repeats)
    if claim is None:
        return None
    eps_c, delta_c = claim
    y = np.asarray(labels)
    res = best_one_run_audit(labels, scores, delta=delta_c, confidence=confidence, grid=one_run_grid(len(y)))
    verdict = claim_check(eps_c, res, claimed_delta=delta_c)
    n_pos = int((y == 1).sum())
    name = roc_metric_name(delta=delta_c, confidence=confidence).replace("eps_lb_roc", "dp_claim")
    return MetricRow(name, eps_c, float(res["epsilon_lb"]), None, n_pos, int(len(y) - n_pos),
                     FLAG_CLAIM_VIOLATED if verdict["violated"] else FLAG_CLAIM_OK)


def kl_metric_name(*, confidence: float) -> str:
    """Metric name of the KL lower bound: ``kl_lb@95%``."""
    return f"kl_lb@{_pct(_check_confidence(confidence))}%"


def kl_row(labels, scores, *, confidence: float = 0.95) -> MetricRow:
    """The :func:`kl_lower_bound` of one evaluation of a neighbour game as a metric row, flagged
    :data:`FLAG_INDICATIVE` (the targets share one model); stored for every release, claim or not, so an
    undefended release shows what the attacks can detect."""
    y = np.asarray(labels)
    res = kl_lower_bound(labels, scores, confidence=confidence)
    n_pos = int((y == 1).sum())
    return MetricRow(kl_metric_name(confidence=confidence), float(res["kl_lb"]), None, None, n_pos,
                     int(len(y) - n_pos), FLAG_INDICATIVE)


def _claimed_kl(secret: dict) -> float:
    """The KL a ledger claims for one secret: its ``kl`` (None = unbounded), or for ledgers written before ``kl``
    was kept, Lemma 3.2 inverted from ``r_bound`` (r_bound = 1 means no bound)."""
    from bench.secret_accounting import bernoulli_kl

    if "kl" in secret:
        return math.inf if secret["kl"] is None else float(secret["kl"])
    return math.inf if secret["r_bound"] >= 1.0 else float(bernoulli_kl(secret["r_bound"], secret["p"]))


def secret_claim_row(labels, scores, units, guarantee: dict | None, *, confidence: float = 0.95) -> MetricRow | None:
    """The verdict on a secret-level KL guarantee (Hush, Ganesh et al. 2025) from one game whose negatives are the
    positives' neighbours (task ``secrets_replaced``): ``secret_claim@<confidence>%`` with value = μ, the largest
    KL bound the defense's ledger claims for the game's secrets (``units``), ci_low = :func:`kl_lower_bound`, flag
    :data:`FLAG_CLAIM_VIOLATED` iff the bound exceeds μ, else :data:`FLAG_CLAIM_OK`.

    Why the largest μ_j: the game pools secrets with different μ_j, and by the joint convexity of KL the pooled
    (TPR, FPR) of a test obey KL(Bern(TPR) ‖ Bern(FPR)) <= the mean μ_j <= the largest. None when the release
    claims no secret-level guarantee, when its ledger bounds only one KL direction (the check uses both), or when
    a secret of the game is missing from the ledger (its neighbour was not trained on: not this design).
    """
    if not guarantee or guarantee.get("name") != "secret_reconstruction" or guarantee.get("direction") != "both":
        return None
    per = guarantee.get("per_secret") or {}
    units = list(units)
    if not units or any(u not in per for u in units):
        return None
    mu = max(_claimed_kl(per[u]) for u in units)
    res = kl_lower_bound(labels, scores, confidence=confidence)
    y = np.asarray(labels)
    n_pos = int((y == 1).sum())
    return MetricRow(f"{SECRET_CLAIM}@{_pct(_check_confidence(confidence))}%", mu, float(res["kl_lb"]), None, n_pos,
                     int(len(y) - n_pos), FLAG_CLAIM_VIOLATED if res["kl_lb"] > mu else FLAG_CLAIM_OK)
