"""Utility measures: ROUGE against an independent computation, held-out loss from signals, runner rows."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest

from bench.errors import ConfigError, PrivbenchError
from bench.lm import LanguageModel
from bench.runner import Runner
from bench.store import Store
from bench.suite import parse_suite
from bench.utility import continuation_pairs, generation_metrics, heldout_metrics, rouge_scores
from tests.fakes import UnigramLM, make_texts
from worlds import TINY


def _lcs(a: list[str], b: list[str]) -> int:
    dp = [[0] * (len(b) + 1) for _ in range(len(a) + 1)]
    for i in range(len(a)):
        for j in range(len(b)):
            dp[i + 1][j + 1] = dp[i][j] + 1 if a[i] == b[j] else max(dp[i][j + 1], dp[i + 1][j])
    return dp[-1][-1]


def _f(overlap: int, n_pred: int, n_ref: int) -> float:
    if overlap == 0:
        return 0.0
    p, r = overlap / n_pred, overlap / n_ref
    return 2 * p * r / (p + r)


def _independent_rouge(pred: str, ref: str) -> tuple[float, float]:
    """ROUGE-1 and ROUGE-L F1 from their definitions (Lin 2004) on lowercase word tokens."""
    p, r = pred.lower().split(), ref.lower().split()
    overlap = sum((Counter(p) & Counter(r)).values())
    return _f(overlap, len(p), len(r)), _f(_lcs(p, r), len(p), len(r))


def test_rouge_matches_the_definition():
    rng = np.random.default_rng(0)
    words = "the cat sat on a mat and then dog ran far away".split()
    preds, refs = [], []
    for _ in range(40):
        preds.append(" ".join(rng.choice(words, size=int(rng.integers(1, 12)))))
        refs.append(" ".join(rng.choice(words, size=int(rng.integers(1, 12)))))
    got = rouge_scores(preds, refs)
    want = np.array([_independent_rouge(p, r) for p, r in zip(preds, refs)]).mean(axis=0)
    assert got["rouge1"] == pytest.approx(want[0], abs=1e-12)
    assert got["rougeL"] == pytest.approx(want[1], abs=1e-12)
    assert rouge_scores(["a b c"], ["a b c"]) == {"rouge1": 1.0, "rougeL": 1.0}
    with pytest.raises(ValueError, match="2 predictions for 1 references"):
        rouge_scores(["a", "b"], ["a"])


class _Oracle(UnigramLM):
    """Generates each prompt's true continuation: ROUGE must be 1."""

    def __init__(self, texts):
        super().__init__(texts)
        self.truth = {}

    def split_at_token(self, text: str, n_tokens: int) -> tuple[str, str]:
        words = text.split(" ")
        return " ".join(words[:n_tokens]), " ".join(words[n_tokens:])

    def generate(self, prompts, max_new_tokens):
        self.calls.append(("generate", len(prompts)))
        return [self.truth[p] for p in prompts]


def test_generation_metrics_reward_the_true_continuation_only():
    texts = make_texts(10, seed=1, n_words=20)
    lm = _Oracle(texts)
    pairs = continuation_pairs(lm, texts, 5, 8)
    assert len(pairs) == 10
    for (prompt, ref), t in zip(pairs, texts):
        assert t.startswith(prompt + " " + ref)  # prompt, then the reference right after it
        lm.truth[prompt] = ref
    perfect = generation_metrics(lm, texts, n=6, prompt_tokens=5, max_new_tokens=8)
    assert perfect == {"rouge1": 1.0, "rougeL": 1.0, "n_generated": 6.0}
    lm.truth = {p: r[::-1] for p, r in pairs}  # same letters, wrong words
    assert generation_metrics(lm, texts, n=6, prompt_tokens=5, max_new_tokens=8)["rouge1"] < 0.5


def test_heldout_metrics_from_signals():
    texts = make_texts(12, seed=2)
    lm: LanguageModel = UnigramLM(make_texts(50, seed=3))
    values, n_tok = heldout_metrics(lm, texts)
    ids = [UnigramLM.encode(t) for t in texts]
    nll = -sum(float(lm.logp[i].sum()) for i in ids)
    assert n_tok == sum(len(i) for i in ids)
    assert values["loss"] == pytest.approx(nll / n_tok, rel=1e-6)
    assert values["perplexity"] == pytest.approx(np.exp(nll / n_tok), rel=1e-6)
    assert values["next_token_accuracy"] == pytest.approx(sum(int((i == lm.argmax).sum()) for i in ids) / n_tok)


def test_suite_utility_parameters_are_validated():
    with pytest.raises(ConfigError, match="n_generate"):
        parse_suite({**TINY, "utility": {"n_generate": -1}})
    with pytest.raises(PrivbenchError, match="unknown task 'nope'"):
        parse_suite({**TINY, "utility": {"ood": {"name": "nope"}}})
    with pytest.raises(ConfigError, match="'utility' must be a mapping"):
        parse_suite({**TINY, "utility": [1]})
    s = parse_suite({**TINY, "utility": {"n_heldout": 10, "ood": {"name": "mini_pile",
                                                                   "params": {"max_chars_per_source": 100_000}}}})
    assert s.utility_ood is not None and s.utility["ood"]["name"] == "mini_pile"


def test_runner_records_rouge_and_out_of_domain_utility(cache, tmp_path):
    raw = {**TINY, "utility": {"n_heldout": 12, "n_generate": 4, "max_new_tokens": 8,
                               "ood": {"name": "mini_pile", "label": "other",
                                       "params": {"max_chars_per_source": 300_000}}}}
    store = Store(str(tmp_path / "u.db"))
    result = Runner(parse_suite(raw), store, cache, quiet=True).run()
    values: dict = {}
    for r in store.utility_rows(result.run_id):
        values.setdefault((r["dataset"], r["role"]), {})[r["metric"]] = r["value"]
    roles = {"pretrained", "reference", "adapted"}
    assert {role for ds, role in values if ds == "heldout"} == roles
    for role in roles:
        v = values[("heldout", role)]
        assert 0.0 <= v["rouge1"] <= 1.0 and 0.0 <= v["rougeL"] <= v["rouge1"] + 1e-12
        assert v["n_generated"] == 4.0
    assert {role for ds, role in values if ds == "ood:other"} == roles
    assert all(np.isfinite(values[("ood:other", role)]["loss"]) for role in roles)


def test_generations_are_cached_by_model_and_prompt(tmp_path):
    texts = make_texts(6, seed=4, n_words=20)
    lm = _Oracle(texts)
    for prompt, ref in continuation_pairs(lm, texts, 5, 8):
        lm.truth[prompt] = ref
    first = generation_metrics(lm, texts, n=6, prompt_tokens=5, max_new_tokens=8, cache_dir=tmp_path)
    calls = len([c for c in lm.calls if c[0] == "generate"])
    lm.truth = {}  # would raise KeyError if generate ran again
    assert generation_metrics(lm, texts, n=6, prompt_tokens=5, max_new_tokens=8, cache_dir=tmp_path) == first
    assert len([c for c in lm.calls if c[0] == "generate"]) == calls
    (entry,) = tmp_path.glob("*.json")
    entry.write_text("{broken")  # a damaged entry is regenerated, not trusted
    lm.truth = {p: r for p, r in continuation_pairs(lm, texts, 5, 8)}
    assert generation_metrics(lm, texts, n=6, prompt_tokens=5, max_new_tokens=8, cache_dir=tmp_path) == first
