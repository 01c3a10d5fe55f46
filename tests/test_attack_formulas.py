"""Cross-check of the built-in attack scores against the papers' formulas, with a real (tiny) model.

The reference values below are computed independently of privbench's scoring
code: one plain, unpadded forward per text of a float64 copy of the model,
``log_softmax`` in float64, and each paper's formula written out directly
(no ``lowest_k_mean``, no ``min_k_pp_token_scores``, no ``TokenSignals``).
privbench's attacks are then run through the real ``HFLanguageModel`` →
``RestrictedModel`` → ``AttackerView`` path (float32 forward, length-sorted
padded batches, truncation, signal cache) and must agree.

Formulas (per text, token ids ``x_0 = BOS, x_1 … x_n`` truncated to the context):

* ``lp_t = log p(x_t | x_<t)`` for t = 1 … n (BOS first, so every text token is scored)
* Loss (Yeom et al. 2018): ``mean_t lp_t``
* Zlib (Carlini et al. 2021): ``-(mean NLL) / len(zlib.compress(text))``
* Min-K% (Shi et al. 2024; Marek et al. 2026, eq. 3): mean of the ``ceil(k·n)`` smallest ``lp_t``
* Min-K%++ (Zhang et al. 2024): ``z_t = (lp_t - μ_t) / σ_t`` with ``μ_t = Σ_v p_v log p_v`` and
  ``σ_t² = Σ_v p_v (log p_v)² - μ_t²``; mean of the ``ceil(k·n)`` smallest ``z_t``
* Reference (Marek et al. 2026, eq. 4): ``-NLL_θ / NLL_ref`` (ratio) and ``-(NLL_θ - NLL_ref)`` (difference)
"""

from __future__ import annotations

import copy
import math
import random
import zlib
from fractions import Fraction

import numpy as np
import pytest
import torch

from attacks.loss import LossAttack
from attacks.min_k import MinKAttack
from attacks.min_k_pp import MinKPlusPlusAttack
from attacks.reference import ReferenceAttack
from attacks.zlib import ZlibAttack
from bench.errors import CapabilityError
from bench.game import AttackerView, Target
from bench.lm import TOKEN_LOGPROBS, HFLanguageModel, RestrictedModel
from bench.modeling import ModelSpec, build_scratch_model
from bench.tokenizer import train_bpe_tokenizer
from tests.worlds import WORDS as _WORDS, synthetic_corpus as _corpus

MAX_LEN = 64
ATOL = 1e-5
CAPS = frozenset({TOKEN_LOGPROBS})

def _targets(seed: int = 1) -> list[str]:
    """Seven texts of very different lengths: 1 token up to far beyond the 64-token context."""
    rng = random.Random(seed)
    sentence = lambda k: " ".join(rng.choice(_WORDS) for _ in range(k)).capitalize() + "."  # noqa: E731
    return [
        "Hi",
        "The river is quiet.",
        sentence(12),
        "def add(x, y):\n    return x + y\n",
        sentence(40) + " " + sentence(30),            # > 64 tokens: truncated
        "for i in range(10):\n    print(i * i)  # squares\n" * 4,   # > 64 tokens: truncated, code
        sentence(25),
    ]


@pytest.fixture(scope="module", autouse=True)
def _one_thread():
    # the model is tiny: one intra-op thread is fastest and leaves the other core to concurrent jobs
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    from transformers import AutoTokenizer

    tok_dir = tmp_path_factory.mktemp("bpe")
    train_bpe_tokenizer(_corpus(), tok_dir, vocab_size=512)
    tok = AutoTokenizer.from_pretrained(str(tok_dir))
    spec = ModelSpec("t", num_layers=2, hidden_size=64, num_heads=4, context_length=MAX_LEN, vocab_size=512)
    model = build_scratch_model(spec, tok, seed=0).eval()
    ref_model = build_scratch_model(spec, tok, seed=1).eval()
    lm = HFLanguageModel(model, tok, fingerprint="a", max_length=MAX_LEN, batch_size=3)
    ref_lm = HFLanguageModel(ref_model, tok, fingerprint="b", max_length=MAX_LEN, batch_size=3)
    texts = _targets()
    view = AttackerView(game="adapt", targets=tuple(Target(str(i), t) for i, t in enumerate(texts)),
                        model=RestrictedModel(lm, CAPS, "released"), base=None,
                        reference=RestrictedModel(ref_lm, CAPS, "reference"), population=None)
    return {"tok": tok, "spec": spec, "model": model, "ref_model": ref_model, "lm": lm, "ref_lm": ref_lm,
            "texts": texts, "view": view,
            "sig": _reference_signals(model, tok, texts), "ref_sig": _reference_signals(ref_model, tok, texts)}


