"""Secret-protection accounting of Hush (Ganesh et al. 2025): KL targets, weighting LP, σ calibration, bounds.

Ganesh et al. protect each secret j (all records carrying it) with a pair (p_j, r_j): an adversary whose
prior chance of reconstructing the secret is at most p_j must not succeed with probability above r_j.

* Lemma 3.2: if every pair of outputs on inputs that differ only in secret j has
  KL ≤ KL(Bern(r_j) ‖ Bern(p_j)), the posterior success is ≤ r_j. So μ_j = KL(Bern(r_j) ‖ Bern(p_j))
  (Algorithm 2 line 1, :func:`bernoulli_kl`), and conversely an achieved KL μ gives the bound
  r = the r ≥ p with KL(Bern(r) ‖ Bern(p)) = μ (:func:`posterior_bound`).
* Eq. (1): max Σ_i w_i  s.t.  Σ_{i ∋ j} w_i ≤ c·μ_j for every secret j, w_i ∈ [0, 1]
  (:func:`solve_weights`, ``scipy.optimize.linprog(method="highs")``); Algorithm 2 line 3 turns the
  weights into Poisson sampling rates ρ_i = B·w_i / Σ w (:func:`sampling_rates`).
* Accounting (section 4, after Theorem 1 of [CGM⁺24]): with per-record rates ρ_i and T steps of
  DP-SGD with noise multiplier σ, N(Σ_{i ∋ j} Bern(ρ_i), σ²)^T vs N(0, σ²)^T dominates the pair of outputs
  for inputs differing in secret j. KL is additive over the T steps, so the secret's KL is
  T·KL(Σ_s π_s N(s, σ²) ‖ N(0, σ²)) with π the Poisson-binomial law of the number of its records in a
  batch (:func:`mixture_kl`, computed by Gauss–Hermite quadrature and checked in tests against
  ``dp_accounting``'s privacy-loss distribution of the same mixture-of-Gaussians mechanism).
* Algorithm 2 lines 4–5: σ_j = min σ with KL ≤ μ_j (binary search in log σ), σ = max_j σ_j
  (:func:`calibrate_sigma`).

Deviation, on the safe side: Lemma 3.2 needs the divergence bound for every ordered pair of candidate
inputs, so by default both directions, KL(mixture ‖ N(0)) and KL(N(0) ‖ mixture), are bounded
(``direction="both"``); the paper writes only the first. ``direction="forward"`` gives the paper's
computation exactly.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field

import numpy as np

from bench.errors import ConfigError

DIRECTIONS = ("both", "forward", "reverse")
_GH_NODES = 160
_PMF_FLOOR = 1e-18


# ------------------------------------------------------------------------------------------ Lemma 3.2
def bernoulli_kl(r: float | np.ndarray, p: float | np.ndarray) -> float | np.ndarray:
    """KL(Bern(r) ‖ Bern(p)) in nats: μ_j of Algorithm 2 line 1 (Ganesh et al. 2025, Lemma 3.2)."""
    from scipy.special import xlogy
    r, p = np.asarray(r, dtype=float), np.asarray(p, dtype=float)
    out = xlogy(r, r) - xlogy(r, p) + xlogy(1 - r, 1 - r) - xlogy(1 - r, 1 - p)
    return float(out) if out.ndim == 0 else out


def kl_target(p: float, r: float) -> float:
    """μ_j for one secret, validated: 0 < p < r < 1 (a posterior no larger than the prior needs no data)."""
    if not (0.0 < p < 1.0 and 0.0 < r < 1.0):
        raise ConfigError(f"Hush: secret target (p={p!r}, r={r!r}) must have 0 < p, r < 1: fix secret_targets")
    if r <= p:
        raise ConfigError(f"Hush: secret target r={r!r} is not above its prior p={p!r}: no training can meet "
                          f"it; give r_j > p_j")
    return float(bernoulli_kl(r, p))


def posterior_bound(mu: float, p: float) -> float:
    """The posterior reconstruction bound of Lemma 3.2: the r ≥ p with KL(Bern(r) ‖ Bern(p)) = μ (1 if none)."""
    from scipy.optimize import brentq
    if mu <= 0:
        return float(p)
    if mu >= -math.log(p):  # KL(Bern(1) ‖ Bern(p)) = −log p: no r < 1 reaches μ
        return 1.0
    return float(brentq(lambda r: bernoulli_kl(r, p) - mu, p, 1.0,
                        xtol=1e-300, rtol=1e-12, maxiter=500))


# ------------------------------------------------------------------------------------------ eq. (1)
def incidence(secrets: Sequence[Sequence[str]], secret_ids: Sequence[str]):
    """Sparse (secrets × records) 0/1 matrix: entry (j, i) = 1 when record i carries secret j."""
    from scipy.sparse import csr_matrix
    col = {s: j for j, s in enumerate(secret_ids)}
    rows, cols = [], []
    for i, ss in enumerate(secrets):
        for s in set(ss):
            if s in col:
                rows.append(col[s])
                cols.append(i)
    return csr_matrix((np.ones(len(rows)), (rows, cols)), shape=(len(secret_ids), len(secrets)))


def solve_weights(secrets: Sequence[Sequence[str]], mu: Mapping[str, float], c: float) -> np.ndarray:
    """Per-record weights w solving Ganesh et al.'s LP (eq. 1) with HiGHS:
    max Σ w s.t. Σ_{i ∋ j} w_i ≤ c·μ_j, 0 ≤ w ≤ 1.

    Records carrying no listed secret are unconstrained (weight 1).
    """
    from scipy.optimize import linprog
    if not c > 0:
        raise ConfigError(f"Hush: LP constant c={c!r} must be > 0")
    ids = sorted(mu)
    n = len(secrets)
    if n == 0:
        raise ConfigError("Hush: no training records: check the adaptation data")
    a = incidence(secrets, ids)
    b = c * np.array([mu[s] for s in ids], dtype=float)
    res = linprog(-np.ones(n), A_ub=a if len(ids) else None, b_ub=b if len(ids) else None,
                  bounds=(0.0, 1.0), method="highs")
    if res.status != 0:  # pragma: no cover - the LP is always feasible (w = 0) and bounded
        raise ConfigError(f"Hush: the weighting LP failed ({res.message}): check secret_targets")
    return np.clip(res.x, 0.0, 1.0)


def sampling_rates(weights: np.ndarray, batch_size: float) -> np.ndarray:
    """Algorithm 2 line 3: ρ_i = B·w_i / Σ w, the Poisson rates with expected batch size B."""
    w = np.asarray(weights, dtype=float)
    total = float(w.sum())
    if total <= 0:
        raise ConfigError("Hush: the LP gave every record weight 0: raise the LP constant c or the r_j targets")
    rho = batch_size * w / total
    if rho.max() > 1.0 + 1e-12:
        raise ConfigError(f"Hush: batch size {batch_size} exceeds the LP's total weight {total:.3g}, so a record "
                          f"would be sampled with probability {rho.max():.3g} > 1: lower batch_size or raise c")
    return np.minimum(rho, 1.0)


# ------------------------------------------------------------------------------------------ KL accounting
def poisson_binomial(rates: Sequence[float]) -> np.ndarray:
    """Law of the number of successes of independent Bern(ρ_i): π[s] = P(S = s), s = 0..k."""
    pmf = np.array([1.0])
    for q in rates:
        pmf = np.concatenate([pmf * (1 - q), [0.0]]) + np.concatenate([[0.0], pmf * q])
    return pmf


def _components(pmf: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Support and weights of the sensitivity law; negligible tail mass moved to the largest count (safe side)."""
    s = np.arange(len(pmf), dtype=float)
    keep = pmf > _PMF_FLOOR
    tail = float(pmf[~keep].sum())
    sup, wts = s[keep], pmf[keep].copy()
    if tail > 0:
        sup, wts = np.append(sup, s[-1]), np.append(wts, tail)
    return sup, wts / wts.sum()



