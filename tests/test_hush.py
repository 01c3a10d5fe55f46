"""Hush (Ganesh et al. 2025, Algorithm 2): KL targets, the LP of eq. (1), KL accounting, σ search, Poisson
sampling, training."""

from __future__ import annotations

import itertools
import math
import random

import numpy as np
import pytest
import torch

from bench.defense import TrainContext
from bench.errors import ConfigError
from bench.game import AdaptationData
from bench.secret_accounting import (
    account, bernoulli_kl, calibrate_sigma, compare_with_dpsgd, incidence, kl_target, mixture_kl, poisson_binomial,
    posterior_bound, sampling_rates, secret_kl, sigma_for_kl, solve_weights,
)
from defenses.hush import Hush, poisson_batches


# ----------------------------------------------------------------------------------- Lemma 3.2
@pytest.mark.parametrize("r,p", [(1e-3, 1e-10), (0.3, 0.1), (0.9, 0.5), (0.5, 0.4999), (1.0, 0.2)])
def test_bernoulli_kl_matches_an_independent_computation(r, p):
    from scipy.stats import entropy
    ref = r * math.log(r / p) + ((1 - r) * math.log((1 - r) / (1 - p)) if r < 1 else 0.0)
    assert bernoulli_kl(r, p) == pytest.approx(ref, rel=1e-12)
    assert bernoulli_kl(r, p) == pytest.approx(float(entropy([r, 1 - r], [p, 1 - p])), rel=1e-9)


@pytest.mark.parametrize("r,p", [(1e-3, 1e-10), (2e-4, 1e-10), (0.3, 0.1), (0.7, 0.5)])
def test_posterior_bound_inverts_the_kl(r, p):
    assert posterior_bound(bernoulli_kl(r, p), p) == pytest.approx(r, rel=1e-9)
    assert posterior_bound(0.0, p) == p and posterior_bound(-math.log(p) + 1, p) == 1.0
    assert posterior_bound(0.5 * bernoulli_kl(r, p), p) < r  # less divergence, smaller posterior


def test_kl_target_rejects_unprotectable_targets():
    with pytest.raises(ConfigError, match="r_j > p_j"):
        kl_target(0.2, 0.1)
    with pytest.raises(ConfigError):
        kl_target(0.0, 0.1)


# ----------------------------------------------------------------------------------- eq. (1)
def _brute_force_lp(a: np.ndarray, b: np.ndarray) -> float:
    """max Σw s.t. a w ≤ b, 0 ≤ w ≤ 1 by enumerating every vertex (n active constraints)."""
    m, n = a.shape
    rows = np.vstack([a, np.eye(n), -np.eye(n)])
    rhs = np.concatenate([b, np.ones(n), np.zeros(n)])
    best = -np.inf
    for act in itertools.combinations(range(len(rows)), n):
        sub = rows[list(act)]
        if abs(np.linalg.det(sub)) < 1e-12:
            continue
        w = np.linalg.solve(sub, rhs[list(act)])
        if np.all(rows @ w <= rhs + 1e-9):
            best = max(best, float(w.sum()))
    return best


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_lp_weights_satisfy_the_constraints_and_are_optimal(seed):
    rng = np.random.default_rng(seed)
    n, m = 6, 3
    ids = [f"s{j}" for j in range(m)]
    secrets = [tuple(s for s in ids if rng.random() < 0.5) for _ in range(n)]
    mu = {s: float(rng.uniform(0.5, 2.0)) for s in ids}
    c = 1.0
    w = solve_weights(secrets, mu, c)
    a = incidence(secrets, sorted(mu)).toarray()
    b = c * np.array([mu[s] for s in sorted(mu)])
    assert np.all(w >= -1e-12) and np.all(w <= 1 + 1e-12)
    assert np.all(a @ w <= b + 1e-9)
    for i, ss in enumerate(secrets):
        if not ss:
            assert w[i] == pytest.approx(1.0)  # an unconstrained record keeps all its weight
    assert w.sum() == pytest.approx(_brute_force_lp(a, b), abs=1e-7)


