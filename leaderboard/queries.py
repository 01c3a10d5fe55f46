"""Read-only queries for the leaderboard.

Only SQL through SQLAlchemy Core and pandas: this module never imports plugin code (attacks/, defenses/,
tasks/, bench.registry, bench.runner), so opening the leaderboard can never execute a plugin. SQLite files
are opened with the URI ``mode=ro``, so the page cannot write to the results database even by mistake.
"""

from __future__ import annotations

import re
import sqlite3
from pathlib import Path
from urllib.parse import quote

import numpy as np
import pandas as pd
from sklearn.metrics import roc_curve
from sqlalchemy import create_engine, inspect, text
from sqlalchemy.engine import Engine, make_url

__all__ = ["LeaderboardError", "REQUIRED_TABLES", "shown_url", "sqlite_file", "read_only_engine", "check_schema",
           "run_columns", "evaluation_frame", "metric_frame", "utility_frame", "guarantee_frame", "run_frame",
           "scores_frame", "roc_points", "roc_summary", "attack_family"]

REQUIRED_TABLES = ("runs", "evaluations", "metrics", "scores", "utility", "guarantees")
# Optional provenance columns: the first name present in the runs table is read, else "—" is shown.
SUBMITTER_COLUMNS = ("submitter", "submitted_by")
VERIFIED_COLUMNS = ("verified", "verified_ci")


class LeaderboardError(Exception):
    """A results database the page cannot show; the message names the problem and the fix."""


#: execution option of an engine from read_only_engine: its database as messages show it (the engine of a SQLite
#: file has the URL ``sqlite://``: the read-only connection comes from a creator)
SHOWN_OPTION = "leaderboard_database"


def shown_url(db: str) -> str:
    """``db`` as messages and pages show it: a URL's password masked (``user:***@``), the way bench.store shows
    a database (SQLAlchemy's rendering when the URL parses, else the same regular expression as
    ``bench.store._mask_password``, which this module cannot import: the page imports no privbench code beyond
    its own; tests/test_board_export_errors.py checks that the two agree)."""
    if "://" not in db:
        return db
    try:
        return make_url(db).render_as_string(hide_password=True)
    except Exception:
        return re.sub(r"(://[^:/@]*:)[^@/]*@", r"\1***@", db)


def sqlite_file(db: str) -> Path | None:
    """The absolute path of the SQLite file ``db`` names (a path, or a ``sqlite:///`` URL), else None (another
    database, an in-memory one, a ``file:`` URI, a URL that does not parse)."""
    if "://" in db:
        try:
            url = make_url(db)
        except Exception:
            return None
        if url.get_backend_name() != "sqlite" or not url.database or url.database.startswith("file:") \
                or url.database == ":memory:":
            return None
        db = url.database
    return Path(db).expanduser().resolve()


def read_only_engine(db: str) -> Engine:
    """Open a SQLite file read-only (URI ``mode=ro``); other SQLAlchemy URLs as given (PostgreSQL with
    read-only transactions). The page only ever issues SELECTs."""
    if "://" in db:
        try:
            url = make_url(db)
        except Exception:
            raise LeaderboardError(f"malformed database URL {shown_url(db)!r}: pass a file path or a SQLAlchemy "
                                   "URL") from None
    path = sqlite_file(db)
    if path is not None:  # a SQLite file given as a URL is opened read-only like a path
        if not path.is_file():
            raise LeaderboardError(f"no results database at {path}: run `privbench run --suite quick` first, "
                                   "or pass `-- --db PATH` to streamlit")
        uri = f"file:{quote(str(path), safe='/')}?mode=ro"  # percent-encoded: any file name works
        return create_engine("sqlite://", creator=lambda: sqlite3.connect(uri, uri=True, check_same_thread=False),
                             execution_options={SHOWN_OPTION: f"sqlite:///{path}"})
    shown = url.render_as_string(hide_password=True)
    if url.get_backend_name() == "postgresql":  # read-only transactions on the server side too
        return create_engine(url, execution_options={"postgresql_readonly": True, SHOWN_OPTION: shown})
    return create_engine(url, execution_options={SHOWN_OPTION: shown})


