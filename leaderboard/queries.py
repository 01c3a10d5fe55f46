"""Read-only queries for the leaderboard. Never imports plugin code; opens SQLite read-only."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
from sqlalchemy import create_engine, text
from sqlalchemy.engine import Engine


def read_only_engine(db: str) -> Engine:
    """Open a SQLite file read-only (URI mode=ro) or any other SQLAlchemy URL as given."""
    if "://" not in db:
        path = Path(db).resolve()
        if not path.is_file():
            raise FileNotFoundError(f"no results database at {path}: run `privbench run --suite quick` first")
        return create_engine(f"sqlite:///file:{path}?mode=ro&uri=true")
    return create_engine(db)


METRICS_SQL = """
SELECT r.id AS run, r.suite, r.code_version, r.command, e.task, e.model, e.defense, e.seed, e.game, e.attack,
       m.metric, m.value, m.ci_low, m.ci_high, m.n_pos, m.n_neg, m.flag
FROM metrics m JOIN evaluations e ON m.evaluation_id = e.id JOIN runs r ON e.run_id = r.id
WHERE r.status = 'complete'
"""

UTILITY_SQL = """
SELECT u.run_id AS run, u.task, u.model, u.defense, u.seed, u.role, u.metric, u.value
FROM utility u JOIN runs r ON u.run_id = r.id WHERE r.status = 'complete'
"""


def metric_frame(engine: Engine) -> pd.DataFrame:
    with engine.connect() as conn:
        return pd.read_sql(text(METRICS_SQL), conn)


def utility_frame(engine: Engine) -> pd.DataFrame:
    with engine.connect() as conn:
        return pd.read_sql(text(UTILITY_SQL), conn)


def leaderboard(metrics: pd.DataFrame, utility: pd.DataFrame) -> pd.DataFrame:
    """One row per (task, model, defense): worst-case attack AUC and TPR@1%FPR per game, mean over seeds."""
    if metrics.empty:
        return pd.DataFrame()
    keys = ["task", "model", "defense"]
    auc = metrics[metrics.metric == "auc"]
    per_seed = auc.groupby(keys + ["game", "seed"])["value"].max().reset_index()
    worst = per_seed.groupby(keys + ["game"])["value"].mean().unstack("game")
    worst.columns = [f"max AUC {g}" for g in worst.columns]
    tpr = metrics[metrics.metric == "tpr@1%fpr"]
    tpr_worst = (tpr.groupby(keys + ["game", "seed"])["value"].max().groupby(keys + ["game"]).mean()
                 .unstack("game"))
    tpr_worst.columns = [f"max TPR@1%FPR {g}" for g in tpr_worst.columns]
    out = worst.join(tpr_worst)
    if not utility.empty:
        adapted = utility[(utility.role == "adapted")]
        util = adapted.pivot_table(index=keys, columns="metric", values="value", aggfunc="mean")
        util.columns = [f"heldout {c}" for c in util.columns]
        out = out.join(util)
    return out.reset_index()
