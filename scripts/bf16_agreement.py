"""Do bf16 scores rank targets as fp32 scores do? Spearman ρ per attack between two runs of one suite.

Why: bf16 scoring (``PRIVBENCH_SCORE_BF16=1``) is only a safe GPU default if it leaves every attack's
ranking of targets unchanged; AUC and TPR at low FPR depend on the ranking alone. Run the same suite
twice on one machine, fp32 then bf16 (trained models come from the cache, so only scoring differs),
each into its own database, then:

    python scripts/bf16_agreement.py fp32.db bf16.db            # exit 1 if any attack has ρ < 0.999

Evaluations are matched on (task, model, defense, its parameters, seed, game, attack, its parameters)
and scores on target id. Per attack it prints the smallest ρ over evaluations, the largest |ΔAUC| and the
largest |Δscore|; ρ is computed with SciPy (average ranks for ties). Any two runs of one suite compare the same
way (eager against compiled statistics, one GPU against another).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict

import numpy as np
from scipy.stats import spearmanr
from sklearn.metrics import roc_auc_score
from sqlalchemy import create_engine, text

_EVALS = text("SELECT e.id, e.task, e.model, e.defense, e.defense_params_json, e.seed, e.game, e.attack, "
              "e.attack_params_json FROM evaluations e JOIN runs r ON r.id = e.run_id WHERE r.status = 'complete'")
_SCORES = text("SELECT target_id, label, score FROM scores WHERE evaluation_id = :eid")


def _load(url: str) -> dict[tuple, dict[str, tuple[int, float]]]:
    engine = create_engine(url if "://" in url else f"sqlite:///{url}")
    out = {}
    with engine.connect() as conn:
        for eid, *key in conn.execute(_EVALS):
            rows = conn.execute(_SCORES, {"eid": eid}).all()
            if rows:
                out[tuple(key)] = {t: (int(lab), float(s)) for t, lab, s in rows}
    engine.dispose()
    return out


def agreement(a: dict, b: dict) -> dict[str, dict]:
    """Per attack: evaluations compared, smallest Spearman ρ, largest |AUC difference|, largest |score
    difference|."""
    per_attack: dict[str, dict] = defaultdict(lambda: {"evaluations": 0, "min_spearman": 1.0, "max_abs_dauc": 0.0,
                                                       "max_abs_dscore": 0.0})
    for key in sorted(set(a) & set(b), key=str):
        ids = sorted(set(a[key]) & set(b[key]))
        if len(ids) < 3:
            continue
        sa = np.array([a[key][t][1] for t in ids])
        sb = np.array([b[key][t][1] for t in ids])
        labels = np.array([a[key][t][0] for t in ids])
        rho = 1.0 if np.ptp(sa) == 0 and np.ptp(sb) == 0 else float(spearmanr(sa, sb).statistic)
        row = per_attack[key[6]]
        row["evaluations"] += 1
        row["min_spearman"] = min(row["min_spearman"], rho)
        row["max_abs_dscore"] = max(row["max_abs_dscore"], float(np.nanmax(np.abs(sa - sb))))
        if 0 < labels.sum() < len(labels):
            row["max_abs_dauc"] = max(row["max_abs_dauc"], abs(roc_auc_score(labels, sa) - roc_auc_score(labels, sb)))
    return dict(per_attack)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("fp32_db")
    ap.add_argument("bf16_db")
    ap.add_argument("--min-rho", type=float, default=0.999)
    args = ap.parse_args(argv)
    res = agreement(_load(args.fp32_db), _load(args.bf16_db))
    if not res:
        print("no evaluation appears in both databases: run the same suite into each", file=sys.stderr)
        return 2
    ok = True
    for attack, row in sorted(res.items()):
        passed = row["min_spearman"] >= args.min_rho
        ok &= passed
        shown = {k: float(f"{v:.6g}") if isinstance(v, float) else v for k, v in row.items()}
        print(json.dumps({"attack": attack, **shown, "pass": passed}))
    print(json.dumps({"all_attacks_pass": ok, "min_rho": args.min_rho}))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
