"""scripts/bf16_agreement.py: the rank agreement, AUC and score differences it reports are what an independent
computation gives (it is the check behind the GPU precision and compiled-statistics claims in docs/benchmarks.md)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
from scipy.stats import spearmanr
from sklearn.metrics import roc_auc_score

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "bf16_agreement.py"


def _module():
    spec = importlib.util.spec_from_file_location("bf16_agreement", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_agreement_reports_rho_auc_and_score_differences():
    rng = np.random.default_rng(0)
    labels = rng.integers(0, 2, 40)
    a_scores = rng.normal(size=40) + labels
    b_scores = a_scores + rng.normal(scale=0.3, size=40)  # a perturbed rescoring: ranks move
    key = ("task", "model", "finetune", "{}", 0, "adapt", "loss", "{}")
    same = ("task", "model", "finetune", "{}", 0, "adapt", "zlib", "{}")
    a = {key: {f"t{i}": (int(labels[i]), float(a_scores[i])) for i in range(40)},
         same: {f"t{i}": (int(labels[i]), float(a_scores[i])) for i in range(40)}}
    b = {key: {f"t{i}": (int(labels[i]), float(b_scores[i])) for i in range(40)},
         same: {f"t{i}": (int(labels[i]), float(a_scores[i])) for i in range(40)},
         ("only", "in", "b", "{}", 0, "adapt", "loss", "{}"): {"t0": (1, 0.0)}}
    res = _module().agreement(a, b)
    ids = sorted(f"t{i}" for i in range(40))  # the script matches targets by id, in sorted order
    sa = np.array([a[key][t][1] for t in ids])
    sb = np.array([b[key][t][1] for t in ids])
    y = np.array([a[key][t][0] for t in ids])
    assert res["loss"]["evaluations"] == 1
    assert abs(res["loss"]["min_spearman"] - spearmanr(sa, sb).statistic) < 1e-12
    assert abs(res["loss"]["max_abs_dauc"] - abs(roc_auc_score(y, sa) - roc_auc_score(y, sb))) < 1e-12
    assert res["loss"]["max_abs_dscore"] == float(np.abs(sa - sb).max()) > 0
    assert res["zlib"] == {"evaluations": 1, "min_spearman": 1.0, "max_abs_dauc": 0.0, "max_abs_dscore": 0.0}
