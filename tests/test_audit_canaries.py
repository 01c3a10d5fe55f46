"""Tests for tasks.audit_canaries (the canary designs of Panda et al. 2025) and the attack secret_loss.

Token counts, tokenizations and scores are recomputed here independently of the module under test: the tokenizer is
the one the runner trains for the nano model (bench.artifacts.ensure_tokenizer), counts are plain loops over its
ids, and the secret_loss reference is one unpadded float64 forward with log_softmax written out.
"""

from __future__ import annotations

import copy
from collections import Counter

import numpy as np
import pytest
import torch

from attacks.secret_loss import SecretLossAttack
from bench.errors import ConfigError, DataError
from bench.game import AttackerView, Target
from bench.lm import TOKEN_LOGPROBS, HFLanguageModel, RestrictedModel
from bench.modeling import BUILTIN_SPECS, ModelSpec, build_scratch_model
from bench.registry import TASKS
from tasks.audit_canaries import DESIGNS, SEPARATOR, AuditCanaries, split_secret
from tasks.mini_pile import MiniPile

from tiny_training import one_thread
from worlds import TINY  # noqa: E402  (the shared tiny world)

BUDGET = 300_000
N = 48  # canaries per design: small, so a build takes about a second


_one_thread = pytest.fixture(scope="module", autouse=True)(one_thread)


@pytest.fixture(scope="module")
def base(cache):
    return MiniPile(max_chars_per_source=BUDGET).build(cache)


@pytest.fixture(scope="module")
def tok(cache, base):
    """The tokenizer the runner trains for the nano model on this pretraining partition."""
    from transformers import AutoTokenizer

    from bench.artifacts import ensure_tokenizer
    path, _ = ensure_tokenizer(cache, BUILTIN_SPECS["nano"], base)
    return AutoTokenizer.from_pretrained(path)


@pytest.fixture(scope="module")
def built(cache):
    return {d: AuditCanaries(design=d, n_canaries=N, secret_tokens=4, max_chars_per_source=BUDGET).build(cache)
            for d in DESIGNS}


def ids(tok, text: str) -> list[int]:
    return tok(text, add_special_tokens=False)["input_ids"]


def counts(tok, texts) -> Counter:
    c: Counter = Counter()
    for t in texts:
        c.update(ids(tok, t))
    return c


def finetune_texts(data) -> list[str]:
    """The fine-tuning data the designs are measured on: the adaptation pool and the canaries' prefixes."""
    return list(data.adapt) + [data.target_meta[t.id]["prefix"] for t in data.targets]


# -- every design: the secrets are the designed tokens --------------------------------------------------------

@pytest.mark.parametrize("design", DESIGNS)
def test_secrets_tokenize_back_to_their_designed_ids_alone_and_after_the_prefix(built, tok, design):
    data = built[design]
    assert len(data.targets) == N and data.public_format["kind"] == "prefix_secret"
    holders: Counter = Counter()
    for t in data.targets:
        meta = data.target_meta[t.id]
        secret_ids = meta["secret_ids"]
        assert len(secret_ids) == 4 and t.text == meta["prefix"] + SEPARATOR + meta["secret"]
        assert ids(tok, meta["secret"]) == secret_ids
        assert ids(tok, t.text) == ids(tok, meta["prefix"] + SEPARATOR) + secret_ids
        assert SEPARATOR not in meta["secret"]
        holders.update(set(secret_ids))
    assert max(holders.values()) == 1  # reuse false: no token serves two canaries
    if design == "bigram":
        for t in data.targets:
            x, y = data.target_meta[t.id]["secret_ids"][:2]
            assert x != y and data.target_meta[t.id]["secret_ids"] == [x, y, x, y]


def test_new_token_secrets_never_occur_in_pretraining_nor_in_the_adaptation_data(built, tok):
    data = built["new_token"]
    secret = {i for t in data.targets for i in data.target_meta[t.id]["secret_ids"]}
    seen = counts(tok, data.pretrain) + counts(tok, finetune_texts(data))
    assert secret and not secret & set(seen)
    # and the other designs' tokens do occur in the fine-tuning data
    c = counts(tok, finetune_texts(built["random"]))
    assert all(c[i] > 0 for t in built["random"].targets for i in built["random"].target_meta[t.id]["secret_ids"])