@functools.lru_cache(maxsize=4)
def _gauss_hermite(n: int) -> tuple[np.ndarray, np.ndarray]:
    """Gauss-Hermite nodes and weights, computed once: they cost most of a KL evaluation and never change."""
    t, w = np.polynomial.hermite.hermgauss(n)
    t.setflags(write=False)
    w.setflags(write=False)
    return t, w


def _quadrature(pmf: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray] | None:
    """The sensitivity law's support and weights, and Gauss–Hermite nodes with weights normalised for an
    expectation over a Gaussian; None for the point mass at 0, against which every KL here is 0."""
    sup, wts = _components(np.asarray(pmf, dtype=float))
    if len(sup) == 1 and sup[0] == 0:
        return None
    t, gw = _gauss_hermite(_GH_NODES)
    return sup, wts, t, gw / math.sqrt(math.pi)


def mixture_kl(pmf: np.ndarray, sigma: float, direction: str = "both") -> float:
    """Per-step KL between P = Σ_s π_s N(s, σ²) and Q = N(0, σ²) (sensitivities in units of the clip norm).

    ``forward`` = KL(P ‖ Q) (Ganesh et al.'s formula), ``reverse`` = KL(Q ‖ P), ``both`` = the larger. With
    ℓ(x) = log P(x)/Q(x) = logsumexp_s(log π_s + (2 s x − s²) / (2σ²)): KL(P‖Q) = Σ_s π_s E_{N(s,σ²)} ℓ and
    KL(Q‖P) = −E_{N(0,σ²)} ℓ, each expectation by Gauss–Hermite quadrature.
    """
    if direction not in DIRECTIONS:
        raise ConfigError(f"Hush: unknown KL direction {direction!r}: use one of {list(DIRECTIONS)}")
    if sigma <= 0:
        return math.inf
    quad = _quadrature(pmf)
    if quad is None:
        return 0.0
    sup, wts, t, gw = quad
    logw = np.log(wts)

    def ell(x: np.ndarray) -> np.ndarray:  # ℓ(x), Q being N(0, σ²)
        return _log_ratio_to_null(x, sup, logw, sigma)

    out = []
    if direction in ("both", "forward"):
        x = sup[:, None] + math.sqrt(2) * sigma * t[None, :]
        out.append(float(np.sum(wts[:, None] * gw[None, :] * ell(x))))
    if direction in ("both", "reverse"):
        out.append(float(-np.sum(gw * ell(math.sqrt(2) * sigma * t))))
    return max(0.0, max(out))


