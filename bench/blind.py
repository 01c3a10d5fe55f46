"""A blind baseline: how well does a classifier that never queries the model tell the game's members apart?

Das, Zhang and Tramèr (2024), "Blind baselines beat membership inference attacks for foundation models", show
that when members and non-members come from different pools — MIMIR, or a released model's train and validation
splits, where they differ in date, source or length — a classifier on the texts alone beats published attacks.
A high attack AUC on such a game can then be distribution shift, not leakage.

The challenger (who holds the labels) computes it next to every game of a task whose pretraining membership comes
from the data (a known split, :func:`applies_to`): cross-fitted TF-IDF (word 1–2-grams and character 3–5-grams)
logistic regression on the game's own texts and labels, every text scored by a model that never saw its label.
Its AUC row is flagged ``distribution_shift`` when it exceeds :data:`BLIND_AUC_THRESHOLD` and its bootstrap
interval excludes 0.5 (a point estimate alone flags about one shift-free game in four at 80 per side). On worlds
the challenger draws itself (one pool, a seeded permutation) members and non-members are exchangeable, so the
baseline sits at 0.5 by construction there; it is computed only where the split is given (it can still be called
on any game as a control).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from bench.errors import MetricError
from bench.metrics import MetricRow, membership_metrics, validate_scores

#: a blind AUC above this flags the game: its members and non-members differ in text alone
BLIND_AUC_THRESHOLD = 0.55
FLAG_SHIFT = "distribution_shift"


def applies_to(data) -> bool:
    """True for tasks whose pretraining membership comes from the data (every target carries a known ``a``): only
    there are members and non-members drawn from different pools, so only there can text alone separate them."""
    return bool(data.targets) and all("a" in data.target_meta.get(r.id, {}) for r in data.targets)


def blind_scores(texts: Sequence[str], labels, *, seed: int, n_folds: int = 5) -> np.ndarray:
    """Out-of-fold member probabilities of a bag-of-n-grams logistic regression (stratified k-fold, seeded).

    The vectoriser is fitted inside each fold on the training folds only, so no text's own n-grams or label
    shape the model that scores it. ``n_folds`` is lowered to the size of the smaller class when that is smaller
    (at least 2 per class are needed)."""
    from sklearn.feature_extraction.text import TfidfVectorizer
    from sklearn.linear_model import LogisticRegression
    from sklearn.model_selection import StratifiedKFold
    from sklearn.pipeline import FeatureUnion, make_pipeline

    texts = list(texts)
    if len(texts) != len(labels):
        raise MetricError(f"blind baseline: {len(texts)} texts for {len(labels)} labels: pass one label per text")
    y, _ = validate_scores(labels, np.zeros(len(texts)))   # labels 0/1, both classes (the error says how)
    if not any(t.strip() for t in texts):
        raise MetricError("blind baseline: every text is empty: there is nothing to classify")
    smaller = int(min(y.sum(), len(y) - y.sum()))
    if smaller < 2:
        raise MetricError(f"blind baseline: the smaller class has {smaller} sample(s); cross-fitting needs at least "
                          f"2 members and 2 non-members")
    folds = StratifiedKFold(n_splits=min(n_folds, smaller), shuffle=True, random_state=seed)
    out = np.empty(len(y), dtype=np.float64)
    for train, test in folds.split(np.zeros(len(y)), y):
        model = make_pipeline(
            FeatureUnion([("words", TfidfVectorizer(ngram_range=(1, 2), sublinear_tf=True)),
                          ("chars", TfidfVectorizer(analyzer="char_wb", ngram_range=(3, 5),
                                                    sublinear_tf=True, max_features=50_000))]),
            LogisticRegression(C=1.0, max_iter=2000))
        model.fit([texts[i] for i in train], y[train])
        out[test] = model.predict_proba([texts[i] for i in test])[:, 1]
    return out


def blind_baseline(texts: Sequence[str], labels, *, seed: int, n_folds: int = 5, n_boot: int = 1000,
                   alpha: float = 0.05, fprs: Sequence[float] = (0.01,)) -> list[MetricRow]:
    """Metric rows ``blind_auc`` (flagged ``distribution_shift`` above the threshold) and ``blind_tpr@…`` of the
    cross-fitted blind classifier on one game's texts and labels."""
    scores = blind_scores(texts, labels, seed=seed, n_folds=n_folds)
    rows = membership_metrics(labels, scores, fprs=tuple(fprs), n_boot=n_boot, alpha=alpha, seed=seed)
    out = []
    for r in rows:
        flag = r.flag
        if r.metric == "auc" and r.value > BLIND_AUC_THRESHOLD and r.ci_low is not None and r.ci_low > 0.5:
            flag = FLAG_SHIFT if not flag else f"{flag},{FLAG_SHIFT}"
        out.append(MetricRow("blind_" + r.metric, r.value, r.ci_low, r.ci_high, r.n_pos, r.n_neg, flag))
    return out