def _shown(engine: Engine) -> str:
    """The database of ``engine`` as messages show it (password masked)."""
    return engine.get_execution_options().get(SHOWN_OPTION) or engine.url.render_as_string(hide_password=True)


def check_schema(engine: Engine) -> None:
    """Raise LeaderboardError unless every table the page reads exists."""
    try:
        names = set(inspect(engine).get_table_names())
    except Exception as exc:  # a file that is not SQLite, a refused connection, ...
        first = str(getattr(exc, "orig", exc)).strip().splitlines()
        raise LeaderboardError(f"cannot open the results database ({first[0] if first else type(exc).__name__}): "
                               "pass a privbench results database written by `privbench run`") from None
    missing = [t for t in REQUIRED_TABLES if t not in names]
    if missing:
        raise LeaderboardError(f"not a privbench results database (missing tables: {', '.join(missing)}): "
                               "pass a database written by `privbench run`")
    _check_revision(engine)


def _revisions() -> tuple[str | None, set[str]]:
    """(head, every known revision) of the store's schema, read from the migration scripts next to this package
    (bench/migrations) without importing bench: the page imports no privbench code beyond its own."""
    from alembic.script import ScriptDirectory
    where = Path(__file__).resolve().parent.parent / "bench" / "migrations"
    if not where.is_dir():
        return None, set()
    scripts = ScriptDirectory(str(where))
    return scripts.get_current_head(), {s.revision for s in scripts.walk_revisions()}


def _check_revision(engine: Engine) -> None:
    """Show only a database at this code's head revision (bench/migrate.py says why); the page cannot upgrade a
    database itself, because it never writes."""
    head, known = _revisions()
    if head is None:
        return
    with engine.connect() as conn:
        has_version = inspect(conn).has_table("alembic_version")
        rev = conn.execute(text("SELECT version_num FROM alembic_version")).scalar() if has_version else None
    if rev == head:
        return
    db = _shown(engine)
    if rev is not None and rev not in known:
        raise LeaderboardError(f"the results database has schema revision {rev!r}, newer than this privbench knows: "
                               "upgrade privbench (`pip install -U privbench`) to show it")
    what = f"schema revision {rev!r}" if rev else "an unversioned schema (written before privbench versioned it)"
    raise LeaderboardError(f"the results database has {what}, this privbench needs {head!r}: "
                           f"run `privbench db upgrade --db {db}` first")


def run_columns(engine: Engine) -> dict[str, str | None]:
    """Which optional provenance columns the runs table has: {"submitter": col or None, "verified": ...}."""
    cols = {c["name"] for c in inspect(engine).get_columns("runs")}
    return {"submitter": next((c for c in SUBMITTER_COLUMNS if c in cols), None),
            "verified": next((c for c in VERIFIED_COLUMNS if c in cols), None)}


def _read(engine: Engine, sql: str, **params) -> pd.DataFrame:
    with engine.connect() as conn:
        try:
            return pd.read_sql(text(sql), conn, params=params or None)
        except pd.errors.DatabaseError as exc:
            # pandas wraps SQLAlchemy's error in its own DatabaseError, an OSError (a damaged file would read as
            # a failed write of the board): raise the database's own error, which callers translate
            if isinstance(exc.__cause__, Exception):
                raise exc.__cause__ from None
            raise


EVALUATIONS_SQL = """
SELECT e.id AS evaluation_id, r.id AS run, r.suite, r.code_version, r.command, e.task, e.model, e.defense,
       e.defense_params_json AS params, e.seed, e.game, e.attack, e.attack_params_json AS attack_params,
       e.world_key, e.eval_key, e.duration_s
FROM evaluations e JOIN runs r ON e.run_id = r.id
WHERE r.status = 'complete'
"""