def replacement_kl(pmf: np.ndarray, sigma: float) -> float:
    """Per-step KL between P = Σ_s π_s N(s, σ²) and P⁻ = Σ_s π_s N(−s, σ²): the carriers' clipped gradients turned
    from +C to −C under the same Poisson draw, which Definition 3.1's adjacency (the carriers' content changed)
    allows and the accounting pair of :func:`mixture_kl` (the carriers removed) does not cover.

    Not used to calibrate σ: it is a lower bound on what that adjacency can cost, shown beside the ledger's KL
    (``scripts/hush_adjacency.py``; docs/hush.md, "Deviations"). Symmetric (x → −x), so one direction is enough:
    ℓ(x) = logsumexp_s(log π_s + (2 s x − s²)/(2σ²)) − logsumexp_s(log π_s − (2 s x + s²)/(2σ²)), averaged over P by
    Gauss–Hermite quadrature."""
    if sigma <= 0:
        return math.inf
    quad = _quadrature(pmf)
    if quad is None:
        return 0.0
    sup, wts, t, gw = quad
    logw = np.log(wts)
    x = sup[:, None] + math.sqrt(2) * sigma * t[None, :]
    ell = _log_ratio_to_null(x, sup, logw, sigma) - _log_ratio_to_null(-x, sup, logw, sigma)
    return max(0.0, float(np.sum(wts[:, None] * gw[None, :] * ell)))


def _log_ratio_to_null(x: np.ndarray, sup: np.ndarray, logw: np.ndarray, sigma: float) -> np.ndarray:
    """log P(x)/N(0, σ²)(x) for P = Σ_s π_s N(s, σ²): logsumexp_s(log π_s + (2 s x − s²)/(2σ²)), any shape of x.
    P⁻ (the mixture mirrored, s → −s) has log P⁻(x)/N(0, σ²)(x) = this at −x."""
    from scipy.special import logsumexp
    return logsumexp(logw + (2 * sup * x[..., None] - sup ** 2) / (2 * sigma ** 2), axis=-1)


