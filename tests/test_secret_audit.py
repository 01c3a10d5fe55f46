"""The secret-level audit of a KL guarantee (Hush, Ganesh et al. 2025): the KL lower bound against an independent
computation and its error rate, the ``secrets_replaced`` world (negatives are the same carriers with the secret
replaced), the secret split of ``secret_loss``, and the claim check's rows, table and board."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy.stats import beta, entropy, norm

from bench.audit import FLAG_CLAIM_OK, FLAG_CLAIM_VIOLATED, kl_lower_bound, kl_row, secret_claim_row
from bench.audit_report import audit_rows
from bench.errors import MetricError
from bench.game import GAMES, Challenger, b_only_game
from bench.secret_accounting import bernoulli_kl
from bench.units import secrets_of
from tasks.audit_canaries import split_secret
from tasks.secrets import Secrets, SecretsReplaced, find_secret

TASK = dict(max_chars_per_source=300_000, n_secrets=30, records_per_secret_min=2, records_per_secret_max=4,
            secret_kind="mixed")
WORLD = {"n_per_group": 4, "n_null": 8, "adapt_background": 8}


# ------------------------------------------------------------------------------------- the KL lower bound


def _brute_kl_lb(labels, scores, confidence=0.95):
    """Independent computation: every threshold by a loop, Clopper–Pearson from the beta quantiles, KL from SciPy."""
    y, s = np.asarray(labels), np.asarray(scores, dtype=float)
    n_pos, n_neg = int(y.sum()), int((1 - y).sum())
    a = (1 - confidence) / (2 * (n_pos + n_neg))
    best = 0.0
    for t in np.unique(s):
        tp, fp = int(((s >= t) & (y == 1)).sum()), int(((s >= t) & (y == 0)).sum())
        lo = 0.0 if tp == 0 else (a ** (1 / n_pos) if tp == n_pos else beta.ppf(a, tp, n_pos - tp + 1))
        hi = 1.0 if fp == n_neg else beta.ppf(1 - a, fp + 1, n_neg - fp)
        if lo > hi:
            best = max(best, entropy([lo, 1 - lo], [hi, 1 - hi]), entropy([hi, 1 - hi], [lo, 1 - lo]))
    return best


@pytest.mark.parametrize("seed,shift", [(0, 0.0), (1, 1.0), (2, 2.5), (3, 6.0)])
def test_kl_lower_bound_equals_an_independent_computation(seed, shift):
    rng = np.random.default_rng(seed)
    y = np.r_[np.ones(60), np.zeros(70)].astype(int)
    s = np.round(rng.normal(shift * y, 1.0), 1)  # rounded: ties switch together
    got = kl_lower_bound(y, s)
    assert got["kl_lb"] == pytest.approx(_brute_kl_lb(y, s), rel=1e-9, abs=1e-12)
    if got["kl_lb"] > 0:
        assert got["tpr_lo"] > got["fpr_hi"]


def test_kl_lower_bound_of_a_perfect_split_is_the_closed_form():
    y = np.r_[np.ones(100), np.zeros(100)].astype(int)
    a = 0.05 / 400
    lo, hi = a ** (1 / 100), 1 - a ** (1 / 100)  # all members above, no non-member: the two closed-form ends
    want = max(bernoulli_kl(lo, hi), bernoulli_kl(hi, lo))
    assert kl_lower_bound(y, y.astype(float))["kl_lb"] == pytest.approx(want, rel=1e-9)


def test_kl_lower_bound_exceeds_the_true_divergence_rarely():
    """Members N(1, 1), non-members N(0, 1), 80 vs 80: the largest KL any threshold test can show is K*; the
    bound may exceed K* with probability at most 5 % (it is far rarer: Bonferroni over every threshold)."""
    t = np.linspace(-6, 7, 4001)
    tpr, fpr = norm.sf(t - 1.0), norm.sf(t)
    k_star = float(np.max(np.maximum(bernoulli_kl(tpr, fpr), bernoulli_kl(fpr, tpr))))
    rng = np.random.default_rng(7)
    y = np.r_[np.ones(80), np.zeros(80)].astype(int)
    bounds = [kl_lower_bound(y, rng.normal(y.astype(float), 1.0))["kl_lb"] for _ in range(300)]
    assert np.mean(np.asarray(bounds) > k_star) <= 0.05
    assert np.mean(np.asarray(bounds) > 0) > 0.5  # and it has power: most runs show a positive bound


def test_kl_lower_bound_refuses_bad_input():
    with pytest.raises(MetricError, match="confidence"):
        kl_lower_bound([1, 0], [0.3, 0.2], confidence=1.5)
    with pytest.raises(MetricError):
        kl_lower_bound([1, 0], [float("nan"), 0.2])


# ---------------------------------------------------------------------------------------- the claim row


def _hush(mu, units, direction="both"):
    return {"name": "secret_reconstruction", "direction": direction,
            "per_secret": {u: {"kl": mu, "r_bound": 5e-4, "p": 1e-10} for u in units}}


def test_secret_claim_row_flags_a_divergence_above_the_largest_claimed_kl():
    y = np.r_[np.ones(100), np.zeros(100)].astype(int)
    units = [f"s{i}" for i in range(200)]
    perfect = y + np.random.default_rng(0).normal(0.0, 0.01, 200)
    row = secret_claim_row(y, perfect, units, _hush(0.015, units))
    assert row.flag == FLAG_CLAIM_VIOLATED and row.value == 0.015 and row.ci_low > 1.0
    assert row.metric == "secret_claim@95%" and (row.n_pos, row.n_neg) == (100, 100)
    assert secret_claim_row(y, perfect, units, _hush(50.0, units)).flag == FLAG_CLAIM_OK
    chance = np.random.default_rng(1).normal(size=200)
    assert secret_claim_row(y, chance, units, _hush(0.015, units)).flag == FLAG_CLAIM_OK
    g = _hush(0.015, units)
    g["per_secret"]["s3"]["kl"] = 0.5  # the largest μ_j of the game's secrets is the claim
    assert secret_claim_row(y, chance, units, g).value == 0.5


def test_secret_claim_row_checks_only_what_a_ledger_claims():
    y = np.r_[np.ones(10), np.zeros(10)].astype(int)
    units = [f"s{i}" for i in range(20)]
    s = y.astype(float)
    assert secret_claim_row(y, s, units, None) is None
    assert secret_claim_row(y, s, units, {"name": "epsilon", "value": 1.0, "delta": 1e-5}) is None
    assert secret_claim_row(y, s, units, _hush(0.01, units, direction="forward")) is None  # one KL direction only
    assert secret_claim_row(y, s, units, _hush(0.01, units[:-1])) is None  # a secret the ledger never saw
    old = {"name": "secret_reconstruction", "direction": "both",
           "per_secret": {u: {"r_bound": 1e-3, "p": 1e-10} for u in units}}  # a ledger without "kl"
    assert secret_claim_row(y, s, units, old).value == pytest.approx(bernoulli_kl(1e-3, 1e-10))
    inf = _hush(None, units)  # an infinite KL claims nothing
    assert secret_claim_row(y, s, units, inf).value == math.inf
    assert secret_claim_row(y, s, units, inf).flag == FLAG_CLAIM_OK


def test_only_games_that_differ_in_b_alone_are_checked():
    assert {g for g, spec in GAMES.items() if b_only_game(spec)} == {"adapt", "joint/fresh", "joint/seen", "audit"}


def test_kl_row_is_the_bound_flagged_indicative():
    y = np.r_[np.ones(50), np.zeros(50)].astype(int)
    s = y + np.random.default_rng(3).normal(0.0, 0.5, 100)
    row = kl_row(y, s)
    assert row.metric == "kl_lb@95%" and row.flag == "indicative" and row.value == kl_lower_bound(y, s)["kl_lb"] > 0


def test_audit_table_carries_the_secret_claim():
    def row(attack, metric, value, ci_low=None, flag=None):
        return dict(task="t", model="m", defense="hush", seed=0, game="adapt", attack=attack, metric=metric,
                    value=value, ci_low=ci_low, ci_high=None, n_pos=60, n_neg=60, flag=flag)
    rows = [row("loss", "eps_lb_roc@95%,delta=1e-05", 0.2, None, "indicative"),
            row("loss", "secret_claim@95%", 0.012, 0.0, "claim_ok"),
            row("secret_loss", "secret_claim@95%", 0.012, 0.4, "claim_violated"),
            dict(row("loss", "auc", 0.9), defense="finetune"),  # no neighbour-game bound: not in the table
            dict(row("loss", "kl_lb@95%", 0.7, None, "indicative"), defense="ft"),
            row("secret_loss", "kl_lb@95%", 0.4, None, "indicative")]
    (ft, hush) = audit_rows(rows)
    assert ft["verdict"] == "no claim" and ft["kl_lb"] == 0.7 and ft["claimed_kl"] is None
    assert hush["verdict"] == "claim_violated" and hush["claimed_kl"] == 0.012 and hush["kl_lb"] == 0.4
    assert hush["claimed_eps"] is None and hush["game"] == "adapt" and hush["confidence"] == pytest.approx(0.9)


# ------------------------------------------------------------------------------- the secrets_replaced world


@pytest.fixture(scope="module")
def worlds(cache):
    return Secrets(**TASK).build(cache), SecretsReplaced(**TASK).build(cache)


def test_neighbours_differ_in_the_secret_alone(worlds):
    plain, replaced = worlds
    assert [r.text for r in plain.targets] == [r.text for r in replaced.targets]  # same carriers, same secrets
    assert "negatives" not in plain.public_format and replaced.public_format["negatives"] == "replaced"
    assert not any("neighbour" in m for m in plain.target_meta.values())
    fresh = {}
    for r in replaced.targets:
        m = replaced.target_meta[r.id]
        s, s2 = m["secret"], m["neighbour_secret"]
        assert fresh.setdefault(s, s2) == s2  # one replacement per secret, shared by its carriers
        assert m["neighbour"] == r.text.replace(s, s2) and s2 not in r.text and s.casefold() != s2.casefold()
        spec = replaced.secret_spec[s2]
        assert spec["secret_id"] == m["secret_id"] and spec["replaces"] == m["secret_id"]
        assert (spec["p"], spec["r"], spec["n_records"], spec["kind"]) == (m["p"], m["r"], m["n_records"],
                                                                             m["secret_kind"])
    others = [t for t in replaced.adapt + replaced.population + replaced.pretrain]
    assert not any(s2 in t for s2 in fresh.values() for t in others)  # the fresh draws occur nowhere else


def test_b0_secrets_are_trained_as_their_neighbours(worlds):
    plain, replaced = worlds
    ch = Challenger(replaced, WORLD, 0)
    d = ch.adaptation_data()
    meta = replaced.target_meta
    texts = set(d.texts)
    inst = ch.instance(GAMES["adapt"])
    for unit, label in zip(inst.record_ids, inst.labels):
        carriers = [r for r in ch._records[unit]]
        if label == 1:
            assert all(ch._text[r] in texts and meta[r]["neighbour"] not in texts for r in carriers)
        else:
            assert all(meta[r]["neighbour"] in texts and ch._text[r] not in texts for r in carriers)
    # the defender sees one structure whatever b is: every game secret under its id, with its carrier count
    per_text, targets = secrets_of(replaced, d.texts)
    counts = {}
    for ids in per_text:
        for sid in ids:
            counts[sid] = counts.get(sid, 0) + 1
    for unit in inst.record_ids:
        assert counts[unit] == len(ch._records[unit]) and unit in targets
    # in the plain world a b = 0 secret leaves nothing in D
    chp = Challenger(plain, WORLD, 0)
    ids = {sid for ss in secrets_of(plain, chp.adaptation_data().texts)[0] for sid in ss}
    pinst = chp.instance(GAMES["adapt"])
    assert {u for u, lab in zip(pinst.record_ids, pinst.labels) if lab == 0}.isdisjoint(ids)


def test_find_secret_locates_every_secret_from_the_public_format(worlds):
    _, data = worlds
    fmt = data.public_format
    for r in data.targets:
        start, end = find_secret(fmt, r.text)
        assert r.text[start:end] == data.target_meta[r.id]["secret"]
    by_cf = {s.casefold() for s in data.secret_spec}
    for t in data.population[:50] + data.adapt[:50]:  # background carriers are found the same way
        start, end = find_secret(fmt, t)
        assert t[start:end].casefold() in by_cf
    assert find_secret(fmt, "no template line here\nat all") is None
    context, secret = split_secret(fmt, data.targets[0].text)
    assert context + secret == data.targets[0].text[:len(context) + len(secret)]
    assert secret.strip() == data.target_meta[data.targets[0].id]["secret"]


# ------------------------------------------------------------------------------------------- end to end


def test_broken_hush_is_flagged_and_correct_hush_is_not(tmp_path):
    """A Hush whose noise is silently dropped (tests/plugins/broken_hush_defense.py) against the real one, on a
    ``secrets_replaced`` world of 60 vs 60 secrets, scored by ``secret_loss``. False positives: a correct KL
    guarantee is flagged with probability at most 5 % per (attack, seed) if the per-secret outcomes were independent
    trials; they share one model (docs/audit.md, "Hush and NAF"), and the seed here is fixed."""
    import sys
    from pathlib import Path

    from bench.cache import ArtifactCache
    from bench.runner import Runner
    from bench.store import Store
    from bench.suite import parse_suite
    from worlds import TINY

    sys.path.insert(0, str(Path(__file__).parent / "plugins"))
    import broken_hush_defense  # noqa: F401  (registers broken_hush)

    hush = {"epochs": 4, "lr": 1e-2, "batch_size": 8}
    raw = dict(TINY, tasks=[{"name": "secrets_replaced", "params": dict(
                   max_chars_per_source=600_000, n_secrets=128, records_per_secret_min=2, records_per_secret_max=2,
                   secret_kind="mixed")}],
               games=["adapt"], world={"n_per_group": 30, "n_null": 8, "adapt_background": 8},
               attacks=["secret_loss"],
               defenses=[{"name": "broken_hush", "params": hush}, {"name": "hush", "params": hush}])
    store = Store(str(tmp_path / "a.db"))
    result = Runner(parse_suite(raw), store, ArtifactCache(tmp_path / "cache"), quiet=True).run()
    verdicts = {r["defense"]: r for r in store.metric_rows(result.run_id) if r["metric"] == "secret_claim@95%"}
    assert verdicts["broken_hush"]["flag"] == FLAG_CLAIM_VIOLATED
    assert verdicts["broken_hush"]["ci_low"] > verdicts["broken_hush"]["value"] > 0
    assert verdicts["hush"]["flag"] == FLAG_CLAIM_OK and verdicts["hush"]["value"] == pytest.approx(
        verdicts["broken_hush"]["value"])  # the same ledger: only the noise differs
    (row,) = [r for r in audit_rows(store.metric_rows(result.run_id)) if r["defense"] == "broken_hush"]
    assert row["verdict"] == "claim_violated" and row["kl_lb"] == verdicts["broken_hush"]["ci_low"]
    (kl,) = [r for r in store.metric_rows(result.run_id) if r["metric"] == "kl_lb@95%" and r["defense"] == "hush"]
    assert kl["flag"] == "indicative" and kl["value"] == verdicts["hush"]["ci_low"]  # stored for every release