# -- independent reference computation ------------------------------------------------------------------

def _encode(tok, text: str) -> list[int]:
    return ([tok.bos_token_id] + tok(text, add_special_tokens=False)["input_ids"])[:MAX_LEN]


@torch.no_grad()
def _reference_signals(model, tok, texts):
    """Per text: (token ids scored, lp_t, μ_t, σ²_t) from one unpadded float64 forward."""
    m64 = copy.deepcopy(model).double().eval()
    out = []
    for text in texts:
        ids = torch.tensor([_encode(tok, text)])
        logp = torch.log_softmax(m64(ids).logits[0, :-1].double(), dim=-1)   # predicts x_1 … x_n
        tgt = ids[0, 1:]
        lp = logp[torch.arange(len(tgt)), tgt]
        p = logp.exp()
        mu = (p * logp).sum(-1)
        sigma2 = (p * logp * logp).sum(-1) - mu * mu
        out.append({"ids": tgt.numpy(), "lp": lp.numpy(), "mu": mu.numpy(), "sigma2": sigma2.numpy()})
    return out


def _n_lowest(k: float, n: int) -> int:
    # exact ceil(k·n) with k read as the decimal the user wrote (0.2 is 1/5, not 0.2000000000000000111)
    return max(1, math.ceil(Fraction(str(k)) * n))


def _mean_lowest(values: np.ndarray, k: float) -> float:
    return float(np.mean(sorted(values.tolist())[: _n_lowest(k, len(values))]))


def ref_loss(s):
    return float(np.mean(s["lp"]))


def ref_zlib(s, text):
    nll = -float(np.mean(s["lp"]))
    return -nll / len(zlib.compress(text.encode("utf-8")))


def ref_min_k(s, k):
    return _mean_lowest(s["lp"], k)


def ref_min_k_pp(s, k):
    z = (s["lp"] - s["mu"]) / np.sqrt(s["sigma2"])
    return _mean_lowest(z, k)


def ref_reference(s, r, mode):
    nll_t, nll_r = -float(np.mean(s["lp"])), -float(np.mean(r["lp"]))
    return -nll_t / nll_r if mode == "ratio" else -(nll_t - nll_r)


# -- setup sanity ----------------------------------------------------------------------------------------

def test_encoding_scores_every_text_token_and_truncates(world):
    tok, texts, lm = world["tok"], world["texts"], world["lm"]
    assert tok.bos_token_id is not None and lm.add_bos
    lengths = [len(tok(t, add_special_tokens=False)["input_ids"]) for t in texts]
    assert min(lengths) <= 2 and sum(n > MAX_LEN for n in lengths) >= 2, lengths  # the cases we want exercised
    signals = lm.token_signals(texts)
    for n, s, ref in zip(lengths, signals, world["sig"]):
        assert s.n_tokens == min(n, MAX_LEN - 1)         # BOS is context only; all text tokens scored until truncation
        np.testing.assert_array_equal(s.token_ids, ref["ids"])
        np.testing.assert_allclose(s.logprobs, ref["lp"], rtol=0, atol=ATOL)
        np.testing.assert_allclose(s.mu, ref["mu"], rtol=0, atol=ATOL)


# -- attack scores against the formulas -----------------------------------------------------------------

def test_loss_attack(world):
    got = LossAttack().score(world["view"])
    want = [ref_loss(s) for s in world["sig"]]
    np.testing.assert_allclose(got, want, rtol=0, atol=ATOL)
    assert np.all(np.asarray(got) < 0)


def test_zlib_attack(world):
    got = ZlibAttack().score(world["view"])
    want = [ref_zlib(s, t) for s, t in zip(world["sig"], world["texts"])]
    np.testing.assert_allclose(got, want, rtol=0, atol=ATOL)


