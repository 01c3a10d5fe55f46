"""NAF aggregation (Segal et al. 2025): each rule against an independent float64 reimplementation of the paper's
formula, normalisation, k_x against the closed forms of Thm 2.3 / 2.7, the release round trip, the signal cache, and
a runner-level run where every attack scores an aggregate."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from bench import aggregate as agg
from bench.errors import ConfigError, DataError
from bench.game import AdaptationData
from bench.lm import HFLanguageModel, SignalCache
from bench.release import is_release, load_release, save_release
from defenses.naf import NAF, NAFLanguageModel, partition

RNG = np.random.default_rng(0)


# ---------------------------------------------------------------- independent float64 reference (numpy)
def np_logsoftmax(x):
    x = np.asarray(x, np.float64)
    m = x.max(-1, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(-1, keepdims=True))


def np_norm(u):  # u: a non-negative measure, not logs
    return u / u.sum(-1, keepdims=True)


def np_rpd(p):  # Def. 2.5: rp = p / tp, tp = exp(mean log p)
    return p / np.exp(np.log(p).mean(-1, keepdims=True))


def np_smooth(p, b, m):  # §4.1: keep the m tokens of largest p·log(rp/rb), base elsewhere, times β
    rp, rb = np_rpd(p), np_rpd(b)
    out = np.empty_like(p)
    for idx in np.ndindex(p.shape[:-1]):
        score = p[idx] * np.log(rp[idx] / rb[idx])
        keep = np.argsort(-score, kind="stable")[:m]
        s = rb[idx].copy()
        s[keep] = rp[idx][keep]
        beta = np.exp(-np.log(s).mean())
        out[idx] = beta * s
    return out


def np_variant(variant, ps, b=None, m=10):
    if variant == "cp_delta":
        return np_norm(np.minimum.reduce(ps))
    if variant == "cp_delta_kl":
        return np_norm(np.prod(ps, axis=0) ** (1.0 / len(ps)))
    if variant == "cp_delta_r":
        return np_norm(np.minimum.reduce([np_rpd(p) for p in ps]))
    if variant.startswith("scp"):
        return np_norm(np.minimum.reduce([np_smooth(p, b, m) for p in ps]))
    raise AssertionError(variant)


def np_fuse_step(p1, p2, hist, grid_size=10):  # Abad et al. 2025: exhaustive search over the (b1, b2) grid
    axis = list(np.linspace(0, 2, grid_size)[:-1]) + list(np.linspace(2, 10, 9))
    best, best_r = np.inf, None
    for b1 in axis:
        for b2 in axis:
            r = np_norm(p1 ** b1 * p2 ** b2)
            kl = [np.sum(r * (np.log(r) - np.log(p))) for p in (p1, p2)]
            obj = max(kl[0] + hist[0], kl[1] + hist[1])
            if obj < best - 1e-12:
                best, best_r = obj, r
    return best_r


def toy(n=3, v=40, k=2, scale=2.0, spike=True):
    """k distributions per row with correlated logits; the first constituent 'memorises' one token (a spike)."""
    w = RNG.normal(size=(n, v)) * scale
    out = []
    for i in range(k):
        lg = w + RNG.normal(size=(n, v))
        if spike and i == 0:
            lg[:, 0] += 8.0
        out.append(np.exp(np_logsoftmax(lg)))
    return out, np.exp(np_logsoftmax(w + RNG.normal(size=(n, v)) * 0.5))


def t(x):
    return torch.tensor(np.log(x), dtype=torch.float32)


VARIANTS_NO_FUSE = ["cp_delta", "cp_delta_kl", "cp_delta_r", "scp_delta_r_b"]


@pytest.mark.parametrize("variant", VARIANTS_NO_FUSE)
@pytest.mark.parametrize("k", [2, 3])
def test_aggregation_matches_the_formula_and_normalises(variant, k):
    ps, b = toy(k=k)
    got = agg.aggregate(variant, [t(p) for p in ps], log_base=t(b), m=5)
    want = np_variant(variant, ps, b, m=5)
    np.testing.assert_allclose(got.exp().double().numpy(), want, atol=1e-6)
    np.testing.assert_allclose(got.double().numpy(), np.log(want), atol=1e-5)
    np.testing.assert_allclose(torch.logsumexp(got, -1).numpy(), 0.0, atol=1e-6)


def test_constant_base_broadcasts_like_a_per_row_copy():
    ps, _ = toy()
    const = np.exp(np_logsoftmax(RNG.normal(size=40)))
    got = agg.aggregate("scp_delta_r_c", [t(p) for p in ps], log_base=t(const), m=4)
    want = np_variant("scp_delta_r_c", ps, np.broadcast_to(const, ps[0].shape), m=4)
    np.testing.assert_allclose(got.double().numpy(), np.log(want), atol=1e-5)


def test_paper_table_1_example():
    """Segal et al. 2025, Table 1: p = (0.91, 0.01 × 9), q uniform: CP-Δ gives 0.53 / 0.05, CP-Δr 0.15 / 0.09
    (2 decimals)."""
    p = np.array([0.91] + [0.01] * 9)
    q = np.full(10, 0.1)
    cp = agg.cp_delta([t(p), t(q)]).exp().numpy()
    cpr = agg.cp_delta_r([t(p), t(q)]).exp().numpy()
    assert round(float(cp[0]), 2) == 0.53 and round(float(cp[1]), 2) == 0.05
    assert round(float(cpr[0]), 2) == 0.15 and round(float(cpr[1]), 2) == 0.09
    assert round(float(np_rpd(p)[0])) == 58 and round(float(np_rpd(p)[1]), 2) == 0.64  # the R columns


def test_cp_fuse_step_matches_exhaustive_search():
    ps, _ = toy(n=4, v=30)
    hist = RNG.normal(size=(4, 2)) * 3
    got, coef = agg.fuse_step(torch.from_numpy(np.log(ps[0])), torch.from_numpy(np.log(ps[1])), torch.tensor(hist),
                              grid_size=10)
    for r in range(4):
        want = np_fuse_step(ps[0][r], ps[1][r], hist[r])
        np.testing.assert_allclose(got[r].exp().numpy(), want, atol=1e-8)
    np.testing.assert_allclose(torch.logsumexp(got, -1).numpy(), 0.0, atol=1e-9)
    # a large history against model 1 (its continuation was unlikely) pulls the fusion towards model 1
    lean1, _ = agg.fuse_step(t(ps[0]), t(ps[1]), torch.tensor([[50.0, 0.0]]).expand(4, 2), 10)
    lean2, _ = agg.fuse_step(t(ps[0]), t(ps[1]), torch.tensor([[0.0, 50.0]]).expand(4, 2), 10)
    kl = lambda r, p: (r.exp() * (r - t(p))).sum(-1)  # noqa: E731
    assert bool((kl(lean1, ps[0]) <= kl(lean2, ps[0]) + 1e-6).all())


def test_cp_fuse_sequence_accumulates_the_continuation_only():
    ps, _ = toy(n=1, v=20)
    seq1 = t(np.stack([ps[0][0]] * 3))[None]  # (1, 3, V): the same distributions at 3 positions
    seq2 = t(np.stack([ps[1][0]] * 3))[None]
    tokens = torch.tensor([[0, 1, 2]])
    out = agg.cp_fuse_sequence(seq1, seq2, tokens, torch.tensor([1]), 10)
    hist = np.zeros(2)
    for pos in range(3):
        want = np_fuse_step(ps[0][0], ps[1][0], hist)
        np.testing.assert_allclose(out[0, pos].exp().double().numpy(), want, atol=1e-5)
        if pos >= 1:  # the continuation starts at position 1: position 0's token is prompt
            hist = hist - np.log([ps[0][0][tokens[0, pos]], ps[1][0][tokens[0, pos]]])


# ---------------------------------------------------------------- k_x
def test_k_x_closed_forms():
    ps, b = toy(n=5, v=50)
    lp = [torch.from_numpy(np.log(p)) for p in ps]
    # Thm 2.3: CP-Δ is k_x-NAF-tight under max divergence with k_x = log 1 / (1 − TV(p, q))
    r = agg.cp_delta(lp)
    tv = 0.5 * np.abs(ps[0] - ps[1]).sum(-1)
    np.testing.assert_allclose(agg.naf_bound("cp_delta", r, lp).numpy(), np.log(1 / (1 - tv)), rtol=1e-9)
    # Thm 2.7: CP-Δr under the relative max divergence, k_x = (1/2n) Σ |log rp/rq|
    r = agg.cp_delta_r(lp)
    d_r = np.abs(np.log(np_rpd(ps[0]) / np_rpd(ps[1]))).sum(-1) / (2 * 50)
    np.testing.assert_allclose(agg.naf_bound("cp_delta_r", r, lp).numpy(), d_r, rtol=1e-9)
    # SCP-Δr = CP-Δr on the smoothed RPDs (§4.1): D_r of the smoothed pair
    r = agg.scp_delta_r(lp, torch.from_numpy(np.log(b)), 5)
    sp, sq = np_smooth(ps[0], b, 5), np_smooth(ps[1], b, 5)
    np.testing.assert_allclose(agg.naf_bound("scp_delta_r_b", r, lp, log_base=torch.from_numpy(np.log(b)), m=5).numpy(),
                               np.abs(np.log(sp / sq)).sum(-1) / 100, rtol=1e-7, atol=1e-12)
    # KL variants: max_i KL(r‖p_i), and within Vyas et al.'s bound −2 log Z for the geometric mean
    r = agg.cp_delta_kl(lp)
    rn = np_variant("cp_delta_kl", ps)
    kl = np.max([(rn * np.log(rn / p)).sum(-1) for p in ps], axis=0)
    np.testing.assert_allclose(agg.naf_bound("cp_delta_kl", r, lp).numpy(), kl, rtol=1e-9)
    assert (kl <= -2 * np.log(np.sqrt(ps[0] * ps[1]).sum(-1)) + 1e-12).all()


def test_paper_properties_hold_on_random_distributions():
    """Lemma A.1: TV(CP-Δr(p, q), q) ≤ TV(p, q). Remark 4.1: S_m(rp, rb) is 2m-SpaRPS w.r.t. S_m(rq, rb), i.e.
    their log-ratio is one constant outside at most 2m tokens. And smoothing shrinks k_x (Prop. 3.3)."""
    ps, b = toy(n=50, v=200, scale=1.0)
    lp = [torch.from_numpy(np.log(p)) for p in ps]
    r = agg.cp_delta_r(lp).exp().numpy()
    assert (0.5 * np.abs(r - ps[1]).sum(-1) <= 0.5 * np.abs(ps[0] - ps[1]).sum(-1) + 1e-12).all()
    m = 5
    sp, sq = np_smooth(ps[0], b, m), np_smooth(ps[1], b, m)
    for row in np.log(sp / sq):
        _, counts = np.unique(np.round(row, 9), return_counts=True)
        assert counts.max() >= 200 - 2 * m
    k_scp = agg.naf_bound("scp_delta_r_b", agg.scp_delta_r(lp, torch.from_numpy(np.log(b)), m), lp, log_base=torch.from_numpy(np.log(b)), m=m)
    k_cpr = agg.naf_bound("cp_delta_r", agg.cp_delta_r(lp), lp)
    assert (k_scp < k_cpr).all()


def test_bad_inputs_raise_named_errors():
    with pytest.raises(ConfigError, match="variant"):
        NAF(variant="cp_max")
    with pytest.raises(ConfigError, match="k: 2"):
        NAF(variant="cp_fuse", k=3)
    with pytest.raises(ConfigError, match="m"):
        agg.smooth(torch.zeros(1, 5), torch.zeros(1, 5), torch.zeros(1, 5), 6)
    with pytest.raises(DataError, match="lower `k`"):
        partition(["a", "a", "a"], 2)


def test_partition_is_disjoint_deterministic_and_keeps_repeats_together():
    texts = [f"text {i}" for i in range(21)] + ["canary"] * 3
    parts = partition(texts, 2)
    assert sorted(sum(map(list, parts), [])) == sorted(texts)
    assert not set(parts[0]) & set(parts[1])
    assert any(p.count("canary") == 3 for p in parts)
    assert abs(len(set(parts[0])) - len(set(parts[1]))) <= 1
    assert [set(p) for p in partition(list(reversed(texts)), 2)] == [set(p) for p in parts]  # order-free


# ---------------------------------------------------------------- the tiny model
WORDS = "the a cat dog sat ran on under mat tree red blue small big quickly slowly and then home park".split()


def _texts(n, seed):
    rng = np.random.default_rng(seed)
    return [" ".join(rng.choice(WORDS, size=rng.integers(6, 14))) + f" id {rng.integers(1000, 9999)}"
            for _ in range(n)]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """A 2-layer GPT-NeoX θ pretrained for a few steps, its tokenizer, and training texts for the constituents."""
    from transformers import AutoTokenizer

    from bench.defense import TrainContext
    from bench.modeling import ModelSpec, build_scratch_model
    from bench.tokenizer import train_bpe_tokenizer
    from bench.training import train_causal_lm

    d = tmp_path_factory.mktemp("tok")
    train_bpe_tokenizer(_texts(400, 1), d, vocab_size=300)
    tok = AutoTokenizer.from_pretrained(d)
    spec = ModelSpec("t", num_layers=2, hidden_size=32, num_heads=2, context_length=48)
    theta = build_scratch_model(spec, tok, 0)
    ctx = TrainContext(tok, torch.device("cpu"), 48, 0, progress=False)
    train_causal_lm(theta, ctx.encode(_texts(200, 2)), epochs=1, lr=3e-3, batch_size=16, seed=0,
                    pad_id=ctx.pad_id, progress=False)
    return theta, tok, ctx, _texts(40, 3)


def _adapt(tiny, variant, **kw):
    theta, tok, ctx, train = tiny
    d = NAF(variant=variant, epochs=kw.pop("epochs", 3.0), lr=5e-3, batch_size=8, guarantee_texts=20, **kw)
    import copy
    result = d.adapt(copy.deepcopy(theta), AdaptationData(tuple(train)), ctx)
    d.last_guarantee = result.guarantee   # the test's own record of what this call returned
    return d, result.model


def _lm(release, tok, cache=None):
    hf = lambda m, n: HFLanguageModel(m, tok, fingerprint=n, max_length=48, batch_size=8)  # noqa: E731
    return NAFLanguageModel([hf(c, f"c{i}") for i, c in enumerate(release.constituents)],
                            variant=release.meta["variant"], m=release.meta["m"],
                            base=hf(release.base, "b") if release.base is not None else None,
                            constant_logp=release.constant_logp, fingerprint="x", cache=cache,
                            min_log_prob=release.meta.get("min_log_prob"))


def _np_logps(model, tok, text):
    ids = torch.tensor([[tok.bos_token_id] + tok(text, add_special_tokens=False)["input_ids"]])
    with torch.no_grad():
        return np_logsoftmax(model(input_ids=ids).logits[0, :-1].double().numpy()), ids[0, 1:].numpy()


@pytest.mark.parametrize("variant", ["cp_delta", "cp_delta_kl", "cp_fuse", "cp_delta_r", "scp_delta_r_b",
                                     "scp_delta_r_c"])
def test_tiny_model_signals_match_the_formula(tiny, variant):
    theta, tok, ctx, train = tiny
    d, release = _adapt(tiny, variant, epochs=1.0)
    lm = _lm(release, tok)
    texts = train[:2] + _texts(2, 9)
    sigs = lm.token_signals(texts)
    for text, s in zip(texts, sigs):
        per = [_np_logps(c, tok, text) for c in release.constituents]
        ps, ids = [np.exp(lp) for lp, _ in per], per[0][1]
        if variant == "cp_fuse":
            hist, rows = np.zeros(2), []
            for j, y in enumerate(ids):
                rows.append(np_fuse_step(ps[0][j], ps[1][j], hist))
                hist = hist - np.log([ps[0][j][y], ps[1][j][y]])
            r = np.stack(rows)
        else:
            if variant == "scp_delta_r_b":
                b = np.exp(_np_logps(theta, tok, text)[0])
            elif variant == "scp_delta_r_c":
                b = np.broadcast_to(np.exp(release.constant_logp.double().numpy()), ps[0].shape)
            else:
                b = None
            r = np_variant(variant, ps, b, m=10)
        lr = np.log(r)
        np.testing.assert_array_equal(s.token_ids, ids)
        np.testing.assert_allclose(s.logprobs, lr[np.arange(len(ids)), ids], atol=1e-5)
        mu = (r * lr).sum(-1)
        np.testing.assert_allclose(s.mu, mu, atol=1e-4)
        np.testing.assert_allclose(s.sigma2, (r * (lr - mu[:, None]) ** 2).sum(-1), atol=1e-3, rtol=1e-4)
        np.testing.assert_array_equal(s.top1, (lr.argmax(-1) == ids).astype(np.int8))
        np.testing.assert_allclose(s.top1_logprob, lr.max(-1), atol=1e-5)
    g = d.last_guarantee
    assert g["variant"] == variant and g["n_texts"] == 20 and np.isfinite(g["value"]) and g["value"] >= 0
    assert g["mean"] <= g["p99"] <= g["max"]


def test_guarantee_k_x_matches_an_independent_computation(tiny):
    theta, tok, ctx, train = tiny
    d, release = _adapt(tiny, "cp_delta")
    from bench.hashing import text_hash
    chosen = sorted(set(train), key=text_hash)[:20]
    kx = []
    for text in chosen:
        ps = [np.exp(_np_logps(c, tok, text)[0]) for c in release.constituents]
        kx.append(np.log(1 / (1 - 0.5 * np.abs(ps[0] - ps[1]).sum(-1))))  # Thm 2.3
    kx = np.concatenate(kx)
    g = d.last_guarantee
    assert g["n_positions"] == kx.size
    np.testing.assert_allclose([g["mean"], g["p99"], g["max"]], [kx.mean(), np.percentile(kx, 99), kx.max()],
                               rtol=1e-4)


def test_smoothing_lowers_k_x_on_the_tiny_model(tiny):
    """Segal et al. 2025, Fig. 1(b) / Table 4 ordering on the same constituents: SCP-Δr-b < CP-Δr < CP-Δ at the
    99th percentile."""
    _, tok, _, train = tiny
    _, release = _adapt(tiny, "scp_delta_r_b")
    lm = _lm(release, tok)
    p99 = {}
    for v in ("cp_delta", "cp_delta_r", "scp_delta_r_b"):
        lm.variant = v
        p99[v] = float(np.percentile(lm.naf_bounds(train[:20]), 99))
    assert p99["scp_delta_r_b"] < p99["cp_delta_r"] < p99["cp_delta"], p99


def test_release_round_trip_cache_and_generation(tiny, tmp_path):
    theta, tok, ctx, train = tiny
    _, release = _adapt(tiny, "scp_delta_r_b", epochs=1.0)
    save_release(release, tmp_path / "rel")
    assert is_release(tmp_path / "rel")
    assert json.loads((tmp_path / "rel" / "release.json").read_text())["meta"]["variant"] == "scp_delta_r_b"
    cache = SignalCache(tmp_path / "signals")

    def make_lm(model, tk, suffix=""):
        return HFLanguageModel(model, tk, fingerprint=f"key-{suffix}", max_length=48, batch_size=8, cache=cache)

    loaded = load_release(tmp_path / "rel", device=torch.device("cpu"), fingerprint="key", make_lm=make_lm)
    texts = train[:3] + _texts(3, 11)
    a, b = loaded.token_signals(texts), _lm(release, tok).token_signals(texts)
    for x, y in zip(a, b):
        for f in ("token_ids", "top1"):
            np.testing.assert_array_equal(getattr(x, f), getattr(y, f))
        for f in ("logprobs", "mu", "sigma2", "top1_logprob"):
            np.testing.assert_allclose(getattr(x, f), getattr(y, f), atol=1e-6)
    # a rerun (a fresh handle on the same cache directory) costs no model pass
    again = load_release(tmp_path / "rel", device=torch.device("cpu"), fingerprint="key",
                         make_lm=lambda m, tk, suffix="": HFLanguageModel(
                             m, tk, fingerprint=f"key-{suffix}", max_length=48, cache=SignalCache(tmp_path / "signals")))
    again._forward = lambda *a, **k: (_ for _ in ()).throw(AssertionError("model pass on a cached text"))
    c = again.token_signals(texts)
    np.testing.assert_array_equal(np.concatenate([s.logprobs for s in c]), np.concatenate([s.logprobs for s in a]))
    # conditional signals: scoring with a prefix equals the tail of scoring prefix + text (no BOS difference)
    prefix = "the cat sat"
    cond = loaded.token_signals([" on the mat"], prefix=prefix)[0]
    full = loaded.token_signals([prefix + " on the mat"])[0]
    np.testing.assert_allclose(cond.logprobs, full.logprobs[-cond.n_tokens:], atol=1e-5)
    # next-token distribution: normalised, and its argmax is generate's first token; greedy is prefix-consistent
    prompts = ["the cat", "a big dog ran", "id"]
    rows = loaded.next_token_logprobs(prompts)
    np.testing.assert_allclose(np.logaddexp.reduce(rows.astype(np.float64), axis=1), 0.0, atol=1e-5)
    gen1, gen5 = loaded.generate(prompts, 1), loaded.generate(prompts, 5)
    for p, g1, g5, row in zip(prompts, gen1, gen5, rows):
        assert g1 == tok.decode([int(row.argmax())], skip_special_tokens=True)
        assert g5.startswith(g1)
    head, tail = loaded.split_at_token(train[0], 3)
    assert head + tail == train[0] or (head + tail).replace(" ", "") == train[0].replace(" ", "")


def test_cp_fuse_generation_tracks_the_continuation(tiny):
    """CP-Fuse generation re-solves the weights each step with the history of what it generated: its greedy
    continuation equals teacher-forced CP-Fuse signals' argmax along that continuation."""
    _, tok, _, _ = tiny
    _, release = _adapt(tiny, "cp_fuse", epochs=1.0)
    lm = _lm(release, tok)
    prompt = "the small cat"
    gen = lm.generate([prompt], 4)[0]
    sig = lm.token_signals([gen], prefix=prompt)[0]
    assert sig.top1.all(), "each generated token is the argmax of the fused distribution given its history"