METRICS_SQL = """
SELECT m.evaluation_id, m.metric, m.value, m.ci_low, m.ci_high, m.n_pos, m.n_neg, m.flag
FROM metrics m JOIN evaluations e ON m.evaluation_id = e.id JOIN runs r ON e.run_id = r.id
WHERE r.status = 'complete'
"""

UTILITY_SQL = """
SELECT u.run_id AS run, u.task, u.model, u.defense, u.seed, u.role, u.dataset, u.metric, u.value
FROM utility u JOIN runs r ON u.run_id = r.id WHERE r.status = 'complete'
"""

GUARANTEES_SQL = """
SELECT g.run_id AS run, g.task, g.model, g.defense, g.seed, g.name, g.value, g.details_json AS details
FROM guarantees g JOIN runs r ON g.run_id = r.id WHERE r.status = 'complete'
"""

SCORES_SQL = """
SELECT s.evaluation_id, s.target_id, s.label, s.score FROM scores s
WHERE s.evaluation_id IN ({ids}) ORDER BY s.evaluation_id, s.id
"""


def attack_family(metric_names: set[str]) -> str:
    """The attack family of an evaluation, from the metrics it stored (no plugin import needed).

    Exposure and extraction evaluations also store AUC, so their own metrics take precedence.
    """
    if any(m.startswith("exposure_") for m in metric_names):
        return "exposure"
    if any(m.startswith(("extractable_", "pii_", "tte_")) for m in metric_names):
        return "extraction"
    if "auc" in metric_names:
        return "membership"
    return "other"


def evaluation_frame(engine: Engine) -> pd.DataFrame:
    """Evaluations of complete runs, with the attack family derived from their metrics and the attack's cost.

    ``duration_s`` is what the evaluation took in its own run, and a run that reads an earlier run's greedy
    generations or token signals from the cache times the cache hit. ``attack_cost_s`` is the cost of computing
    it: the longest time any complete run at the same code version spent on the same evaluation (equal
    ``eval_key``: same world, models, defense, game, attack and metric settings), so a configuration whose latest
    run reused the cache still shows what its attacks cost."""
    ev = _read(engine, EVALUATIONS_SQL)
    ev["attack_cost_s"] = ev.groupby(["eval_key", "code_version"])["duration_s"].transform("max")
    names = _read(engine, "SELECT evaluation_id, metric FROM metrics")
    fam = names.groupby("evaluation_id")["metric"].agg(lambda s: attack_family(set(s)))
    ev["family"] = ev["evaluation_id"].map(fam).fillna("other")
    return ev


def _numbers(engine: Engine, frame: pd.DataFrame, table: str, columns: tuple[str, ...]) -> pd.DataFrame:
    """``frame`` with ``columns`` as floats; a value that is no number (text written into a REAL column by hand
    or by another tool: SQLite keeps it) raises LeaderboardError naming the database, the table and the value,
    instead of failing deep inside the aggregation."""
    for col in columns:
        if col not in frame.columns or frame[col].dtype.kind in "fiub":
            continue
        values = pd.to_numeric(frame[col], errors="coerce")
        bad = frame[col].notna() & values.isna()
        if bad.any():
            raise LeaderboardError(f"{_shown(engine)} holds a value that is not a number in table {table} "
                                   f"(column {col}: {frame[col][bad].iloc[0]!r}, {int(bad.sum())} row(s)): restore "
                                   "the database from a copy, or rerun the suite into a new database")
        frame[col] = values.astype(float)
    return frame


def metric_frame(engine: Engine) -> pd.DataFrame:
    """One row per stored metric of a complete run, joined with its evaluation."""
    ev = evaluation_frame(engine)
    metrics = _numbers(engine, _read(engine, METRICS_SQL), "metrics", ("value", "ci_low", "ci_high"))
    return ev.merge(metrics, on="evaluation_id")


def utility_frame(engine: Engine) -> pd.DataFrame:
    return _numbers(engine, _read(engine, UTILITY_SQL), "utility", ("value",))