def secret_kl(rates: Sequence[float], sigma: float, steps: int, direction: str = "both") -> float:
    """KL after T steps for one secret whose records have Poisson rates ``rates``: T × the per-step KL."""
    return int(steps) * mixture_kl(poisson_binomial(rates), sigma, direction)


def sigma_for_kl(rates: Sequence[float], steps: int, mu: float, *, direction: str = "both",
                 rel_tol: float = 1e-3, start: float | None = None) -> float:
    """Algorithm 2 line 4: min σ with T·KL ≤ μ, by binary search in log σ; the returned σ satisfies it."""
    if mu <= 0:
        raise ConfigError(f"Hush: KL target {mu!r} must be > 0")
    if not any(r > 0 for r in rates):
        return 0.0

    def ok(s: float) -> bool:
        return secret_kl(rates, s, steps, direction) <= mu

    hi = start if start and start > 0 else 1.0
    while not ok(hi):
        hi *= 2.0
        if hi > 1e8:  # pragma: no cover
            raise ConfigError("Hush: no noise multiplier below 1e8 meets the KL target: raise r_j or lower c")
    lo = hi / 2.0
    while ok(lo) and lo > 1e-6:
        hi, lo = lo, lo / 2.0
    while hi / lo > 1.0 + rel_tol:
        mid = math.sqrt(lo * hi)
        if ok(mid):
            hi = mid
        else:
            lo = mid
    return hi


@dataclass
class SecretLedger:
    """What Hush reports: σ, the per-secret KL and posterior bounds, and how the LP shaped the data."""

    sigma: float
    steps: int
    batch_size: float
    c: float
    direction: str
    n_records: int
    n_secrets: int
    retained_weight: float                     # Σ w_i: the expected records kept by the LP
    zero_weight_records: int
    secrets: dict = field(default_factory=dict)  # id -> {p, r_target, mu_target, kl, r_bound, n_records}

    @property
    def bounds(self) -> np.ndarray:
        return np.array([v["r_bound"] for v in self.secrets.values()], dtype=float)

    def summary(self) -> dict:
        b = self.bounds
        slack = [v["r_bound"] <= v["r_target"] * (1 + 1e-6) for v in self.secrets.values()]
        return {"sigma": self.sigma, "steps": self.steps, "batch_size": self.batch_size, "c": self.c,
                "direction": self.direction, "n_records": self.n_records, "n_secrets": self.n_secrets,
                "retained_weight": self.retained_weight, "zero_weight_records": self.zero_weight_records,
                "max_bound": float(b.max()) if len(b) else None, "mean_bound": float(b.mean()) if len(b) else None,
                "all_targets_met": bool(all(slack))}

    def to_dict(self) -> dict:
        return asdict(self)


def secret_rates(secrets: Sequence[Sequence[str]], rho: np.ndarray, ids: Sequence[str]) -> dict[str, list[float]]:
    """Per secret, the Poisson rates of the records that carry it."""
    out: dict[str, list[float]] = {s: [] for s in ids}
    for i, ss in enumerate(secrets):
        for s in set(ss):
            if s in out:
                out[s].append(float(rho[i]))
    return out


def calibrate_sigma(secrets: Sequence[Sequence[str]], targets: Mapping[str, tuple[float, float]],
                    rho: np.ndarray, steps: int, *, direction: str = "both", rel_tol: float = 1e-3) -> float:
    """Algorithm 2 lines 4–5: σ = max_j σ_j. A secret already met at the running maximum needs no search."""
    ids = sorted(targets)
    rates = secret_rates(secrets, rho, ids)
    mus = {s: kl_target(*targets[s]) for s in ids}
    # the secrets with most expected records per unit of KL budget first: they usually set σ
    order = sorted(ids, key=lambda s: -sum(x * x for x in rates[s]) / mus[s])
    sigma, cache = 0.0, {}
    for s in order:
        key = (tuple(sorted(round(x, 15) for x in rates[s])), mus[s])
        if key in cache:
            continue
        cache[key] = True
        if sigma > 0 and secret_kl(rates[s], sigma, steps, direction) <= mus[s]:
            continue
        sigma = max(sigma, sigma_for_kl(rates[s], steps, mus[s], direction=direction, rel_tol=rel_tol,
                                        start=sigma or None))
    return sigma


