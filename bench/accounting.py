"""The DP ledger: calibrate DP-SGD noise for a target (ε, δ) and recompute ε with two accountants.

Opacus keeps the three parts of DP-SGD apart: the engine (per-sample gradients,
Poisson sampling), the optimizer (clip + Gaussian noise) and the accountant
(privacy loss of the subsampled Gaussian mechanism). This module is the
accountant side only, so it can be tested without training anything:

* :func:`noise_for_epsilon` finds the noise multiplier σ that spends at most
  ``target_eps`` after ``steps`` steps at sampling rate ``q`` (binary search,
  :func:`opacus.accountants.utils.get_noise_multiplier`).
* :func:`epsilon_for` recomputes ε for (σ, q, steps, δ) with BOTH the RDP
  accountant (Mironov 2017; Mironov, Talwar, Zhang 2019) and the PRV accountant
  (Gopi, Lee, Wutschitz 2021); each result, or the error text of the one that
  failed, is recorded.
* :class:`DPLedger` is what a DP defense reports as its guarantee.
* :func:`group_privacy` and :func:`largest_group` turn the per-record (ε, δ) into the
  guarantee of the largest group of records that a membership game treats as one
  unit (a user's records, the records carrying one secret, a text repeated r times).
* :func:`privacy_units` assigns each record to the unit a unit-level DP-SGD clips as one (McMahan et al. 2018;
  Chua et al. 2024), so the guarantee covers the whole unit without the group bound's k·ε.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field

from bench.errors import ConfigError

ACCOUNTANTS = ("rdp", "prv")


def _check(sample_rate: float, steps: int, delta: float) -> None:
    if not 0.0 < sample_rate <= 1.0:
        raise ConfigError(f"DP accounting: sample rate {sample_rate!r} must be in (0, 1]: "
                          f"use a batch size no larger than the number of records")
    if int(steps) < 1:
        raise ConfigError(f"DP accounting: {steps!r} steps: train for at least one step")
    if not 0.0 < delta < 1.0:
        raise ConfigError(f"DP accounting: delta {delta!r} must be in (0, 1)")


def _accountant(name: str):
    from opacus.accountants import PRVAccountant, RDPAccountant
    if name == "rdp":
        return RDPAccountant()
    if name == "prv":
        return PRVAccountant()
    raise ConfigError(f"DP accounting: unknown accountant {name!r}: use one of {list(ACCOUNTANTS)}")


def epsilon_with(accountant: str, sigma: float, sample_rate: float, steps: int, delta: float) -> float:
    """ε of ``steps`` compositions of the Poisson-subsampled Gaussian mechanism (σ, q) at δ, one accountant."""
    _check(sample_rate, steps, delta)
    if sigma <= 0:
        return math.inf
    acc = _accountant(accountant)
    acc.history = [(float(sigma), float(sample_rate), int(steps))]
    return float(acc.get_epsilon(delta=delta))


def epsilon_for(sigma: float, sample_rate: float, steps: int, delta: float) -> dict:
    """ε recomputed with both the RDP and the PRV accountants.

    Returns ``{"eps_rdp", "eps_prv", "rdp_error", "prv_error"}``: an accountant that
    raises leaves its ε as None and its error text in ``*_error`` (never silently dropped).
    """
    _check(sample_rate, steps, delta)
    out: dict = {}
    for name in ACCOUNTANTS:
        try:
            out[f"eps_{name}"] = epsilon_with(name, sigma, sample_rate, steps, delta)
            out[f"{name}_error"] = None
        except Exception as exc:  # record which one failed, keep the other
            out[f"eps_{name}"] = None
            out[f"{name}_error"] = f"{type(exc).__name__}: {exc}"
    return out


def noise_for_epsilon(target_eps: float, delta: float, sample_rate: float, steps: int,
                      accountant: str = "rdp") -> float:
    """Smallest σ (to a tight tolerance) such that ``accountant`` gives ε ≤ ``target_eps`` after ``steps``.

    Opacus' search stops within an absolute ε tolerance of 0.01 by default, which is
    10 % of ε = 0.1; the tolerance here is relative (0.5 % of the target).
    """
    from opacus.accountants.utils import get_noise_multiplier

    _check(sample_rate, steps, delta)
    if not (target_eps > 0) or math.isinf(target_eps):
        raise ConfigError(f"DP accounting: target epsilon {target_eps!r} must be a finite number > 0")
    _accountant(accountant)  # validates the name
    try:
        return float(get_noise_multiplier(target_epsilon=float(target_eps), target_delta=float(delta),
                                          sample_rate=float(sample_rate), steps=int(steps),
                                          accountant=accountant,
                                          epsilon_tolerance=min(0.01, 0.005 * float(target_eps))))
    except ValueError as exc:
        raise ConfigError(f"DP accounting: no noise multiplier reaches epsilon {target_eps} at delta {delta} "
                          f"with sample rate {sample_rate:.4g} over {steps} steps ({exc}): "
                          f"raise epsilon, lower the sample rate or train fewer steps") from None


GROUP_BY = ("user", "secret", "identical text")


def group_privacy(epsilon: float, delta: float, k: int) -> tuple[float, float]:
    """(ε_k, δ_k) for a group of ``k`` records of an (ε, δ)-DP mechanism: ε_k = k·ε, δ_k = k·e^{(k−1)ε}·δ.

    Why: DP-SGD accounts one record, but a user, a secret or a repeated canary is k records, and the
    attacker's game is about the whole group. Chaining the (ε, δ) inequality along k neighbouring datasets
    gives Pr[M(D) ∈ S] ≤ e^{kε} Pr[M(D') ∈ S] + δ·Σ_{i<k} e^{iε}; each of the k terms of the sum is at most
    e^{(k−1)ε}, which is the closed form used here (Dwork & Roth 2014, Theorem 2.2, is the pure ε case).
    δ_k can exceed 1: then the bound says nothing about that group. It is inf when e^{(k−1)ε} overflows.

    A slightly negative ε (Opacus' RDP → (ε, δ) conversion, Balle et al. 2020, returns one under very large
    noise) is raised to 0 first: (ε, δ)-DP implies (0, δ)-DP then, and the closed form needs ε ≥ 0.
    """
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise ConfigError(f"group privacy: group size {k!r} must be an integer >= 1: count the records of the group")
    if math.isnan(epsilon):
        raise ConfigError("group privacy: epsilon is NaN: pass the per-record epsilon of the accountant")
    if not 0.0 <= delta < 1.0:
        raise ConfigError(f"group privacy: delta {delta!r} must be in [0, 1): pass the per-record delta")
    epsilon = max(float(epsilon), 0.0)
    if k == 1:
        return epsilon, float(delta)
    if delta == 0.0:
        return k * float(epsilon), 0.0
    log_delta_k = math.log(k) + (k - 1) * epsilon + math.log(delta)
    return k * float(epsilon), (math.exp(log_delta_k) if log_delta_k < 709.0 else math.inf)


def largest_group(texts: Sequence[str], users: Sequence[str] | None = None,
                  secrets: Sequence[Sequence[str]] | None = None) -> tuple[int, str]:
    """Size k of the largest group of records that one membership unit spans, and what groups them.

    Why: the defense sees only its own data, so it bounds the unit it can see: the most records of one
    owner when ``users`` is given (user-level games), else the most records carrying one secret when
    ``secrets`` is given and some record carries one (secret-level games), else the largest multiplicity of
    one identical text (a canary inserted r times is r records). ``users`` and ``secrets`` are aligned with
    ``texts``; a record that names a secret twice counts once for it.
    """
    if not texts:
        raise ConfigError("group privacy: no records: the group size of empty training data is undefined")
    for name, aligned in (("users", users), ("secrets", secrets)):
        if aligned is not None and len(aligned) != len(texts):
            raise ConfigError(f"group privacy: {len(aligned)} {name} for {len(texts)} texts: align them with "
                              f"the texts (one entry per text)")
    if users is not None:
        return max(Counter(users).values()), "user"
    if secrets is not None:
        carried = Counter(s for per_text in secrets for s in set(per_text))
        if carried:
            return max(carried.values()), "secret"
    return max(Counter(texts).values()), "identical text"


#: the privacy units a DP defense can clip as one: ``auto`` takes the unit its data names (as largest_group)
PRIVACY_UNITS = ("record", "user", "secret", "text", "auto")


def privacy_units(texts: Sequence[str], users: Sequence[str] | None = None,
                  secrets: Sequence[Sequence[str]] | None = None, by: str = "record") -> tuple[list[int], str]:
    """Unit index of each record (0, 1, ... in order of first appearance) and the unit's name.

    Why: user-level DP-SGD samples and clips whole units, so adding or removing one unit (all its records)
    moves the released sum by at most the clipping norm. ``user``: the records of one owner. ``secret``: the
    records that carry one secret; a record carrying two secrets joins their units (connected components), so
    every secret's records stay inside one unit; a record carrying none is a unit alone. ``text``: identical
    texts (a canary inserted r times). ``auto``: ``user`` when owners are given, else ``secret`` when some
    record carries one, else ``text``.
    """
    if by not in PRIVACY_UNITS:
        raise ConfigError(f"privacy unit {by!r} is unknown: use one of {', '.join(PRIVACY_UNITS)}")
    for name, aligned in (("users", users), ("secrets", secrets)):
        if aligned is not None and len(aligned) != len(texts):
            raise ConfigError(f"privacy units: {len(aligned)} {name} for {len(texts)} texts: align them with the "
                              f"texts (one entry per text)")
    if by == "auto":
        by = ("user" if users is not None
              else "secret" if secrets is not None and any(len(s) for s in secrets) else "text")
    if by == "record":
        return list(range(len(texts))), by
    if by == "user":
        if users is None:
            raise ConfigError("privacy unit 'user' needs the owner of each text, which this task does not name: "
                              "use a user-stratified task (e.g. synthetic_users) or unit record, text or auto")
        keys: list = list(users)
    elif by == "text":
        keys = list(texts)
    else:
        if secrets is None:
            raise ConfigError("privacy unit 'secret' needs the secrets each text carries, which this task does not "
                              "name: use a secret-bearing task (e.g. synthetic_secrets) or unit record, text or auto")
        parent = list(range(len(texts)))

        def root(i: int) -> int:
            while parent[i] != i:
                parent[i] = parent[parent[i]]
                i = parent[i]
            return i

        first: dict[str, int] = {}
        for i, carried in enumerate(secrets):
            for s in carried:
                j = first.setdefault(s, i)
                ri, rj = root(i), root(j)
                if ri != rj:
                    parent[max(ri, rj)] = min(ri, rj)
        keys = [root(i) for i in range(len(texts))]
    index: dict = {}
    return [index.setdefault(k, len(index)) for k in keys], by


@dataclass
class DPLedger:
    """Everything needed to re-derive (and audit) the guarantee of one DP-SGD run."""

    sigma: float                 # noise multiplier: noise std = sigma * clip
    sample_rate: float           # Poisson sampling probability q of each record per step
    steps: int
    epochs: float                # steps * sample_rate
    clip: float                  # per-sample L2 clipping norm C
    delta: float
    target_epsilon: float | None  # None when sigma was given (noise_multiplier override)
    accountant: str              # accountant used to calibrate sigma ("given" when overridden)
    eps_rdp: float | None = None
    eps_prv: float | None = None
    rdp_error: str | None = None
    prv_error: str | None = None
    batch: float = 0.0           # expected batch size q * n
    n_records: int = 0
    poisson: bool = True
    unit: str = "record"         # the neighbouring relation: add/remove one adaptation record (or one unit)
    extra: dict = field(default_factory=dict)

    @classmethod
    def build(cls, *, sigma: float, sample_rate: float, steps: int, clip: float, delta: float,
              n_records: int, target_epsilon: float | None, accountant: str, unit: str = "record",
              n_units: int | None = None, **extra) -> "DPLedger":
        """``n_units`` (with ``unit`` other than record): the number of units sampled, whose expected count per
        step is the batch; it is recorded next to ``n_records``."""
        if unit != "record":
            if n_units is None:
                raise ConfigError(f"DPLedger: unit {unit!r} needs n_units, the number of units sampled")
            extra = {**extra, "n_units": int(n_units)}
        n = n_records if unit == "record" else n_units
        eps = epsilon_for(sigma, sample_rate, steps, delta)
        return cls(sigma=float(sigma), sample_rate=float(sample_rate), steps=int(steps),
                   epochs=float(steps * sample_rate), clip=float(clip), delta=float(delta),
                   target_epsilon=target_epsilon, accountant=accountant, batch=float(sample_rate * n),
                   n_records=int(n_records), unit=unit, extra=dict(extra), **eps)

    @property
    def epsilon(self) -> float:
        """The reported ε: that of the accountant which calibrated σ (RDP when σ was given), else the other.

        inf when neither could be computed (no guarantee is claimed then).
        """
        order = (self.eps_prv, self.eps_rdp) if self.accountant == "prv" else (self.eps_rdp, self.eps_prv)
        for v in order:
            if v is not None:
                return float(v)
        return math.inf

    def to_dict(self) -> dict:
        d = asdict(self)
        extra = d.pop("extra")
        d.update(extra)
        return d