# ---------------------------------------------------------------- runner level
def _world(task, attacks, defenses):
    return {
        "name": "naf-tiny", "seeds": [0], "tasks": [task],
        "models": [{"name": "nano", "params": {"pretrain_tokens": 6000, "num_layers": 2, "hidden_size": 64,
                                                "num_heads": 2}}],
        "defenses": defenses, "attacks": attacks, "games": ["adapt", "null"],
        "world": {"n_per_group": 4, "n_null": 8, "adapt_background": 8},
        "reference": False, "metrics": {"n_boot": 20}, "utility": {"n_heldout": 10},
    }


def _naf(*variants, **extra):
    return [{"name": "naf", "label": v, "params": {"variant": v, "epochs": 1, "guarantee_texts": 8, **extra}}
            for v in variants]


NAMES2IDS = {"name": "names2ids", "params": {"n_people": 120, "max_chars_per_source": 300_000}}
CANARIES = {"name": "random_word_canaries", "params": {"n_canaries": 24, "n_references": 16,
                                                       "max_chars_per_source": 300_000}}
EXTRACTION = ["loss", "min_k", "min_k_pp", "zlib", "pii_extraction", "k_extraction", "tte"]


def _run_and_check(cache, tmp_path, task, attacks, defenses):
    from bench.runner import Runner
    from bench.store import Store
    from bench.suite import parse_suite

    store = Store(str(tmp_path / "r.db"))
    result = Runner(parse_suite(_world(task, attacks, defenses)), store, cache, quiet=True).run()
    assert result.status == "complete" and result.new_evaluations == len(defenses) * 2 * len(attacks)
    rows = store.metric_rows(result.run_id)
    assert {(r["defense"], r["attack"]) for r in rows} == {(d["label"], a) for d in defenses for a in attacks}
    assert all(np.isfinite(r["value"]) for r in rows if r["value"] is not None)
    g = {r["defense"]: r for r in store.guarantee_rows(result.run_id)}
    assert set(g) == {d["label"] for d in defenses}
    assert all(np.isfinite(r["value"]) and r["value"] >= 0 for r in g.values())
    util = [r for r in store.utility_rows(result.run_id) if r["role"] == "adapted"]
    assert {r["defense"] for r in util} == set(g)


