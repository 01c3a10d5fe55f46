"""Membership-inference metrics: AUC, ROC points, TPR at low FPR, confidence intervals.

Conventions (fixed here so that every attack is scored the same way):

* higher score = more likely member; label 1 = member (positive), 0 = non-member;
* a sample is predicted member iff ``score >= threshold``; samples with equal
  scores switch together (ties are blocks: a tie is never split);
* TPR@FPR is the largest TPR over ROC points whose FPR is ``<=`` the target,
  so a reported TPR@1%FPR never hides a higher false-positive rate;
* confidence intervals (AUC and TPR@FPR) are percentile bootstraps that resample
  members and non-members separately (stratified), keeping both class counts
  fixed; for a given seed both metrics use the same resamples. The TPR interval
  recomputes the threshold on every resample, so it includes the sampling error
  of the threshold chosen on the non-members, which a binomial interval on the
  members alone (Clopper-Pearson) ignores.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy.stats import beta, rankdata

from bench.errors import MetricError

__all__ = [
    "MetricRow",
    "validate_scores",
    "roc_auc",
    "roc_curve_points",
    "tpr_at_fpr",
    "bootstrap_auc_ci",
    "bootstrap_tpr_ci",
    "clopper_pearson",
    "membership_metrics",
    "metric_name_for_fpr",
]

FLAG_FPR_BELOW_RESOLUTION = "fpr_below_resolution"
_FPR_EPS = 1e-12  # slack when comparing an achieved FPR k/n_neg with a target


@dataclass(frozen=True)
class MetricRow:
    """One reported metric with its confidence interval and class counts."""

    metric: str
    value: float
    ci_low: float | None
    ci_high: float | None
    n_pos: int
    n_neg: int
    flag: str | None = None


def validate_scores(labels, scores) -> tuple[np.ndarray, np.ndarray]:
    """Check labels/scores and return them as (int 0/1 array, float64 array)."""
    try:
        y = np.asarray(labels)
        s = np.asarray(scores, dtype=np.float64)
    except (TypeError, ValueError) as exc:
        raise MetricError(
            f"scores are not numeric ({exc}): the attack must return one number per sample"
        ) from None
    if y.ndim != 1 or s.ndim != 1:
        raise MetricError(
            f"labels and scores must be 1-D (got shapes {y.shape} and {s.shape}): "
            "pass one label and one score per sample"
        )
    if len(y) != len(s):
        raise MetricError(
            f"{len(y)} labels but {len(s)} scores: the attack must return exactly one score per sample"
        )
    if len(y) == 0:
        raise MetricError("no samples to score: provide at least one member and one non-member")
    try:
        ok = np.isin(y, [0, 1]) if y.dtype.kind in "biuf" else np.zeros(len(y), dtype=bool)
    except TypeError:
        ok = np.zeros(len(y), dtype=bool)
    if not ok.all():
        bad = y[~ok][:3].tolist()
        raise MetricError(
            f"labels must be 0 (non-member) or 1 (member), found e.g. {bad}: encode membership as 0/1"
        )
    y = y.astype(np.int64)
    n_pos = int(y.sum())
    n_neg = len(y) - n_pos
    if n_pos == 0 or n_neg == 0:
        present = "members" if n_neg == 0 else "non-members"
        raise MetricError(
            f"only one class present ({len(y)} {present}): include both members and non-members"
        )
    n_bad = int((~np.isfinite(s)).sum())
    if n_bad:
        raise MetricError(
            f"{n_bad} of {len(s)} scores are NaN or infinite: the attack must return finite scores"
        )
    return y, s


def _auc(y: np.ndarray, s: np.ndarray) -> float:
    """Mann-Whitney AUC on validated arrays (ties count 1/2)."""
    n_pos = int(y.sum())
    n_neg = len(y) - n_pos
    ranks = rankdata(s)  # average ranks for ties
    u = ranks[y == 1].sum() - n_pos * (n_pos + 1) / 2.0
    return float(u / (n_pos * n_neg))


def roc_auc(labels, scores) -> float:
    """Area under the ROC curve: P(member score > non-member score) + P(tie)/2."""
    return _auc(*validate_scores(labels, scores))


def _roc(y: np.ndarray, s: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(fp counts, tp counts, thresholds) per distinct score, descending, with (0, 0, inf) first."""
    order = np.argsort(-s, kind="stable")
    s_sorted = s[order]
    y_sorted = y[order]
    tps = np.cumsum(y_sorted)
    fps = np.cumsum(1 - y_sorted)
    # last index of each block of equal scores: the whole block switches together
    last = np.r_[np.nonzero(np.diff(s_sorted))[0], len(s_sorted) - 1]
    fp = np.r_[0, fps[last]]
    tp = np.r_[0, tps[last]]
    thr = np.r_[np.inf, s_sorted[last]]
    return fp, tp, thr