def account(secrets: Sequence[Sequence[str]], targets: Mapping[str, tuple[float, float]], *, batch_size: float,
            steps: int, c: float | None, direction: str = "both", weights: np.ndarray | None = None,
            sigma: float | None = None) -> tuple[SecretLedger, np.ndarray]:
    """The whole accounting side of Algorithm 2: (ledger, per-record rates ρ).

    ``weights`` overrides the LP (all ones = plain DP-SGD on the whole data); ``sigma`` overrides the
    calibration (then the ledger reports what that σ gives). ``c = None`` picks the median of
    |D_j| / μ_j over secrets, so about half the secrets constrain the LP (Ganesh et al. tune c by a sweep).
    """
    ids = sorted(targets)
    if not ids:
        raise ConfigError("Hush: no secret targets: use a secret-bearing task (e.g. `secrets`)")
    mus = {s: kl_target(*targets[s]) for s in ids}
    counts = {s: 0 for s in ids}
    for ss in secrets:
        for s in set(ss):
            if s in counts:
                counts[s] += 1
    if c is None:
        c = float(np.median([counts[s] / mus[s] for s in ids if counts[s] > 0] or [1.0]))
    w = solve_weights(secrets, mus, c) if weights is None else np.asarray(weights, dtype=float)
    rho = sampling_rates(w, batch_size)
    if sigma is None:
        sigma = calibrate_sigma(secrets, targets, rho, steps, direction=direction)
    rates = secret_rates(secrets, rho, ids)
    per = {}
    for s in ids:
        p, r = targets[s]
        kl = secret_kl(rates[s], sigma, steps, direction) if sigma > 0 else (math.inf if any(rates[s]) else 0.0)
        per[s] = {"p": float(p), "r_target": float(r), "mu_target": mus[s], "kl": kl,
                  "r_bound": posterior_bound(kl, p) if math.isfinite(kl) else 1.0, "n_records": counts[s],
                  "weight": float(sum(w[i] for i, ss in enumerate(secrets) if s in ss))}
    ledger = SecretLedger(sigma=float(sigma), steps=int(steps), batch_size=float(batch_size), c=float(c),
                          direction=direction, n_records=len(secrets), n_secrets=len(ids),
                          retained_weight=float(w.sum()), zero_weight_records=int((w <= 1e-9).sum()), secrets=per)
    return ledger, rho


def compare_with_dpsgd(secrets: Sequence[Sequence[str]], targets: Mapping[str, tuple[float, float]], *,
                       batch_size: float, steps: int, c: float | None = None, direction: str = "both") -> dict:
    """Ganesh et al.'s comparison (Figure 1c): σ Hush needs vs σ plain DP-SGD on the whole data needs, same secrets.

    Plain DP-SGD samples every record at B/n (all LP weights 1) for the same T steps and batch size B; both
    σ are calibrated so every secret's KL bound (hence posterior bound r_j) holds.
    """
    hush, _ = account(secrets, targets, batch_size=batch_size, steps=steps, c=c, direction=direction)
    plain, _ = account(secrets, targets, batch_size=batch_size, steps=steps, c=hush.c, direction=direction,
                       weights=np.ones(len(secrets)))
    return {"hush_sigma": hush.sigma, "dpsgd_sigma": plain.sigma,
            "ratio": plain.sigma / hush.sigma if hush.sigma > 0 else math.inf,
            "c": hush.c, "retained_weight": hush.retained_weight, "n_records": len(secrets),
            "n_secrets": hush.n_secrets, "steps": int(steps), "batch_size": float(batch_size),
            "hush": hush.summary(), "dpsgd": plain.summary()}