def guarantee_frame(engine: Engine) -> pd.DataFrame:
    """Formal guarantees, read generically as (name, value); NULL values become NaN."""
    g = _read(engine, GUARANTEES_SQL)
    g["value"] = pd.to_numeric(g["value"], errors="coerce")
    return g


def run_frame(engine: Engine) -> pd.DataFrame:
    """Provenance of every run; submitter/verified read when the columns exist, else "—"."""
    cols = run_columns(engine)
    sub = f"r.{cols['submitter']}" if cols["submitter"] else "NULL"
    ver = f"r.{cols['verified']}" if cols["verified"] else "NULL"
    runs = _read(engine, f"""
        SELECT r.id AS run, r.suite, r.status, r.command, r.code_version, r.config_hash, r.run_key,
               r.seeds_json AS seeds, r.plugin_versions_json AS plugin_versions, r.hardware_json AS hardware,
               r.started_at, r.finished_at, r.duration_s, {sub} AS submitter, {ver} AS verified,
               r.config_json AS config, r.error,
               (SELECT COUNT(*) FROM evaluations e WHERE e.run_id = r.id) AS n_evaluations,
               (SELECT COALESCE(SUM(e.duration_s), 0) FROM evaluations e WHERE e.run_id = r.id) AS attack_seconds
        FROM runs r ORDER BY r.id""")
    runs["submitter"] = runs["submitter"].map(lambda v: "—" if v is None or (isinstance(v, float) and np.isnan(v))
                                              else str(v))
    runs["verified"] = runs["verified"].map(lambda v: "—" if v is None or (isinstance(v, float) and np.isnan(v))
                                            else ("yes" if bool(v) else "no"))
    return runs


def scores_frame(engine: Engine, evaluation_ids: list[int]) -> pd.DataFrame:
    """Per-sample (label, score) of the given evaluations: the source of truth for ROC curves."""
    ids = [int(i) for i in evaluation_ids]
    if not ids:
        return pd.DataFrame(columns=["evaluation_id", "target_id", "label", "score"])
    return _numbers(engine, _read(engine, SCORES_SQL.format(ids=", ".join(str(i) for i in ids))), "scores",
                    ("label", "score"))


def roc_points(scores: pd.DataFrame) -> pd.DataFrame:
    """ROC curve of each evaluation from its per-sample scores (sklearn.metrics.roc_curve, higher = member).

    Returns evaluation_id, fpr, tpr, threshold; evaluations with only one class are skipped (no ROC).
    """
    parts = []
    for eid, grp in scores.groupby("evaluation_id", sort=True):
        y = grp["label"].to_numpy(dtype=int)
        if y.min() == y.max():
            continue
        fpr, tpr, thr = roc_curve(y, grp["score"].to_numpy(dtype=float), drop_intermediate=False)
        parts.append(pd.DataFrame({"evaluation_id": int(eid), "fpr": fpr, "tpr": tpr, "threshold": thr}))
    if not parts:
        return pd.DataFrame(columns=["evaluation_id", "fpr", "tpr", "threshold"])
    return pd.concat(parts, ignore_index=True)


def roc_summary(roc: pd.DataFrame, fpr_target: float = 0.01) -> pd.DataFrame:
    """Per evaluation, from its ROC points: AUC (trapezoid rule, equal to the Mann–Whitney AUC with ties
    counted one half) and TPR at ``fpr_target`` as the largest TPR whose FPR ≤ target (DESIGN.md convention)."""
    rows = []
    for eid, g in roc.groupby("evaluation_id", sort=True):
        fpr, tpr = g["fpr"].to_numpy(dtype=float), g["tpr"].to_numpy(dtype=float)
        ok = fpr <= fpr_target + 1e-12
        rows.append({"evaluation_id": int(eid), "AUC (from ROC)": float(np.trapezoid(tpr, fpr)),
                     f"TPR@{fpr_target:g}FPR (from ROC)": float(tpr[ok].max()) if ok.any() else 0.0})
    return pd.DataFrame(rows, columns=["evaluation_id", "AUC (from ROC)", f"TPR@{fpr_target:g}FPR (from ROC)"])
