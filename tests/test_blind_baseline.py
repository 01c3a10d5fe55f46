"""The blind baseline (Das, Zhang and Tramèr 2024) next to games whose membership comes from a known split.

A MIMIR-schema file whose members and non-members differ in their text (a deliberate shift) must be flagged; a
split drawn from one pool must stay near 0.5; and the classifier is cross-fitted, so it cannot score a text with
a model that saw its label.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from bench.blind import BLIND_AUC_THRESHOLD, FLAG_SHIFT, applies_to, blind_baseline, blind_scores
from bench.cache import ArtifactCache
from bench.errors import MetricError
from bench.game import GAMES, Challenger
from bench.metrics import roc_auc
from fakes import make_task_data

WORDS = ("river stone cloud market doctor patient record street garden window letter number table paper chair "
         "north south quiet rapid green blue seven eleven orange silver").split()
WORLD = {"n_per_group": 40, "n_null": 40, "adapt_background": 10}
#: 300 members vs 300 non-members in the pretrain game: the AUC's null sd is ~0.024, so 0.5 ± 0.08 is > 3 sd
WORLD_NULL = {"n_per_group": 150, "n_null": 8, "adapt_background": 10}


def _sentences(n: int, seed: int, extra: tuple[str, ...] = ()) -> list[str]:
    rng = np.random.default_rng(seed)
    vocab = tuple(WORDS) + extra
    return [f"note {seed}-{i}: " + " ".join(rng.choice(vocab, size=int(rng.integers(12, 20)))) + "."
            for i in range(n)]


def _mimir(tmp_path, monkeypatch, members, nonmembers):
    """Build a MIMIR task from a local file. The source is given relative to tmp_path: the task config (and so the
    data fingerprint that seeds the Challenger's world draw) holds the path, and an absolute tmp path would give
    every pytest session a different world."""
    from tasks.hub import Mimir
    monkeypatch.chdir(tmp_path)
    pd.DataFrame({"member": members, "nonmember": nonmembers}).to_json("mimir.jsonl", orient="records", lines=True)
    return Mimir(source="mimir.jsonl").build(ArtifactCache(tmp_path / "cache"))


def _pretrain_game_rows(data, seed: int = 0, world=WORLD):
    ch = Challenger(data, world, seed=seed)
    inst = ch.instance(GAMES["pretrain"])
    return blind_baseline([t.text for t in inst.targets], inst.labels, seed=seed, n_boot=200)


def test_shifted_known_split_is_flagged(tmp_path, monkeypatch):
    """Members were written in 2019 with their own jargon; non-members in 2023 with another: separable blind."""
    members = [s.replace("note", "memo 2019") for s in _sentences(300, 1, ("quarterly", "ledger", "audit"))]
    nonmembers = [s.replace("note", "memo 2023") for s in _sentences(300, 2, ("streaming", "podcast", "app"))]
    data = _mimir(tmp_path, monkeypatch, members, nonmembers)
    assert applies_to(data)
    auc = next(r for r in _pretrain_game_rows(data) if r.metric == "blind_auc")
    assert auc.value > 0.9 and auc.value > BLIND_AUC_THRESHOLD and auc.flag == FLAG_SHIFT


def test_split_from_one_pool_stays_near_chance(tmp_path, monkeypatch):
    """Members and non-members are a seeded random split of one pool: no text feature can separate them."""
    pool = _sentences(1200, 3)
    rng = np.random.default_rng(0)
    order = rng.permutation(len(pool))
    data = _mimir(tmp_path, monkeypatch, [pool[i] for i in order[:600]], [pool[i] for i in order[600:]])
    auc = next(r for r in _pretrain_game_rows(data, world=WORLD_NULL) if r.metric == "blind_auc")
    assert (auc.n_pos, auc.n_neg) == (300, 300)
    assert abs(auc.value - 0.5) <= 0.08 and auc.flag is None, auc


def test_challenger_drawn_worlds_are_not_known_splits():
    assert not applies_to(make_task_data(n_targets=50, seed=1))


def test_cross_fitting_never_scores_a_text_with_its_own_label():
    """Random unique strings with random labels: fitted and scored on the same texts, logistic regression
    memorises the labels (AUC near 1); cross-fitted, the blind baseline stays at chance."""
    from sklearn.feature_extraction.text import TfidfVectorizer
    from sklearn.linear_model import LogisticRegression
    rng = np.random.default_rng(4)
    texts = ["".join(rng.choice(list("abcdefghij"), size=30)) for _ in range(400)]
    y = rng.permutation(np.r_[np.ones(200, int), np.zeros(200, int)])
    vec = TfidfVectorizer(analyzer="char_wb", ngram_range=(3, 5))
    x = vec.fit_transform(texts)
    in_sample = LogisticRegression(C=100.0, max_iter=2000).fit(x, y).predict_proba(x)[:, 1]
    assert roc_auc(y, in_sample) > 0.95
    assert abs(roc_auc(y, blind_scores(texts, y, seed=0)) - 0.5) <= 0.08


def test_too_few_samples_is_a_clear_error():
    with pytest.raises(MetricError, match="at least 2 members and 2 non-members"):
        blind_scores(["a b", "c d", "e f"], [1, 0, 0], seed=0)