def test_unigram_secrets_are_rare_tokens_of_the_fine_tuning_data(built, tok):
    data = built["unigram"]
    c = counts(tok, finetune_texts(data))
    threshold = data.stats["canaries"]["max_count"]
    occurring = np.array(list(c.values()))
    secret = [i for t in data.targets for i in data.target_meta[t.id]["secret_ids"]]
    assert all(1 <= c[i] <= threshold for i in secret)
    # at most the median occurring token's count (in this small corpus most tokens occur once: ties at 1 are
    # allowed), and below the mean
    assert threshold <= np.median(occurring) and threshold < occurring.mean(), (threshold, occurring.mean())


def test_bigram_pairs_never_occur_in_the_fine_tuning_data(built, tok):
    data = built["bigram"]
    pairs: Counter = Counter()
    for text in finetune_texts(data):
        x = ids(tok, text)
        pairs.update(zip(x[:-1], x[1:]))
    for t in data.targets:
        x, y = data.target_meta[t.id]["secret_ids"][:2]
        assert pairs[(x, y)] == 0  # the minimum any candidate can have


def test_random_secret_tokens_occur_in_the_data_and_differ_from_the_rare_designs(built, tok):
    data = built["random"]
    c = counts(tok, finetune_texts(data))
    secret = [i for t in data.targets for i in data.target_meta[t.id]["secret_ids"]]
    assert all(c[i] > 0 for i in secret)
    # drawn uniformly among the occurring token types, not the rarest: more frequent on average than the unigram
    # design's tokens (though most types of a small corpus are rare, so not by much: about 4 against 1 here)
    uni = [i for t in built["unigram"].targets for i in built["unigram"].target_meta[t.id]["secret_ids"]]
    assert np.mean([c[i] for i in secret]) > np.mean([c[i] for i in uni])
    assert max(c[i] for i in secret) > built["unigram"].stats["canaries"]["max_count"]


def test_the_build_is_deterministic_and_keeps_the_base_partitions(cache, built, base):
    again = AuditCanaries(design="unigram", n_canaries=N, secret_tokens=4, max_chars_per_source=BUDGET).build(cache)
    assert again.fingerprint == built["unigram"].fingerprint and again.targets == built["unigram"].targets
    assert built["unigram"].fingerprint != built["random"].fingerprint
    for d in DESIGNS:
        assert built[d].adapt == base.adapt and built[d].pretrain == base.pretrain
        assert not {t.text for t in built[d].targets} & set(base.adapt)


def test_every_design_builds_with_its_defaults(cache):
    """``offline = True`` promises that `privbench data build --all` builds every variant with the defaults: the
    binding one is new_token, whose never-seen tokens run short on a large corpus."""
    for d in DESIGNS:
        data = TASKS.create("audit_canaries", {"design": d}).build(cache)
        assert len(data.targets) == 256 and data.stats["canaries"]["distinct_tokens"] == 512  # 256 × 2 tokens


# -- split_secret: the public format alone -------------------------------------------------------------------

def test_split_secret_on_every_public_format_kind(built):
    data = built["bigram"]
    t = data.targets[0]
    meta = data.target_meta[t.id]
    assert split_secret(data.public_format, t.text) == (meta["prefix"] + SEPARATOR, meta["secret"])
    # a prefix that holds line breaks itself: the secret is what follows the last one
    assert split_secret(data.public_format, "a\nb\nc\n xyz") == ("a\nb\nc\n", " xyz")
    words = {"kind": "random_words", "template": "the secret words are {w1} {w2} {w3}"}
    assert split_secret(words, "the secret words are apple river stone") == (
        "the secret words are", " apple river stone")
    prefix = {"kind": "canary_prefix", "type": "random", "l": 3, "k": 3, "token_set": ["Alpha", "beta", "Gamma"],
              "separator": " ", "joiner": " "}
    assert split_secret(prefix, "beta beta Gamma def f(x): return x") == (None, "beta beta Gamma")
    assert split_secret(None, "an ordinary record") == (None, "an ordinary record")
    assert split_secret({"kind": "secrets"}, "an ordinary record") == (None, "an ordinary record")


# -- secret_loss against its formula -------------------------------------------------------------------------

