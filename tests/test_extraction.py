"""Extraction attacks (k-extraction, PII extraction, TTE) and their metrics, on a model that memorises texts."""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pytest

from attacks.extraction import (
    KExtractionAttack, PIIExtractionAttack, TTEAttack, _count_tokens, accuracy_coverage_auc, extraction_metrics,
    leading_digits_matched,
)
from bench.attack import evaluate_attack, run_attack
from bench.errors import CapabilityError, MetricError
from bench.game import AttackerView, Target
from bench.lm import ALL_CAPABILITIES, LanguageModel, RestrictedModel
from bench.metrics import clopper_pearson
from bench.registry import ATTACKS
from bench.signals import TokenSignals

PII_FORMAT = {"kind": "pii", "template": "Name: {name}, ID: {id}", "prompt": "Name: {name}, ID:", "id_digits": 10}
GARBAGE = " qq"
VOCAB = 512
P_MEMORISED, P_GUESS = 0.9, 0.3  # the fake's top probability where it recalls a text / where it guesses


@dataclass(frozen=True)
class SignalsWithTop1(TokenSignals):
    """TokenSignals plus the requested core field ``top1_logprob`` (max next-token log-probability)."""

    top1_logprob: np.ndarray | None = None


def tokenize(text: str) -> list[str]:
    """Stand-in tokenizer: words with their leading whitespace (like byte-level BPE), lossless."""
    return re.findall(r"\s*\S+|\s+", text)


class MemorisingLM(LanguageModel):
    """Greedily continues any token prefix of a memorised text with that text, else emits garbage.

    At the end of a memorised text it stops (an end-of-text token, which generate does not return).
    Its next-token distribution puts P_MEMORISED on the recalled token, P_GUESS on GARBAGE otherwise,
    the rest uniformly on the other VOCAB - 1 tokens.
    """

    def __init__(self, memorised: Sequence[str], *, with_top1_logprob: bool = True) -> None:
        self._mem = [tokenize(t) for t in memorised]
        self.with_top1_logprob = with_top1_logprob
        self.fingerprint = f"memorising-{len(self._mem)}-{with_top1_logprob}"
        self._ids: dict[str, int] = {GARBAGE: 0}
        self.calls: list[tuple[str, int, int]] = []  # (method, n inputs, max_new_tokens or 0)

    def _id(self, token: str) -> int:
        if token not in self._ids:
            self._ids[token] = len(self._ids)
            assert len(self._ids) <= VOCAB
        return self._ids[token]

    def _predict(self, ctx: list[str]) -> tuple[str | None, bool]:
        """(recalled next token or None, whether ctx is a whole memorised text)."""
        for seq in self._mem:
            if seq[:len(ctx)] == ctx and len(seq) > len(ctx):
                return seq[len(ctx)], False
        return None, any(seq == ctx for seq in self._mem)

    def _row(self, ctx: list[str]) -> np.ndarray:
        pred, _ = self._predict(ctx)
        top, p_top = (pred, P_MEMORISED) if pred is not None else (GARBAGE, P_GUESS)
        row = np.full(VOCAB, math.log((1 - p_top) / (VOCAB - 1)))
        row[self._id(top)] = math.log(p_top)
        return row

    def split_at_token(self, text: str, n_tokens: int) -> tuple[str, str]:
        toks = tokenize(text)
        return "".join(toks[:n_tokens]), "".join(toks[n_tokens:])

    def generate(self, prompts: Sequence[str], max_new_tokens: int) -> list[str]:
        self.calls.append(("generate", len(prompts), max_new_tokens))
        outs = []
        for p in prompts:
            ctx, new = tokenize(p), []
            for _ in range(max_new_tokens):
                pred, ended = self._predict(ctx)
                if pred is None and ended:
                    break
                tok = pred if pred is not None else GARBAGE
                ctx, new = ctx + [tok], new + [tok]
            outs.append("".join(new))
        return outs

    def next_token_logprobs(self, prefixes: Sequence[str]) -> np.ndarray:
        self.calls.append(("next_token_logprobs", len(prefixes), 0))
        return np.stack([self._row(tokenize(p)) for p in prefixes]) if prefixes else np.zeros((0, VOCAB))

    def token_signals(self, texts: Sequence[str], prefix: str | None = None) -> list[TokenSignals]:
        self.calls.append(("token_signals", len(texts), 0))
        out = []
        for t in texts:
            toks = tokenize(t)
            rows = [self._row(toks[:j]) for j in range(len(toks))]
            ids = np.array([self._id(x) for x in toks], dtype=np.int32)
            lp = np.array([r[i] for r, i in zip(rows, ids)], dtype=np.float32)
            top1 = np.array([int(np.argmax(r) == i) for r, i in zip(rows, ids)], dtype=np.int8)
            zeros = np.zeros(len(toks), dtype=np.float32)
            fields = dict(token_ids=ids, logprobs=lp, mu=zeros, sigma2=zeros, top1=top1)
            if self.with_top1_logprob:
                out.append(SignalsWithTop1(**fields, top1_logprob=np.array([r.max() for r in rows], np.float32)))
            else:
                out.append(TokenSignals(**fields))
        return out