def test_lp_extremes_of_c_and_sampling_rates():
    secrets = [("a",), ("a",), ("a", "b"), ("b",), ()]
    mu = {"a": 0.01, "b": 0.02}
    assert np.allclose(solve_weights(secrets, mu, 1e6), 1.0)  # c large: no preprocessing (Ganesh et al., section 4)
    w = solve_weights(secrets, mu, 10.0)
    assert w[:3].sum() == pytest.approx(0.1) and w[2:4].sum() <= 0.2 + 1e-9 and w[4] == pytest.approx(1.0)
    rho = sampling_rates(w, 1.0)
    assert rho.sum() == pytest.approx(1.0) and np.allclose(rho / rho.max(), w / w.max())
    with pytest.raises(ConfigError, match="lower batch_size"):
        sampling_rates(w, 2.0)


# ----------------------------------------------------------------------------------- KL accounting
def test_poisson_binomial_matches_enumeration():
    rates = [0.1, 0.5, 0.25, 0.9]
    ref = np.zeros(5)
    for bits in itertools.product([0, 1], repeat=4):
        ref[sum(bits)] += np.prod([r if b else 1 - r for r, b in zip(rates, bits)])
    np.testing.assert_allclose(poisson_binomial(rates), ref, atol=1e-15)


@pytest.mark.parametrize("s,sigma", [(1, 0.5), (3, 2.0), (2, 7.0)])
def test_mixture_kl_of_a_point_mass_is_the_gaussian_kl(s, sigma):
    pmf = np.zeros(s + 1)
    pmf[s] = 1.0
    for d in ("forward", "reverse", "both"):
        assert mixture_kl(pmf, sigma, d) == pytest.approx(s * s / (2 * sigma ** 2), rel=1e-9)


def test_mixture_kl_matches_dp_accounting_privacy_loss_distribution():
    """The quadrature equals the mean privacy loss of dp_accounting's mixture-of-Gaussians PLD, both directions."""
    from dp_accounting.pld import privacy_loss_distribution as pld_lib

    pmf = poisson_binomial([0.1, 0.3, 0.05])
    sigma = 2.0
    pld = pld_lib.from_mixture_gaussian_mechanism(sigma, list(range(len(pmf))), list(pmf),
                                                  value_discretization_interval=1e-3)

    def mean(pm) -> float:
        losses = (pm._lower_loss + np.arange(len(pm._probs))) * pm._discretization
        return float(np.sum(pm._probs * losses))

    assert mixture_kl(pmf, sigma, "forward") == pytest.approx(mean(pld._pmf_remove), abs=2e-6)
    assert mixture_kl(pmf, sigma, "reverse") == pytest.approx(mean(pld._pmf_add), abs=2e-6)
    assert mixture_kl(pmf, sigma, "both") == max(mixture_kl(pmf, sigma, "forward"), mixture_kl(pmf, sigma, "reverse"))
    # joint convexity: the mixture leaks no more than its components on average
    bound = sum(pmf[s] * s * s / (2 * sigma ** 2) for s in range(len(pmf)))
    assert 0 < mixture_kl(pmf, sigma, "forward") <= bound


def test_secret_kl_composes_over_steps_and_falls_with_sigma():
    rates = [0.02] * 10
    one = secret_kl(rates, 3.0, 1)
    assert secret_kl(rates, 3.0, 250) == pytest.approx(250 * one, rel=1e-12)
    ks = [secret_kl(rates, s, 100) for s in (0.5, 1.0, 2.0, 4.0, 8.0)]
    assert all(a > b for a, b in zip(ks, ks[1:]))


