"""The Hush comparison world and sweep of Ganesh, McMahan, Nasr, Steinke and Thakurta 2025 (section 5.1, Figure 1).

Only what the construction guarantees is asserted: the world's structure, that c = 2^4 is exactly no
preprocessing (plain DP-SGD on all the data), that the LP keeps no more weight at a smaller c, that every σ
meets every secret's bound, and that the trend check applies its fixed rule. That σ falls with c is not
guaranteed (the LP maximises kept weight, not σ) and is not asserted.
"""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest

from bench.errors import ConfigError
from bench.secret_accounting import (
    account, kl_target, sampling_rates, secret_kl, secret_rates, solve_weights,
)
from defenses.hush import PAPER_KS, paper_sweep, paper_world

SMALL = 60  # secrets in the test world (≈ 1 000 examples)
KS = (-6, -3, 0, 3, 4)  # part of the paper's sweep: the ends, the reference and the smallest c below it


@pytest.fixture(scope="module")
def world():
    return paper_world(SMALL, seed=3)


@pytest.fixture(scope="module")
def sweep(world):
    return paper_sweep(*world, ks=KS)


def test_world_has_the_papers_structure():
    secrets, targets = paper_world(200, seed=0)
    counts = Counter(s for ss in secrets for s in ss)
    assert set(counts) == set(targets) and len(targets) == 200
    assert all(50 <= k <= 100 for k in counts.values())          # "roughly 50 to 100" abstracts per secret
    assert min(counts.values()) <= 60 and max(counts.values()) >= 90  # spread over the range, not one count
    assert all(ss and len(set(ss)) == len(ss) for ss in secrets)   # no secret-free example, no duplicates
    per = np.array([len(ss) for ss in secrets])
    assert 4.0 <= per.mean() <= 5.0                              # ≈ 4.4 rare words per abstract
    assert (per >= 2).mean() > 0.8 and per.max() >= 8             # examples carry several secrets, unevenly
    assert len(secrets) == pytest.approx(17 * 200, rel=0.03)      # 1.7 M abstracts / 100 000 secrets
    assert all(p == 1e-10 and 2e-4 <= r <= 1e-3 for p, r in targets.values())
    rs = np.array([r for _, r in targets.values()])
    assert rs.min() < 3e-4 and rs.max() > 9e-4


def test_world_is_seeded():
    assert paper_world(50, seed=7) == paper_world(50, seed=7)
    assert paper_world(50, seed=7) != paper_world(50, seed=8)


def test_world_too_small_for_a_secret_is_rejected():
    with pytest.raises(ConfigError, match="raise n_secrets"):
        paper_world(5)


def test_sweep_runs_the_papers_constants_at_the_papers_rates(sweep):
    assert list(PAPER_KS) == list(range(-6, 5)) and [r["k"] for r in sweep["rows"]] == list(KS)
    assert sweep["batch_size"] / sweep["n_examples"] == pytest.approx(2048 / 1.7e6)
    assert sweep["steps"] == 2000 and sweep["direction"] == "forward"


def test_c_2_to_the_4_is_no_preprocessing_and_plain_dp_sgd(sweep, world):
    secrets, targets = world
    ref = next(r for r in sweep["rows"] if r["k"] == 4)
    assert ref["kept_nonzero"] == 1.0 and ref["kept_weight"] == pytest.approx(1.0, abs=1e-9)
    assert ref["reduction"] == 1.0
    # what compare_with_dpsgd calibrates for plain DP-SGD: every weight 1, every record at rate B/n
    plain, rho = account(secrets, targets, batch_size=sweep["batch_size"], steps=sweep["steps"], c=1.0,
                         direction="forward", weights=np.ones(len(secrets)))
    assert np.allclose(rho, 2048 / 1.7e6)
    assert ref["sigma"] == pytest.approx(plain.sigma, rel=2e-3)  # both bisect to a relative tolerance of 1e-3


def test_smaller_c_keeps_less(sweep):
    kept = [r["kept_weight"] for r in sweep["rows"]]
    assert all(a <= b + 1e-9 for a, b in zip(kept, kept[1:]))   # the LP's feasible set grows with c
    assert next(r for r in sweep["rows"] if r["k"] == 3)["kept_weight"] < 1.0 - 1e-6  # 2^4 is the smallest
    assert sweep["rows"][0]["kept_nonzero"] < 0.5


def test_every_sigma_meets_every_secrets_bound(sweep, world):
    secrets, targets = world
    ids = sorted(targets)
    mus = {s: kl_target(*targets[s]) for s in ids}
    for row in (sweep["rows"][0], sweep["rows"][2]):
        rho = sampling_rates(solve_weights(secrets, mus, row["lp_c"]), sweep["batch_size"])
        rates = secret_rates(secrets, rho, ids)
        kls = [secret_kl(rates[s], row["sigma"], sweep["steps"], "forward") for s in ids]
        assert all(kl <= mus[s] * (1 + 1e-9) for kl, s in zip(kls, ids))
        assert max(kl / mus[s] for kl, s in zip(kls, ids)) > 0.99  # σ is the smallest: some secret is tight


def _fake(reductions_kept):
    rows = [{"k": k, "c": 2.0 ** k, "lp_c": 2.0 ** k, "kept_nonzero": kept, "kept_weight": kept,
             "sigma": 10.0 / red, "reduction": red} for k, (red, kept) in zip(range(-6, 5), reductions_kept)]
    return {"rows": rows, "n_secrets": 1, "n_examples": 1, "mean_secrets_per_example": 1.0, "batch_size": 1.0,
            "steps": 1}


@pytest.mark.parametrize("best,kept,holds", [(4.0, 0.05, True), (3.99, 1.0, False), (8.0, 0.9, True)])
def test_check_hush_applies_its_fixed_rule(monkeypatch, best, kept, holds):
    import defenses.hush
    from bench.trends import check_hush
    rows = [(1.5, 0.9)] * 10 + [(1.0, 1.0)]
    rows[3] = (best, kept)
    monkeypatch.setattr(defenses.hush, "paper_world", lambda **kw: ([], {}))
    monkeypatch.setattr(defenses.hush, "paper_sweep", lambda *a: _fake(rows))
    res = check_hush(None)
    assert res.holds is holds
    assert f"best {best:.2f}× at c = 2^-3" in res.numbers


def test_check_hush_ignores_the_reference_row(monkeypatch):
    import defenses.hush
    from bench.trends import check_hush
    monkeypatch.setattr(defenses.hush, "paper_world", lambda **kw: ([], {}))
    monkeypatch.setattr(defenses.hush, "paper_sweep", lambda *a: _fake([(1.2, 1.0)] * 10 + [(9.0, 1.0)]))
    assert check_hush(None).holds is False