def view_of(model, texts, public_format=None) -> AttackerView:
    targets = tuple(Target(f"t{i}", t) for i, t in enumerate(texts))
    return AttackerView("adapt", targets, model, None, None, None, None, public_format)


MEMORISED = [
    "the quick brown fox jumps over the lazy dog and runs far away into the dark green forest",
    "a b c d e f g h i j k l m n o p",
    "one two three four five",
]
UNSEEN = [
    "lorem ipsum dolor sit amet consectetur adipiscing elit sed do eiusmod tempor",
    "completely different words that nobody has ever memorised at all here",
]


# -- k-extraction ----------------------------------------------------------------------------------
def test_count_tokens_with_split_only():
    m = MemorisingLM([])
    text = " ".join(f"w{i}" for i in range(37))
    for lo, hi, want in ((0, None, 37), (5, None, 37), (3, 10, 10), (3, 37, 37), (3, 60, 37), (36, None, 37)):
        assert _count_tokens(m.split_at_token, text, lo, hi) == want
    assert _count_tokens(m.split_at_token, "x", 1, None) == 1


def test_k_extraction_is_one_for_memorised_and_zero_otherwise():
    model = MemorisingLM(MEMORISED)
    texts = MEMORISED + UNSEEN
    scores = KExtractionAttack(k=3, suffix_tokens=5).score(view_of(model, texts))
    assert scores.tolist() == [1.0, 1.0, 1.0, 0.0, 0.0]
    # the short memorised text has 2 tokens after its first 3: the suffix is clipped to them
    assert sorted(c[2] for c in model.calls if c[0] == "generate") == [2, 5]
    assert KExtractionAttack(k=3, suffix_tokens=None).score(view_of(model, texts)).tolist() == [1, 1, 1, 0, 0]


def test_k_extraction_cut_inside_a_multibyte_character_moves_to_its_end(tmp_path):
    """Byte-level BPE spreads 'ā' over two tokens; a k-token prefix ending between them decodes to U+FFFD. The
    cut runs on to the character's end (the mitigations suite's null game has such a Wikipedia target)."""
    from transformers import AutoTokenizer

    from bench.tokenizer import train_bpe_tokenizer

    train_bpe_tokenizer([" ".join(["the name of the land"] * 50)] * 20, tmp_path, vocab_size=300)
    tok = AutoTokenizer.from_pretrained(str(tmp_path))

    def split(text, n):
        ids = tok(text, add_special_tokens=False)["input_ids"]
        n = max(0, min(n, len(ids)))
        return tok.decode(ids[:n], skip_special_tokens=True), tok.decode(ids[n:], skip_special_tokens=True)

    text = "the name Afghānistān of the land is old and the land is the name"
    ids = tok(text, add_special_tokens=False)["input_ids"]
    k = next(n for n in range(1, len(ids)) if split(text, n)[0].endswith("\ufffd"))  # inside the first 'ā'
    assert not text.startswith(split(text, k)[0])
    head, suffix, m = KExtractionAttack(k=k, suffix_tokens=5)._cut(split, text)
    assert head.endswith("ā") and text.startswith(head) and m == 5
    # the suffix is the next 5 tokens decoded as `generate` decodes them (its end may fall inside a character too)
    assert text[len(head):].startswith(suffix.rstrip("\ufffd")) and head + suffix == split(text, k + 1 + 5)[0]
    assert split(text, k + 1)[0] == head  # one more token completes the character
    # a target whose text holds U+FFFD itself keeps its k tokens
    plain = "the name \ufffd of the land is old"
    assert KExtractionAttack(k=3, suffix_tokens=2)._cut(split, plain)[0] == split(plain, 3)[0]