@torch.no_grad()
def test_secret_loss_is_the_mean_log_prob_of_the_secret_given_the_prefix(built, tok):
    data = built["new_token"]
    spec = ModelSpec("t", num_layers=2, hidden_size=64, num_heads=4, context_length=128)
    model = build_scratch_model(spec, tok, seed=0).eval()
    with torch.no_grad():  # an untrained model is near uniform: sharpen it so scores differ by more than rounding
        model.get_output_embeddings().weight.mul_(20.0)
    lm = HFLanguageModel(model, tok, fingerprint="secret-loss-test", max_length=128, batch_size=4)
    texts = [t.text for t in data.targets[:6]] + ["an ordinary record, scored whole"]
    formats = [data.public_format] * 6 + [None]
    m64 = copy.deepcopy(model).double().eval()
    for fmt, text in zip(formats, texts):
        view = AttackerView(game="audit", targets=(Target("0", text),), public_format=fmt,
                            model=RestrictedModel(lm, frozenset({TOKEN_LOGPROBS}), "released"), base=None,
                            reference=None, population=None)
        got = float(np.asarray(SecretLossAttack().score(view))[0])
        if fmt is None:
            head, secret = [], ids(tok, text)
        else:
            cut = text.rindex(SEPARATOR) + 1
            head, secret = ids(tok, text[:cut]), ids(tok, text[cut:])
            assert len(secret) == 4
        x = torch.tensor([[tok.bos_token_id] + head + secret])
        logp = torch.log_softmax(m64(x).logits[0].double(), dim=-1)
        start = 1 + len(head)
        total = sum(float(logp[p - 1, x[0, p]]) for p in range(start, x.shape[1]))
        assert got == pytest.approx(total / len(secret), abs=1e-4)
    # the secret alone is not the whole record: the two attacks give different scores on a canary
    from attacks.loss import LossAttack
    view = AttackerView(game="audit", targets=tuple(Target(str(i), t) for i, t in enumerate(texts[:6])),
                        public_format=data.public_format, base=None, reference=None, population=None,
                        model=RestrictedModel(lm, frozenset({TOKEN_LOGPROBS}), "released"))
    assert not np.allclose(SecretLossAttack().score(view), LossAttack().score(view), atol=1e-3)


# -- bad input: one line naming the fix ----------------------------------------------------------------------

def _one_line(exc: pytest.ExceptionInfo) -> str:
    msg = str(exc.value)
    assert "\n" not in msg
    return msg


def test_bad_parameters_are_refused_with_the_fix(cache):
    with pytest.raises(ConfigError) as e:
        AuditCanaries(design="bigram", secret_tokens=3)
    assert "secret_tokens must be even" in _one_line(e) and "use 4 or 2" in str(e.value)
    with pytest.raises(ConfigError) as e:
        TASKS.create("audit_canaries", {"design": "trigram"})
    assert "new_token" in _one_line(e) and "bigram" in str(e.value)
    with pytest.raises(DataError) as e:
        AuditCanaries(n_canaries=100_000, max_chars_per_source=BUDGET).build(cache)
    assert "lower n_canaries" in _one_line(e)
    with pytest.raises(DataError) as e:  # far more distinct never-seen tokens than the vocabulary has
        AuditCanaries(design="new_token", n_canaries=64, secret_tokens=32, max_chars_per_source=BUDGET).build(cache)
    assert "lower n_canaries or secret_tokens" in _one_line(e) and "reuse: true" in str(e.value)


# -- the holistic game ---------------------------------------------------------------------------------------

def test_audit_canaries_give_a_one_run_bound_in_the_audit_game(cache, tmp_path):
    from bench.runner import Runner
    from bench.store import Store
    from bench.suite import parse_suite

    raw = dict(TINY, games=["audit"], world=dict(TINY["world"], n_audit=100), attacks=["loss", "secret_loss"],
               tasks=[{"name": "audit_canaries", "params": {"design": "new_token", "n_canaries": 160,
                                                            "max_chars_per_source": 400_000}}],
               defenses=[{"name": "finetune", "params": {"epochs": 5}}])
    store = Store(str(tmp_path / "a.db"))
    result = Runner(parse_suite(raw), store, cache, quiet=True).run()
    rows = {(r["attack"], r["metric"]): r for r in store.metric_rows(result.run_id)}
    one_run = rows[("secret_loss", "eps_lb_one_run@95%,delta=1e-05")]
    assert one_run["game"] == "audit" and one_run["flag"] is None
    assert one_run["n_pos"] + one_run["n_neg"] == 100 and one_run["value"] > 0.5
    assert ("loss", "eps_lb_one_run@95%,delta=1e-05") in rows