@pytest.mark.parametrize("task,attacks,defenses", [
    (NAMES2IDS, EXTRACTION, _naf("cp_delta", "scp_delta_r_b")),
    (CANARIES, ["exposure", "loss"], _naf("scp_delta_r_c")),
], ids=["names2ids", "canaries"])
def test_runner_scores_every_attack_on_naf_releases(cache, tmp_path, task, attacks, defenses):
    _run_and_check(cache, tmp_path, task, attacks, defenses)


@pytest.mark.slow
def test_runner_scores_every_variant(cache, tmp_path):
    """All six variants (CP-Fuse solves its weight grid at every position: minutes on CPU)."""
    _run_and_check(cache, tmp_path, NAMES2IDS, EXTRACTION,
                   _naf("cp_delta", "cp_delta_kl", "cp_fuse", "cp_delta_r", "scp_delta_r_b", "scp_delta_r_c"))


def test_the_probability_floor_meets_it_exactly_and_stays_normalised():
    """Segal et al. 2025 §2.1: every distribution gives each token at least e^floor; here by mixing with the
    uniform distribution, (1 − λ) p + λ/V with λ = V e^floor, checked against numpy in float64."""
    rng = np.random.default_rng(0)
    logits = torch.tensor(rng.normal(0, 12, (3, 5, 50)))
    logp = torch.log_softmax(logits, -1)
    assert logp.min() < -30  # the floor binds
    out = agg.floor_log_probs(logp, -12.0)
    lam = 50 * np.exp(-12.0)
    want = np.log((1 - lam) * np.exp(logp.numpy()) + lam / 50)
    np.testing.assert_allclose(out.numpy(), want, rtol=0, atol=1e-12)
    assert out.min() >= -12.0 - 1e-12
    np.testing.assert_allclose(torch.logsumexp(out, -1).numpy(), 0.0, atol=1e-12)
    assert agg.floor_log_probs(logp, None) is logp
    with pytest.raises(ConfigError, match="below −log V"):
        agg.floor_log_probs(logp, -3.0)  # 50 · e^−3 > 1: no distribution can put that much on every token