def roc_curve_points(labels, scores) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """ROC points (fpr, tpr, thresholds), one per distinct score plus (0, 0) at threshold +inf.

    A sample is predicted member iff ``score >= threshold``; fpr is ascending.
    """
    y, s = validate_scores(labels, scores)
    fp, tp, thr = _roc(y, s)
    n_pos = int(y.sum())
    n_neg = len(y) - n_pos
    return fp / n_neg, tp / n_pos, thr


def _tpr_at_fpr(y: np.ndarray, s: np.ndarray, target_fpr: float) -> tuple[float, float, float]:
    n_pos = int(y.sum())
    n_neg = len(y) - n_pos
    fp, tp, thr = _roc(y, s)
    fpr = fp / n_neg
    ok = np.nonzero(fpr <= target_fpr + _FPR_EPS)[0]
    i = int(ok[-1])  # tpr is non-decreasing along the curve; (0, 0) always qualifies
    return float(tp[i] / n_pos), float(fpr[i]), float(thr[i])


def tpr_at_fpr(labels, scores, target_fpr: float) -> tuple[float, float, float]:
    """Largest TPR over ROC points with FPR <= ``target_fpr``: (tpr, achieved_fpr, threshold).

    Ties are never split. If only the (0, 0) point qualifies, returns (0.0, 0.0, inf).
    """
    if not (0.0 < float(target_fpr) < 1.0):
        raise MetricError(
            f"target FPR {target_fpr!r} is outside (0, 1): give a rate such as 0.01 for 1%"
        )
    y, s = validate_scores(labels, scores)
    return _tpr_at_fpr(y, s, float(target_fpr))


def _check_boot_args(n_boot: int, alpha: float) -> None:
    if int(n_boot) < 1:
        raise MetricError(f"n_boot={n_boot!r} must be at least 1: use e.g. n_boot=1000")
    if not (0.0 < float(alpha) < 1.0):
        raise MetricError(f"alpha={alpha!r} is outside (0, 1): use e.g. alpha=0.05 for a 95% CI")