@pytest.mark.parametrize("r", [2e-4, 5e-4, 1e-3])
def test_sigma_search_meets_the_bound_within_tolerance(r):
    rates, steps, p = [0.01] * 40, 800, 1e-10
    mu = kl_target(p, r)
    sigma = sigma_for_kl(rates, steps, mu, rel_tol=1e-3)
    assert secret_kl(rates, sigma, steps) <= mu
    assert secret_kl(rates, sigma / 1.002, steps) > mu        # minimal to the tolerance
    assert posterior_bound(secret_kl(rates, sigma, steps), p) == pytest.approx(r, rel=0.01)
    assert posterior_bound(secret_kl(rates, sigma, steps), p) <= r


def test_sigma_is_monotone_in_r_and_the_calibration_takes_the_worst_secret():
    rates, steps, p = [0.01] * 40, 800, 1e-10
    sig = [sigma_for_kl(rates, steps, kl_target(p, r)) for r in (1e-4, 3e-4, 1e-3, 1e-2)]
    assert all(a > b for a, b in zip(sig, sig[1:]))
    secrets = [("a",)] * 40 + [("b",)] * 10 + [()] * 50
    targets = {"a": (p, 1e-3), "b": (p, 1e-3)}
    rho = np.full(100, 0.01)
    sigma = calibrate_sigma(secrets, targets, rho, steps)
    assert sigma == pytest.approx(sigma_for_kl([0.01] * 40, steps, kl_target(p, 1e-3)), rel=2e-3)
    assert sigma > sigma_for_kl([0.01] * 10, steps, kl_target(p, 1e-3))


def _realistic(n: int = 1500, n_secrets: int = 120, seed: int = 0) -> tuple[list, dict]:
    """Ganesh et al. 2025, section 5.1, in small: uneven secret counts, p = 1e-10, r_j uniform in [2e-4, 1e-3]."""
    rng = np.random.default_rng(seed)
    secrets: list[list[str]] = [[] for _ in range(n)]
    for j in range(n_secrets):
        k = int(min(60, 1 + rng.zipf(1.8)))
        for i in rng.choice(n, size=k, replace=False):
            secrets[i].append(f"s{j}")
    return secrets, {f"s{j}": (1e-10, float(rng.uniform(2e-4, 1e-3))) for j in range(n_secrets)}


def test_hush_needs_less_noise_than_dp_sgd_on_the_whole_data():
    """Ganesh et al.'s claim (2025, Figure 1c): the LP-weighted sampling meets every secret's bound at a smaller σ."""
    secrets, targets = _realistic()
    out = compare_with_dpsgd(secrets, targets, batch_size=32, steps=500)
    assert out["hush"]["all_targets_met"] and out["dpsgd"]["all_targets_met"]
    assert out["hush_sigma"] < out["dpsgd_sigma"] and out["ratio"] > 1.5
    assert out["hush"]["max_bound"] <= max(r for _, r in targets.values()) * (1 + 1e-9)
    # a c so large that the LP keeps every record is plain DP-SGD: the same σ
    same = compare_with_dpsgd(secrets, targets, batch_size=32, steps=500, c=1e9)
    assert same["retained_weight"] == pytest.approx(len(secrets)) and same["ratio"] == pytest.approx(1.0, rel=1e-9)


def test_account_reports_each_secrets_bound():
    secrets, targets = _realistic(n=400, n_secrets=30, seed=1)
    ledger, rho = account(secrets, targets, batch_size=16, steps=200, c=None)
    assert ledger.n_secrets == 30 and len(rho) == 400 and rho.sum() == pytest.approx(16)
    for s, v in ledger.secrets.items():
        rates = [rho[i] for i, ss in enumerate(secrets) if s in ss]
        kl = secret_kl(rates, ledger.sigma, 200)
        assert v["kl"] == pytest.approx(kl) and v["kl"] <= v["mu_target"] * (1 + 1e-9)
        assert v["r_bound"] == pytest.approx(posterior_bound(kl, targets[s][0])) and v["r_bound"] <= targets[s][1]