@pytest.mark.parametrize("k", [0.2, 0.5])
def test_min_k_attack(world, k):
    got = MinKAttack(k=k).score(world["view"])
    want = [ref_min_k(s, k) for s in world["sig"]]
    np.testing.assert_allclose(got, want, rtol=0, atol=ATOL)


@pytest.mark.parametrize("k", [0.2, 0.5])
def test_min_k_pp_attack(world, k):
    got = MinKPlusPlusAttack(k=k).score(world["view"])
    want = [ref_min_k_pp(s, k) for s in world["sig"]]
    # privbench keeps μ and σ² in float32 (TokenSignals), so z_t carries float32 rounding: 1e-4 relative.
    # σ² is computed in the centred form E[(log p − μ)²]; the uncentred E[(log p)²] − μ² lost ~3 digits here.
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=0)


def _flat_copy(model):
    """The model with its output logits scaled by 0.05: a near-uniform next-token distribution (tiny σ²)."""
    flat = copy.deepcopy(model)
    with torch.no_grad():
        flat.get_output_embeddings().weight.mul_(0.05)
    return flat.eval()




def test_min_k_pp_within_float32_precision(world):
    tok, texts = world["tok"], world["texts"]
    flat = _flat_copy(world["model"])
    for model, ref in ((world["model"], world["sig"]), (flat, _reference_signals(flat, tok, texts))):
        for batch_size in (1, 3):
            lm = HFLanguageModel(model, tok, fingerprint=f"{id(model)}", max_length=MAX_LEN, batch_size=batch_size)
            view = AttackerView(game="adapt", targets=tuple(Target(str(i), t) for i, t in enumerate(texts)),
                                model=RestrictedModel(lm, CAPS, "released"), base=None, reference=None,
                                population=None)
            # privbench stores lp_t and μ_t in float32, so z_t = (lp_t − μ_t)/σ_t has an unavoidable absolute error
            # of about eps32·|μ|/σ (large when σ is tiny, as on the flat model): allow 8× that, plus 1e-4 relative.
            # A two-pass float32 σ² stays well inside this; the one-pass σ² is off by ~1e-2 on the flat model.
            mu_max = max(np.abs(r["mu"]).max() for r in ref)
            sigma_min = math.sqrt(min(r["sigma2"].min() for r in ref))
            atol = 8 * np.finfo(np.float32).eps * mu_max / sigma_min
            for k in (0.2, 0.5):
                np.testing.assert_allclose(MinKPlusPlusAttack(k=k).score(view), [ref_min_k_pp(s, k) for s in ref],
                                           rtol=1e-4, atol=atol, err_msg=f"batch_size={batch_size}, k={k}")


def test_sigma2_matches_float64(world):
    # also covers batch-size invariance of σ²: every batch size must agree with the unpadded float64 value
    for batch_size in (3, 1, 7):
        lm = world["lm"] if batch_size == 3 else HFLanguageModel(world["model"], world["tok"], fingerprint="a",
                                                                  max_length=MAX_LEN, batch_size=batch_size)
        for s, ref in zip(lm.token_signals(world["texts"]), world["sig"]):
            np.testing.assert_allclose(s.sigma2, ref["sigma2"], rtol=1e-5, atol=0, err_msg=f"batch_size={batch_size}")


@pytest.mark.parametrize("mode", ["ratio", "difference"])
def test_reference_attack(world, mode):
    view = world["view"]
    want = [ref_reference(s, r, mode) for s, r in zip(world["sig"], world["ref_sig"])]
    for calibrate_with in ("auto", "reference"):   # no base released in 'adapt': auto falls back to the reference
        got = ReferenceAttack(mode=mode, calibrate_with=calibrate_with).score(view)
        np.testing.assert_allclose(got, want, rtol=0, atol=ATOL)
    with pytest.raises(CapabilityError):
        ReferenceAttack(mode=mode, calibrate_with="base").score(view)


def test_nll_is_negated_loss_score(world):
    np.testing.assert_allclose(world["lm"].nll(world["texts"]), -LossAttack().score(world["view"]),
                               rtol=0, atol=1e-12)


# -- caching, batching and order invariance ------------------------------------------------------------------