def test_naf_with_the_papers_floor_releases_the_rule_on_floored_inputs(tiny, tmp_path):
    """``min_log_prob``: the constituents are floored and combined by the paper's rule, whose output is released
    as it is, so k_x is the divergence Theorem 2.7 states (CP-Δr is k_x-NAF-tight, k_x = D_r(p̃, q̃)); flooring the
    output too would move the release off the rule. The stored release carries the floor back; without it the
    meta has no such key (stored runs keep theirs)."""
    theta, tok, ctx, train = tiny
    floor = -6.0  # the 300-token vocabulary's −log V is −5.7; −20 would not bind on this tiny model
    d, release = _adapt(tiny, "cp_delta_r", epochs=1.0, min_log_prob=floor)
    assert release.meta["min_log_prob"] == floor and d.last_guarantee["min_log_prob"] == floor
    assert "min_log_prob" not in _adapt(tiny, "cp_delta", epochs=0.5, min_log_prob=None)[1].meta
    assert NAF().min_log_prob == -20.0  # the paper's floor is the default (naf 0.2.0)
    lm = NAFLanguageModel([HFLanguageModel(c, tok, fingerprint=f"c{i}", max_length=48, batch_size=8)
                           for i, c in enumerate(release.constituents)], variant="cp_delta_r", m=10,
                          fingerprint="x", min_log_prob=floor)
    lam = len(tok) * np.exp(floor)
    raised = 0
    for text, s in zip(train[:2], lm.token_signals(train[:2])):
        per = [_np_logps(c, tok, text) for c in release.constituents]
        ps = [(1 - lam) * np.exp(lp) + lam / len(tok) for lp, _ in per]
        raised += sum(int((np.exp(lp) < np.exp(floor)).sum()) for lp, _ in per)
        r = np_variant("cp_delta_r", ps)
        ids = per[0][1]
        np.testing.assert_allclose(s.logprobs, np.log(r)[np.arange(len(ids)), ids], atol=1e-5)
        log_rp = [np.log(p) - np.log(p).mean(-1, keepdims=True) for p in ps]
        d_r = 0.5 * np.abs(log_rp[0] - log_rp[1]).mean(-1)     # D_r(p̃, q̃) = (1/2n) Σ_y |log rp̃(y)/rq̃(y)|
        np.testing.assert_allclose(lm.naf_bounds([text]), d_r, rtol=1e-4, atol=1e-6)
    assert raised > 0  # the floor changed some of the constituents' probabilities
    save_release(release, tmp_path / "rel")
    loaded = load_release(tmp_path / "rel", device=torch.device("cpu"), fingerprint="key",
                          make_lm=lambda m, tk, suffix="": HFLanguageModel(m, tk, fingerprint=suffix, max_length=48,
                                                                            batch_size=8))
    assert loaded.min_log_prob == floor
    np.testing.assert_array_equal(loaded.token_signals(train[:1])[0].logprobs, lm.token_signals(train[:1])[0].logprobs)
    with pytest.raises(ConfigError, match="min_log_prob"):
        NAF(min_log_prob=-5.0).adapt(theta, AdaptationData(tuple(train)), ctx)