# ----------------------------------------------------------------------------------- Poisson sampler
def test_poisson_sampler_rates_match_the_weights():
    rho = np.array([0.0, 0.01, 0.05, 0.2, 0.5, 1.0])
    steps = 4000
    counts = np.zeros(len(rho))
    sizes = []
    for batch in poisson_batches(rho, steps, seed=3):
        counts[batch] += 1
        sizes.append(len(batch))
    freq = counts / steps
    se = np.sqrt(rho * (1 - rho) / steps)
    assert np.all(np.abs(freq - rho) <= 4 * se + 1e-12)
    assert counts[0] == 0 and counts[-1] == steps
    assert np.mean(sizes) == pytest.approx(rho.sum(), abs=0.05)
    again = list(poisson_batches(rho, 5, seed=3))
    assert again == list(poisson_batches(rho, 5, seed=3))  # seeded


# ----------------------------------------------------------------------------------- a tiny adaptation run
WORDS = "alpha beta gamma delta river stone cloud market doctor patient record street garden window".split()


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    from transformers import AutoTokenizer

    from bench.modeling import ModelSpec
    from bench.tokenizer import train_bpe_tokenizer

    rng = random.Random(0)
    codes = [f"zq{rng.randrange(10 ** 4, 10 ** 5)}" for _ in range(6)]
    texts, secrets = [], []
    for i in range(48):
        carried = tuple(c for j, c in enumerate(codes) if (i * (j + 1)) % (j + 3) == 0)
        words = [rng.choice(WORDS) for _ in range(10)] + list(carried)
        rng.shuffle(words)
        texts.append(" ".join(words) + ".")
        secrets.append(carried)
    targets = {c: (1e-10, 2e-4 + 1e-4 * j) for j, c in enumerate(codes)}
    tok_dir = tmp_path_factory.mktemp("bpe")
    train_bpe_tokenizer(texts, tok_dir, vocab_size=256)
    tok = AutoTokenizer.from_pretrained(str(tok_dir))
    ctx = TrainContext(tok, torch.device("cpu"), 64, seed=0, autocast_bf16=False, progress=False)
    spec = ModelSpec("t", num_layers=2, hidden_size=64, num_heads=4, context_length=64)
    return {"ctx": ctx, "spec": spec, "tok": tok,
            "data": AdaptationData(tuple(texts), secrets=tuple(secrets), secret_targets=targets)}


def test_hush_adapts_a_model_and_reports_its_guarantee(world):
    from bench.modeling import build_scratch_model

    torch.set_num_threads(1)
    model = build_scratch_model(world["spec"], world["tok"], 0)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    d = Hush(epochs=2.0, batch_size=8, chunk_length=64, lr=1e-3)
    result = d.adapt(model, world["data"], world["ctx"])
    out, g = result.model, result.guarantee
    assert any(not torch.equal(before[k], v) for k, v in out.state_dict().items())
    targets = world["data"].secret_targets
    present = {s for ss in world["data"].secrets for s in ss}
    assert g["name"] == "secret_reconstruction" and g["n_secrets"] == len(present) and g["all_targets_met"]
    assert g["sigma"] > 0 and g["value"] == g["max_bound"] <= max(targets[s][1] for s in present)
    assert g["steps"] == round(2.0 * 48 / 8)
    for s, v in g["per_secret"].items():
        assert v["r_bound"] <= targets[s][1] * (1 + 1e-9) and v["n_records"] > 0
    rep = result.report
    assert rep["train"]["steps"] == g["steps"] and math.isfinite(rep["train"]["final_loss"])
    # the released model is the plain architecture, ready for save_pretrained
    assert type(out).__name__ == "GPTNeoXForCausalLM"


def test_hush_without_secrets_names_the_fix(world):
    from bench.modeling import build_scratch_model

    model = build_scratch_model(world["spec"], world["tok"], 0)
    with pytest.raises(ConfigError, match="secret-bearing task"):
        Hush().adapt(model, AdaptationData(world["data"].texts), world["ctx"])
    partial = AdaptationData(world["data"].texts, secrets=world["data"].secrets, secret_targets={})
    with pytest.raises(ConfigError, match="no \\(p, r\\) target"):
        Hush(batch_size=8).adapt(model, partial, world["ctx"])
    with pytest.raises(ConfigError):
        Hush(direction="sideways")