def _assert_signals_close(a, b, atol=ATOL):
    assert len(a) == len(b)
    for x, y in zip(a, b):
        np.testing.assert_array_equal(x.token_ids, y.token_ids)
        for name in ("logprobs", "mu"):   # σ²: see test_sigma2_matches_float64
            np.testing.assert_allclose(getattr(x, name), getattr(y, name), rtol=0, atol=atol, err_msg=name)


def test_signal_cache_returns_same_signals(world):
    lm, texts = world["lm"], world["texts"]
    first = lm.token_signals(texts)
    second = lm.token_signals(texts)
    for a, b in zip(first, second):
        assert a is b       # served from the cache, not recomputed
        for name in ("token_ids", "logprobs", "mu", "sigma2", "top1"):
            np.testing.assert_array_equal(getattr(a, name), getattr(b, name))
    # a duplicate text in one call gets the same signals as its first occurrence
    dup = lm.token_signals([texts[2], texts[2]])
    assert dup[0] is dup[1] is first[2]


@pytest.mark.parametrize("batch_size", [1, 7])   # 1: no padding; 7: one padded batch
def test_signals_invariant_to_batch_size(world, batch_size):
    other = HFLanguageModel(world["model"], world["tok"], fingerprint="a", max_length=MAX_LEN,
                            batch_size=batch_size)    # fresh, empty cache: computed again
    _assert_signals_close(other.token_signals(world["texts"]), world["lm"].token_signals(world["texts"]))


def test_scores_invariant_to_target_order(world):
    texts = world["texts"]
    perm = [4, 0, 6, 2, 5, 1, 3]
    fresh = HFLanguageModel(world["model"], world["tok"], fingerprint="a", max_length=MAX_LEN, batch_size=3)
    for lm, ref_lm in ((world["lm"], world["ref_lm"]), (fresh, world["ref_lm"])):   # cached, then recomputed
        view = AttackerView(game="adapt", targets=tuple(Target(str(i), texts[i]) for i in perm),
                            model=RestrictedModel(lm, CAPS, "released"), base=None,
                            reference=RestrictedModel(ref_lm, CAPS, "reference"), population=None)
        for attack in (LossAttack(), ZlibAttack(), MinKAttack(k=0.2), MinKPlusPlusAttack(k=0.2),
                       ReferenceAttack(mode="ratio")):
            base = np.asarray(attack.score(world["view"]))
            np.testing.assert_allclose(attack.score(view), base[perm], rtol=1e-5, atol=ATOL,
                                       err_msg=type(attack).__name__)


# -- direction: higher = member -------------------------------------------------------------------------------

def test_loss_attack_scores_trained_text_higher(world):
    from bench.training import train_causal_lm

    tok = world["tok"]
    member, non_member = world["texts"][3], world["texts"][2]
    model = build_scratch_model(world["spec"], tok, seed=0)
    stats = train_causal_lm(model, [_encode(tok, member)], epochs=30, lr=1e-2, batch_size=1, seed=0,
                            pad_id=tok.pad_token_id, progress=False)
    assert stats.steps == 30
    trained = HFLanguageModel(model, tok, fingerprint="trained-on-A", max_length=MAX_LEN, batch_size=3)
    view = AttackerView(game="adapt", targets=(Target("A", member), Target("B", non_member)),
                        model=RestrictedModel(trained, CAPS, "released"), base=None, reference=None,
                        population=None)
    score_a, score_b = LossAttack().score(view)
    assert score_a > score_b + 1.0, (score_a, score_b)
    assert score_a > LossAttack().score(world["view"])[3] + 1.0   # training lowered the member's loss


# -- Lowercase, ReCall, Con-ReCall ----------------------------------------------------------------------------

def _nll(s) -> float:
    return -float(np.mean(s["lp"]))


def test_lowercase_attack(world):
    from attacks.lowercase import LowercaseAttack

    lower = _reference_signals(world["model"], world["tok"], [t.lower() for t in world["texts"]])
    want = [_nll(lo) - _nll(s) for lo, s in zip(lower, world["sig"])]    # log(ppl(lower x) / ppl(x))
    np.testing.assert_allclose(LowercaseAttack().score(world["view"]), want, rtol=0, atol=ATOL)
    assert any(t != t.lower() for t in world["texts"])   # the transform changed some texts


