"""Helpers for tests that compare whole result databases: every stored score, metric, utility and guarantee."""

from __future__ import annotations

import shutil
import sqlite3
from pathlib import Path

from bench.store import Store

TINY_WORLD = """\
name: tiny_world
seeds: [0]
tasks: [{name: mini_pile, params: {max_chars_per_source: 400000}}]
models: [{name: nano, params: {pretrain_tokens: 6000, reference_tokens: 4000}}]
defenses: [{name: finetune, params: {epochs: 1}}, lora]
attacks: [loss, zlib, min_k, min_k_pp, reference]
games: GAMES
world: {n_per_group: 8, n_null: 16, adapt_background: 8}
reference: true
metrics: {n_boot: 50}
utility: {n_heldout: 20}
"""


def tiny_world_yaml(games: str = "all") -> str:
    """The smoke suite's structure (reference model, two defenses, five attacks) on a seconds-sized world."""
    return TINY_WORLD.replace("GAMES", games)


def snapshot(db: str | Path, *, drop_utility: tuple[str, ...] = ("train_seconds", "adapt_seconds")) -> dict:
    """Everything a run stored, keyed by content (never by row id or time): evaluations with their scores,
    metric rows, utility rows (minus wall-clock fields) and guarantees."""
    store = Store(f"sqlite:///{db}", create=False)
    runs = store.list_runs()
    out: dict = {"runs": [(r["suite"], r["status"]) for r in runs], "evaluations": {}, "metrics": [],
                 "utility": [], "guarantees": []}
    for r in runs:
        rid = r["id"]
        for e in store.evaluations(rid):
            key = (e["task"], e["model"], e["defense"], e["seed"], e["game"], e["attack"], e["eval_key"])
            assert key not in out["evaluations"], f"duplicate evaluation {key}"
            out["evaluations"][key] = store.scores_for(e["id"])
        out["metrics"] += sorted(tuple((k, v) for k, v in m.items() if k != "run") for m in store.metric_rows(rid))
        out["utility"] += sorted(tuple((k, v) for k, v in u.items() if k != "run")
                                 for u in store.utility_rows(rid) if u["metric"] not in drop_utility)
        out["guarantees"] += sorted(repr(sorted((k, v) for k, v in g.items() if k != "run"))
                                    for g in store.guarantee_rows(rid))
    store.close()
    return out


def integrity_problems(db: str | Path) -> list[str]:
    """Half-written or duplicated rows, found with plain SQL (independent of the store's own code)."""
    con = sqlite3.connect(str(db))
    problems = []
    q = lambda sql: con.execute(sql).fetchall()  # noqa: E731
    problems += [f"evaluation {k} stored {n} times" for k, n in
                 q("SELECT run_id || ':' || eval_key, COUNT(*) FROM evaluations GROUP BY run_id, eval_key "
                   "HAVING COUNT(*) > 1")]
    problems += [f"evaluation {i} has no scores" for (i,) in
                 q("SELECT e.id FROM evaluations e LEFT JOIN scores s ON s.evaluation_id = e.id "
                   "GROUP BY e.id HAVING COUNT(s.id) = 0")]
    problems += [f"evaluation {i} has no metrics" for (i,) in
                 q("SELECT e.id FROM evaluations e LEFT JOIN metrics m ON m.evaluation_id = e.id "
                   "GROUP BY e.id HAVING COUNT(m.id) = 0")]
    problems += [f"score row {i} has no evaluation" for (i,) in
                 q("SELECT s.id FROM scores s LEFT JOIN evaluations e ON e.id = s.evaluation_id WHERE e.id IS NULL")]
    problems += [f"metric row {i} has no evaluation" for (i,) in
                 q("SELECT m.id FROM metrics m LEFT JOIN evaluations e ON e.id = m.evaluation_id "
                   "WHERE e.id IS NULL")]
    problems += [f"utility {k}/{m} stored {n} times" for k, m, n in
                 q("SELECT utility_key, metric, COUNT(*) FROM utility GROUP BY run_id, utility_key, metric "
                   "HAVING COUNT(*) > 1")]
    problems += [f"run {i} left in status {s}" for i, s in q("SELECT id, status FROM runs WHERE status != 'complete'")]
    con.close()
    return problems


def upgraded_copy(src: str | Path, dst: str | Path) -> Path:
    """A copy of a shipped database (results.db, tests/baselines/smoke.db: written before the schema was
    versioned) brought to the current schema with `privbench db upgrade`, so tests can open it."""
    shutil.copyfile(src, dst)
    Store(str(dst), create=False, upgrade=True).close()
    return Path(dst)