# ----------------------------------------------------------------------------------- on the secrets task
def test_hush_samples_target_and_background_secrets_alike(cache):
    """On the `secrets` task every record of D carries a secret drawn like the targets' (Ganesh et al. 2025: every
    training example carries secrets), so Hush's LP constrains every record and its per-secret sampling rates do
    not tell b=1 target secrets from background secrets.

    When only targets carried secrets, the background was unconstrained (weight 1, the highest rate) and the
    targets were the records Hush down-weighted: the rates separated the two (Mann-Whitney p ≈ 1e-9 in this world).
    """
    from scipy.stats import mannwhitneyu

    from bench.game import Challenger
    from tasks.secrets import Secrets

    data = Secrets(max_chars_per_source=300_000, n_secrets=40, records_per_secret_min=2, records_per_secret_max=5,
                   secret_kind="mixed").build(cache)
    ch = Challenger(data, {"n_per_group": 8, "n_null": 8, "adapt_background": len(data.adapt), "n_validation": 0},
                    seed=0)
    ad = ch.adaptation_data()
    is_target = np.array([t in set(ch.members("b")) for t in ad.texts])
    assert all(len(s) == 1 for s in ad.secrets) and 0 < is_target.sum() < len(is_target)
    secrets = [tuple(s) for s in ad.secrets]
    ledger, rho = account(secrets, ad.secret_targets, batch_size=16, steps=round(4 * len(secrets) / 16), c=None)
    assert ledger.n_secrets == len(set(secrets)) == len(ad.secret_targets)
    summary = ledger.summary()
    assert summary["all_targets_met"] and summary["max_bound"] <= max(r for _, r in ad.secret_targets.values())
    rates: dict[tuple[str, bool], list[float]] = {}
    for s, r, t in zip(secrets, rho, is_target):
        rates.setdefault((s[0], bool(t)), []).append(float(r))
    target = [np.mean(v) for (_, t), v in rates.items() if t]
    background = [np.mean(v) for (_, t), v in rates.items() if not t]
    assert len(target) == 16 and len(background) > 15
    # one test per secret (a secret's records share its rate); p ≥ 0.001 is |z| ≤ 3.29, as in test_users_secrets
    assert mannwhitneyu(target, background).pvalue >= 1e-3


def test_replacement_kl_matches_direct_integration_and_exceeds_the_removal_pair():
    """KL(Σπ_s N(s, σ²) ‖ Σπ_s N(−s, σ²)) against scipy's adaptive quadrature of the two densities, its point-mass
    closed form 2s²/σ², and above the paper's removal pair (what the replacement adjacency costs beyond it)."""
    from scipy import integrate, stats

    from bench.secret_accounting import replacement_kl
    for s, sigma in [(1, 0.7), (3, 2.0)]:
        pmf = np.zeros(s + 1)
        pmf[s] = 1.0
        assert replacement_kl(pmf, sigma) == pytest.approx(2 * s * s / sigma ** 2, rel=1e-9)
    pmf = poisson_binomial([0.05, 0.1, 0.02, 0.08, 0.03, 0.06])
    ks = np.arange(len(pmf))
    for sigma in (0.5, 1.0, 3.0):
        dens = lambda x, sign: float(np.sum(pmf * stats.norm.pdf(x, sign * ks, sigma)))  # noqa: E731
        direct = integrate.quad(lambda x: dens(x, 1) * math.log(dens(x, 1) / dens(x, -1)), -12 * sigma,
                                len(pmf) + 12 * sigma, limit=400, epsabs=1e-13)[0]
        assert replacement_kl(pmf, sigma) == pytest.approx(direct, rel=1e-6, abs=1e-12)
        assert replacement_kl(pmf, sigma) > mixture_kl(pmf, sigma, "both")