@torch.no_grad()
def _conditional_lp(model, tok, prefix: str, text: str) -> np.ndarray:
    """lp_t of the text's tokens after BOS + prefix in one float64 forward; the prefix is cut from the left to
    leave room for the text but keeps at least a quarter of the context (privbench's documented rule)."""
    p = tok(prefix, add_special_tokens=False)["input_ids"]
    t = tok(text, add_special_tokens=False)["input_ids"]
    keep = max(MAX_LEN - 1 - len(t), min(len(p), MAX_LEN // 4))
    p = p[-keep:] if keep < len(p) else p
    ids = ([tok.bos_token_id] + p + t)[:MAX_LEN]
    start = 1 + len(p)
    logp = torch.log_softmax(copy.deepcopy(model).double()(torch.tensor([ids])).logits[0].double(), -1)
    return np.array([float(logp[j - 1, ids[j]]) for j in range(start, len(ids))])


def _shots(population, n, seed, chars):
    idx = np.random.default_rng(seed).choice(len(population), size=min(n, len(population)), replace=False)
    return [population[int(i)][:chars] for i in idx]


@pytest.fixture(scope="module")
def recall_view(world):
    population = tuple(_corpus(40, seed=9))
    caps = frozenset({TOKEN_LOGPROBS, "generate"})
    texts = world["texts"][:4] + [world["texts"][6]]   # keep the long, truncated texts out: conditioning cuts them
    view = AttackerView(game="adapt", targets=tuple(Target(str(i), t) for i, t in enumerate(texts)),
                        model=RestrictedModel(world["lm"], caps, "released"), base=None, reference=None,
                        population=population)
    return view, texts, population


def _recall_ll(model, tok, texts, prefix):
    """(LL(x), LL(x | prefix)): mean token log-likelihoods over the tokens both score."""
    uncond = _reference_signals(model, tok, texts)
    a, b = [], []
    for text, u in zip(texts, uncond):
        c = _conditional_lp(model, tok, prefix, text)
        m = min(len(u["lp"]), len(c))
        a.append(float(np.mean(u["lp"][:m])))
        b.append(float(np.mean(c[:m])))
    return np.array(a), np.array(b)


def test_recall_attack(world, recall_view):
    from attacks.recall import ReCallAttack

    view, texts, population = recall_view
    prefix = "\n\n".join(_shots(population, 3, 0, 200)) + "\n\n"
    ll, ll_p = _recall_ll(world["model"], world["tok"], texts, prefix)
    want = ll_p / ll                                         # ReCall (Xie et al. 2024): LL(x|P) / LL(x)
    np.testing.assert_allclose(ReCallAttack().score(view), want, rtol=1e-5, atol=ATOL)
    assert not np.allclose(ll_p, ll)                          # the prefix really conditioned the scores


def test_con_recall_attack_with_population_member_prefix(world, recall_view):
    from attacks.recall import ConReCallAttack

    view, texts, population = recall_view
    non = "\n\n".join(_shots(population, 3, 0, 200)) + "\n\n"
    mem = "\n\n".join(_shots(population, 3, 2, 200)) + "\n\n"
    ll, ll_non = _recall_ll(world["model"], world["tok"], texts, non)
    _, ll_mem = _recall_ll(world["model"], world["tok"], texts, mem)
    for gamma in (1.0, 0.5):                                  # Con-ReCall (Wang et al. 2024)
        want = (ll_non - gamma * ll_mem) / ll
        got = ConReCallAttack(member_source="population", gamma=gamma).score(view)
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=ATOL)


def test_lowest_k_count_is_the_exact_ceiling_for_swept_k():
    from attacks.min_k import lowest_k_mean, n_lowest

    for k in (0.05, 0.1, 0.2, 0.3, 0.5, 0.7, 1.0):
        for n in range(1, 301):
            assert n_lowest(k, n) == _n_lowest(k, n), (k, n)
    values = np.arange(30, dtype=np.float64)            # 0.1 · 30 = 3.0000000000000004 in floating point
    assert lowest_k_mean(values, 0.1) == pytest.approx(1.0)   # mean of 0, 1, 2 — not of 0 … 3
