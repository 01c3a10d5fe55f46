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
"""

from __future__ import annotations

import math
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
    unit: str = "record"         # the neighbouring relation: add/remove one adaptation record
    extra: dict = field(default_factory=dict)

    @classmethod
    def build(cls, *, sigma: float, sample_rate: float, steps: int, clip: float, delta: float,
              n_records: int, target_epsilon: float | None, accountant: str, **extra) -> "DPLedger":
        eps = epsilon_for(sigma, sample_rate, steps, delta)
        return cls(sigma=float(sigma), sample_rate=float(sample_rate), steps=int(steps),
                   epochs=float(steps * sample_rate), clip=float(clip), delta=float(delta),
                   target_epsilon=target_epsilon, accountant=accountant, batch=float(sample_rate * n_records),
                   n_records=int(n_records), extra=dict(extra), **eps)

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