def test_k_extraction_suffix_window_and_short_targets():
    model = MemorisingLM(MEMORISED)
    # same first 8 tokens as a memorised text, different afterwards
    diverges = "the quick brown fox jumps over the lazy cat and runs far away into the dark green forest"
    # at most k tokens: nothing to extract
    short = "the quick brown"
    att = KExtractionAttack(k=3, suffix_tokens=5)
    assert att.score(view_of(model, [diverges, short])).tolist() == [1.0, 0.0]  # differs after the window
    assert KExtractionAttack(k=3, suffix_tokens=None).score(view_of(model, [diverges])).tolist() == [0.0]
    assert KExtractionAttack(k=3, suffix_tokens=6).score(view_of(model, [diverges])).tolist() == [0.0]
    # exact comparison: a prefix found in no memorised text gives garbage
    assert att.score(view_of(model, ["quick brown fox jumps over the lazy dog"])).tolist() == [0.0]


def test_k_extraction_needs_split_at_token():
    class NoSplit(MemorisingLM):
        split_at_token = None

    with pytest.raises(CapabilityError, match="split_at_token"):
        KExtractionAttack().score(view_of(NoSplit(MEMORISED), MEMORISED))


def test_k_extraction_through_the_restricted_model():
    """Works through RestrictedModel once the core adds split_at_token; until then fails with a clear message."""
    model = MemorisingLM(MEMORISED)
    att = KExtractionAttack(k=3, suffix_tokens=5)
    restricted = RestrictedModel(model, att.requires, "released")
    v = view_of(restricted, MEMORISED + UNSEEN)
    if hasattr(RestrictedModel, "split_at_token"):
        assert run_attack(att, v).tolist() == [1, 1, 1, 0, 0]
    else:
        with pytest.raises(CapabilityError, match="split_at_token"):
            run_attack(att, v)


# -- PII extraction --------------------------------------------------------------------------------
def test_leading_digits_matched():
    assert leading_digits_matched(" 1234567890", "1234567890") == 10
    assert leading_digits_matched(" 1234567890 and more", "1234567890") == 10
    assert leading_digits_matched(" 1234599999", "1234567890") == 5
    assert leading_digits_matched(" 9234567890", "1234567890") == 0   # later digits do not count
    assert leading_digits_matched(" 12a4567890", "1234567890") == 2
    assert leading_digits_matched("1234", "1234567890") == 4          # separator missing: digits still read
    assert leading_digits_matched("  123", "1234567890") == 0          # something else before the digits
    assert leading_digits_matched(" qq qq", "1234567890") == 0
    assert leading_digits_matched("", "1234567890") == 0


def test_pii_extraction_counts_leading_digits_including_partial_matches():
    targets = ["Name: Alice Smith, ID: 1234567890", "Name: Bob Jones, ID: 1234567890",
               "Name: Carol Diaz, ID: 5550001234", "Name: Dan Wu, ID: 4444444444",
               "Name: Eve Ng, ID: 9876543210"]
    memorised = ["Name: Alice Smith, ID: 1234567890", "Name: Bob Jones, ID: 1234599999",
                 "Name: Dan Wu, ID: 5444444444", "Name: Eve Ng, ID: 987654321"]  # Eve: 9 digits recalled
    model = MemorisingLM(memorised)
    scores = run_attack(PIIExtractionAttack(), view_of(model, targets, PII_FORMAT))
    assert scores.tolist() == [10.0, 5.0, 0.0, 0.0, 9.0]
    assert [c[2] for c in model.calls if c[0] == "generate"] == [11]  # id_digits + the separator
    rows = {r.metric: r for r in extraction_metrics([1, 1, 0, 0, 1], scores, "pii")}
    assert rows["pii_ael_pos"].value == pytest.approx(8.0)
    assert rows["pii_ael_neg"].value == pytest.approx(0.0)
    assert rows["pii_fer_pos"].value == pytest.approx(1 / 3)
    assert (rows["pii_fer_pos"].ci_low, rows["pii_fer_pos"].ci_high) == pytest.approx(clopper_pearson(1, 3))
    assert rows["pii_fer_neg"].value == 0.0