def _stratified_resamples(n_pos: int, n_neg: int, n_boot: int, seed: int):
    """Yield chunks ``(pi, ni)`` of resample indices, shapes (b, n_pos) and (b, n_neg), n_boot rows in all.

    Shared by the AUC and TPR bootstraps so that one seed means one set of resamples for every metric.
    Members are drawn first, then non-members, from ``numpy.random.Generator(PCG64(seed))``.
    """
    rng = np.random.Generator(np.random.PCG64(seed))
    chunk = max(1, 4_000_000 // (n_pos + n_neg + 1))
    for start in range(0, n_boot, chunk):
        b = min(chunk, n_boot - start)
        pi = rng.integers(0, n_pos, size=(b, n_pos))
        ni = rng.integers(0, n_neg, size=(b, n_neg))
        yield pi, ni


def bootstrap_auc_ci(
    labels, scores, *, n_boot: int = 1000, alpha: float = 0.05, seed: int = 0
) -> tuple[float, float]:
    """Stratified percentile-bootstrap CI for the AUC.

    Members and non-members are resampled separately with replacement
    (``numpy.random.Generator(PCG64(seed))``), so each resample keeps both class counts.
    """
    _check_boot_args(n_boot, alpha)
    y, s = validate_scores(labels, scores)
    pos = s[y == 1]
    neg = np.sort(s[y == 0])
    n_pos, n_neg = len(pos), len(neg)
    # For every member: how many non-members score strictly below it, and below-or-equal.
    lo_idx = np.searchsorted(neg, pos, side="left")
    hi_idx = np.searchsorted(neg, pos, side="right")

    n_boot = int(n_boot)
    aucs = np.empty(n_boot)
    start = 0
    for pi, ni in _stratified_resamples(n_pos, n_neg, n_boot, seed):
        b = len(pi)
        # multiplicity of each (sorted) non-member per resample, then cumulative counts
        counts = np.bincount(
            (ni + (np.arange(b) * n_neg)[:, None]).ravel(), minlength=b * n_neg
        ).reshape(b, n_neg)
        cum = np.zeros((b, n_neg + 1))
        np.cumsum(counts, axis=1, out=cum[:, 1:])
        below = np.take_along_axis(cum, lo_idx[pi], axis=1)
        below_eq = np.take_along_axis(cum, hi_idx[pi], axis=1)
        aucs[start : start + b] = (below + below_eq).sum(axis=1) / (2.0 * n_pos * n_neg)
        start += b
    low, high = np.quantile(aucs, [alpha / 2.0, 1.0 - alpha / 2.0])
    return float(low), float(high)


def _max_false_positives(n_neg: int, target_fpr: float) -> int:
    """Largest fp count k with ``k / n_neg <= target + eps``, evaluated exactly as :func:`_tpr_at_fpr` does."""
    ok = np.nonzero(np.arange(n_neg + 1) / n_neg <= target_fpr + _FPR_EPS)[0]
    return int(ok[-1])


def _bootstrap_tpr_values(
    y: np.ndarray, s: np.ndarray, target_fprs: list[float], n_boot: int, seed: int
) -> np.ndarray:
    """TPR at each target FPR on every stratified resample, shape (n_boot, len(target_fprs)).

    Same convention as :func:`_tpr_at_fpr`: with v the (k+1)-th largest resampled non-member score, where
    k is the largest admissible false-positive count, a threshold t admits at most k false positives iff
    t > v, and every resampled member above v lies at or above the lowest such ROC threshold, so the
    TPR is the share of resampled members scoring strictly above v (tie blocks at v are never split).
    """
    pos = s[y == 1]
    neg = np.sort(s[y == 0])  # index order == value order, so order statistics of indices give values
    n_pos, n_neg = len(pos), len(neg)
    ks = [_max_false_positives(n_neg, f) for f in target_fprs]
    # column of the sorted resampled negatives holding the (k+1)-th largest; k >= n_neg admits everything
    cols = [n_neg - 1 - k for k in ks if k < n_neg]
    out = np.ones((n_boot, len(ks)))
    start = 0
    for pi, ni in _stratified_resamples(n_pos, n_neg, n_boot, seed):
        b = len(pi)
        if cols:
            part = np.partition(ni, sorted(set(cols)), axis=1)
            pos_vals = pos[pi]
            for j, k in enumerate(ks):
                if k < n_neg:
                    v = neg[part[:, n_neg - 1 - k]]
                    out[start : start + b, j] = (pos_vals > v[:, None]).sum(axis=1) / n_pos
        start += b
    return out


def bootstrap_tpr_ci(
    labels, scores, target_fprs, *, n_boot: int = 1000, alpha: float = 0.05, seed: int = 0
) -> list[tuple[float, float]]:
    """Stratified percentile-bootstrap CI for the TPR at each FPR in ``target_fprs``.

    Why not a binomial interval on the members: the threshold is chosen on the same non-members, and with
    few of them its own sampling error dominates. Each resample redraws members and non-members (class
    counts fixed, the same resamples as :func:`bootstrap_auc_ci` for the same seed) and recomputes the
    TPR exactly as :func:`tpr_at_fpr` does (largest TPR with FPR <= target, ties never split).
    """
    fprs = [float(f) for f in np.atleast_1d(np.asarray(target_fprs, dtype=float))]
    if not fprs:
        raise MetricError("no target FPR given: pass e.g. target_fprs=[0.01]")
    for f in fprs:
        if not (0.0 < f < 1.0):
            raise MetricError(f"target FPR {f!r} is outside (0, 1): give a rate such as 0.01 for 1%")
    _check_boot_args(n_boot, alpha)
    y, s = validate_scores(labels, scores)
    vals = _bootstrap_tpr_values(y, s, fprs, int(n_boot), seed)
    q = np.quantile(vals, [alpha / 2.0, 1.0 - alpha / 2.0], axis=0)
    return [(float(q[0, j]), float(q[1, j])) for j in range(len(fprs))]


def clopper_pearson(k: int, n: int, alpha: float = 0.05) -> tuple[float, float]:
    """Exact (Clopper-Pearson) binomial CI for k successes in n trials."""
    if n <= 0:
        raise MetricError(f"n={n} trials: a binomial CI needs at least one trial")
    if not (0 <= k <= n):
        raise MetricError(f"k={k} successes is outside [0, n={n}]: pass 0 <= k <= n")
    if not (0.0 < alpha < 1.0):
        raise MetricError(f"alpha={alpha!r} is outside (0, 1): use e.g. alpha=0.05 for a 95% CI")
    low = 0.0 if k == 0 else float(beta.ppf(alpha / 2.0, k, n - k + 1))
    high = 1.0 if k == n else float(beta.ppf(1.0 - alpha / 2.0, k + 1, n - k))
    return low, high


def metric_name_for_fpr(f: float) -> str:
    """Metric name for a TPR at FPR ``f``: 0.001 -> "tpr@0.1%fpr", 0.01 -> "tpr@1%fpr"."""
    pct = format(round(float(f) * 100.0, 10), ".10g")
    return f"tpr@{pct}%fpr"


def membership_metrics(
    labels,
    scores,
    *,
    fprs=(0.001, 0.01, 0.05),
    n_boot: int = 1000,
    alpha: float = 0.05,
    seed: int = 0,
) -> list[MetricRow]:
    """AUC and TPR at each FPR in ``fprs``, each with a stratified bootstrap CI (same resamples for all).

    A TPR row is flagged ``"fpr_below_resolution"`` when the FPR is below
    1/n_neg, i.e. there are too few non-members to measure it.
    """
    for f in fprs:
        if not (0.0 < float(f) < 1.0):
            raise MetricError(f"target FPR {f!r} is outside (0, 1): give a rate such as 0.01 for 1%")
    y, s = validate_scores(labels, scores)
    n_pos = int(y.sum())
    n_neg = len(y) - n_pos
    lo, hi = bootstrap_auc_ci(y, s, n_boot=n_boot, alpha=alpha, seed=seed)
    rows = [MetricRow("auc", _auc(y, s), lo, hi, n_pos, n_neg)]
    tpr_cis = bootstrap_tpr_ci(y, s, fprs, n_boot=n_boot, alpha=alpha, seed=seed) if len(fprs) else []
    for f, (lo, hi) in zip(fprs, tpr_cis):
        tpr, _, _ = _tpr_at_fpr(y, s, float(f))
        flag = FLAG_FPR_BELOW_RESOLUTION if float(f) < 1.0 / n_neg else None
        rows.append(MetricRow(metric_name_for_fpr(f), tpr, lo, hi, n_pos, n_neg, flag))
    return rows


def exposure_metrics(labels, exposures, never_inserted=None) -> list[MetricRow]:
    """Mean and 95th-percentile canary exposure of positives and negatives (Segal et al. 2025 report both).

    The baseline for an unmemorised canary is 1/ln 2 ≈ 1.44 (Marek et al. 2026, appendix A.3). A game's negatives
    can include canaries inserted elsewhere (the adapt game's (1, 0) canaries were in pretraining), so the "never
    inserted" baseline rows ``exposure_*_never`` use only the units ``never_inserted`` marks (group (0, 0)), when
    given.
    """
    y, e = validate_scores(labels, exposures)
    n_pos, n_neg = int(y.sum()), int(len(y) - y.sum())
    groups = [("pos", y == 1), ("neg", y == 0)]
    if never_inserted is not None:
        never = np.asarray(never_inserted, dtype=bool)
        if never.shape != y.shape:
            raise MetricError(f"never_inserted has {never.size} entries for {y.size} samples: pass one per sample")
        if never.any():
            groups.append(("never", never))
    rows = []
    for name, sel in groups:
        vals = e[sel]
        rows.append(MetricRow(f"exposure_mean_{name}", float(vals.mean()), None, None, n_pos, n_neg))
        rows.append(MetricRow(f"exposure_p95_{name}", float(np.percentile(vals, 95)), None, None, n_pos, n_neg))
    return rows


#: a null game with fewer samples than this per side cannot show a leak of a few AUC points (issue: null power)
NULL_MIN_PER_SIDE = 200
FLAG_UNDERPOWERED = "underpowered"


def flag_underpowered_null(rows: list[MetricRow]) -> list[MetricRow]:
    """Flag the null game's rows ``underpowered`` when either side has fewer than :data:`NULL_MIN_PER_SIDE` units.

    Why: with 20 vs 20 samples a null AUC of 0.62 is within chance, so a clean null row says little; the flag keeps
    such a control from reading as evidence. An existing flag is kept and the new one appended.
    """
    out = []
    for r in rows:
        if min(r.n_pos, r.n_neg) < NULL_MIN_PER_SIDE:
            flag = FLAG_UNDERPOWERED if not r.flag else f"{r.flag},{FLAG_UNDERPOWERED}"
            r = MetricRow(r.metric, r.value, r.ci_low, r.ci_high, r.n_pos, r.n_neg, flag)
        out.append(r)
    return out