def test_pii_format_matches_the_names2ids_task():
    from tasks import names2ids
    assert PII_FORMAT == {"kind": "pii", "template": names2ids.TEMPLATE, "prompt": names2ids.PROMPT,
                          "id_digits": names2ids.ID_DIGITS}


def test_pii_extraction_needs_a_pii_task_and_well_formed_targets():
    model = MemorisingLM([])
    with pytest.raises(CapabilityError, match="PII task"):
        PIIExtractionAttack().score(view_of(model, ["some text"], {"kind": "canary_prefix"}))
    with pytest.raises(CapabilityError, match="PII task"):
        PIIExtractionAttack().score(view_of(model, ["some text"], None))
    with pytest.raises(ValueError, match="template"):
        PIIExtractionAttack().score(view_of(model, ["Name: X, ID: none"], PII_FORMAT))


# -- token-by-token extraction ---------------------------------------------------------------------
def test_accuracy_coverage_auc_hand_computed():
    # accuracies at coverage 1/4..4/4: 1, 1/2, 2/3, 3/4; first held on (0, 1/4]
    # area = 1/4 + 1/4 * ((1 + 1/2) + (1/2 + 2/3) + (2/3 + 3/4)) / 2 = 73/96
    assert accuracy_coverage_auc([1, 0, 1, 1], [0.9, 0.8, 0.7, 0.6]) == pytest.approx(73 / 96)
    # order of the input does not matter, only the confidences
    assert accuracy_coverage_auc([1, 1, 0, 1], [0.6, 0.9, 0.8, 0.7]) == pytest.approx(73 / 96)
    assert accuracy_coverage_auc([1], [0.3]) == 1.0 and accuracy_coverage_auc([0], [0.3]) == 0.0


def test_accuracy_coverage_auc_equals_acc_for_equal_confidences_and_rewards_good_ranking():
    rng = np.random.default_rng(0)
    correct = (rng.random(101) < 0.37).astype(int)
    assert accuracy_coverage_auc(correct, np.full(101, 0.5)) == pytest.approx(correct.mean())
    good = accuracy_coverage_auc(correct, correct + 0.1 * rng.random(101))
    bad = accuracy_coverage_auc(correct, -correct + 0.1 * rng.random(101))
    assert bad < correct.mean() < good <= 1.0


def test_accuracy_coverage_auc_ties_are_order_free():
    # tied block {1, 0} after a sure hit: expected accuracy 1, 3/4, 2/3
    want = 1 / 3 + 1 / 3 * ((1 + 0.75) + (0.75 + 2 / 3)) / 2
    assert accuracy_coverage_auc([1, 1, 0], [0.9, 0.5, 0.5]) == pytest.approx(want)
    assert accuracy_coverage_auc([1, 0, 1], [0.9, 0.5, 0.5]) == pytest.approx(want)
    with pytest.raises(MetricError):
        accuracy_coverage_auc([], [])
    with pytest.raises(MetricError):
        accuracy_coverage_auc([1, 0], [0.5])
    with pytest.raises(MetricError):
        accuracy_coverage_auc([2], [0.5])


def test_tte_acc_per_target_and_confidences_with_and_without_top1_logprob():
    texts = MEMORISED[:2] + UNSEEN
    partial = "the quick brown fox sleeps"      # 4 of 5 tokens recalled from the first memorised text
    texts.append(partial)
    results = {}
    for flag in (True, False):
        model = MemorisingLM(MEMORISED, with_top1_logprob=flag)
        att = TTEAttack()
        out = evaluate_attack(att, view_of(model, texts))
        scores = out.scores
        # first token of every text follows the empty context: the fake recalls "the" (first memorised text)
        assert scores[0] == 1.0
        assert scores[1] == pytest.approx(15 / 16)          # "a" is not recalled after an empty prefix
        assert scores[2] == 0.0 and scores[3] == 0.0
        assert scores[4] == pytest.approx(4 / 5)
        d = out.details
        assert [len(c) for c in d["correct"]] == [len(tokenize(t)) for t in texts]
        assert [c.mean() for c in d["correct"]] == pytest.approx(scores.tolist())
        results[flag] = (scores, d)
        asked = sum(c[1] for c in model.calls if c[0] == "next_token_logprobs")
        wrong = int(sum((1 - c).sum() for c in d["correct"]))
        assert asked == (0 if flag else wrong)  # the fallback asks only where the true token is not the argmax
    (s1, d1), (s0, d0) = results[True], results[False]
    np.testing.assert_allclose(s1, s0)
    for a, b in zip(d1["confidence"], d0["confidence"]):
        np.testing.assert_allclose(a, b, rtol=1e-5)
    # recalled tokens are predicted with P_MEMORISED, guesses with P_GUESS
    assert set(np.round(np.concatenate(d1["confidence"]), 4)) <= {P_MEMORISED, P_GUESS}


def test_tte_metrics_pool_tokens_per_class():
    model = MemorisingLM(MEMORISED)
    att = TTEAttack()
    texts = MEMORISED[:2] + UNSEEN
    labels = [1, 1, 0, 0]
    out = evaluate_attack(att, view_of(model, texts))
    scores, details = out.scores, out.details
    rows = {r.metric: r for r in extraction_metrics(labels, scores, "tte", details=details)}
    assert rows["tte_acc_pos"].value == pytest.approx((1 + 15 / 16) / 2)
    assert rows["tte_acc_neg"].value == 0.0
    corr = np.concatenate(details["correct"][:2])
    conf = np.concatenate(details["confidence"][:2])
    assert rows["tte_token_acc_pos"].value == pytest.approx(corr.mean())
    assert rows["tte_coverage_auc_pos"].value == pytest.approx(accuracy_coverage_auc(corr, conf))
    # the one miss among members ("a" after the empty prefix) is as confident as the hits: AUC = ACC there
    assert rows["tte_coverage_auc_pos"].value == pytest.approx(rows["tte_token_acc_pos"].value)
    assert rows["tte_coverage_auc_neg"].value == 0.0
    assert "tte_coverage_auc_pos" not in {r.metric for r in extraction_metrics(labels, scores, "tte")}
    with pytest.raises(MetricError, match="details"):
        extraction_metrics(labels[:3], scores[:3], "tte", details=details)


# -- metrics and contract --------------------------------------------------------------------------
def test_extraction_metrics_k_extraction_rates_and_cis():
    labels = [1, 1, 1, 1, 0, 0, 0]
    values = [1, 1, 0, 1, 0, 1, 0]
    rows = {r.metric: r for r in extraction_metrics(labels, values, "k_extraction")}
    assert rows["extractable_count_pos"].value == 3 and rows["extractable_count_neg"].value == 1
    assert rows["extractable_rate_pos"].value == pytest.approx(0.75)
    assert rows["extractable_rate_neg"].value == pytest.approx(1 / 3)
    assert (rows["extractable_rate_pos"].ci_low, rows["extractable_rate_pos"].ci_high) == pytest.approx(
        clopper_pearson(3, 4))
    assert (rows["extractable_rate_neg"].ci_low, rows["extractable_rate_neg"].ci_high) == pytest.approx(
        clopper_pearson(1, 3))
    assert all((r.n_pos, r.n_neg) == (4, 3) for r in rows.values())
    with pytest.raises(MetricError):
        extraction_metrics(labels, [0.5] * 7, "k_extraction")
    with pytest.raises(MetricError):
        extraction_metrics(labels, values, "nope")
    with pytest.raises(MetricError):
        extraction_metrics([1, 0], [11, 0], "pii")


@pytest.mark.parametrize("name", ["k_extraction", "pii_extraction", "tte"])
def test_registered_and_run_attack_contract(name):
    cls = ATTACKS.get(name)
    assert cls.family == "extraction" and cls.requires <= ALL_CAPABILITIES and cls.reference
    assert cls.extraction_kind in ("k_extraction", "pii", "tte")
    if name == "pii_extraction":
        texts = ["Name: Alice Smith, ID: 1234567890", "Name: Bob Jones, ID: 2234567890",
                 "Name: Carol Diaz, ID: 3234567890"]
        model, fmt = MemorisingLM(texts[:1]), PII_FORMAT
    else:
        texts, model, fmt = MEMORISED + UNSEEN, MemorisingLM(MEMORISED), None
    scores = run_attack(ATTACKS.create(name), view_of(model, texts, fmt))
    assert scores.shape == (len(texts),) and np.isfinite(scores).all()
    assert scores[0] > scores[-1]  # a memorised target is extracted more than an unseen one
