"""Copy one complete run, with every evaluation, score, metric, utility row and guarantee, from one SQLite results
database into another (e.g. a suite rerun in a scratch database into the shipped results.db); optionally drop
runs of the same suite from the destination first, so no old number stays beside the new one.

    python scripts/copy_run.py SRC.db RUN_ID DST.db [--replace-suite]

Both databases must be at the same schema revision (`privbench db upgrade --db ...`). One transaction: the
destination gains the whole run or nothing.
"""

from __future__ import annotations

import argparse
import sqlite3
import sys

CHILD_TABLES = ("utility", "guarantees")  # rows keyed by run_id (evaluations are copied with their children)


def _columns(con: sqlite3.Connection, table: str, schema: str = "main") -> list[str]:
    return [r[1] for r in con.execute(f"PRAGMA {schema}.table_info({table})")]


def copy_run(src: str, run_id: int, dst: str, *, replace_suite: bool = False) -> int:
    con = sqlite3.connect(dst)
    con.execute("ATTACH DATABASE ? AS src", (src,))
    try:
        versions = [con.execute(f"SELECT version_num FROM {s}.alembic_version").fetchall() for s in ("main", "src")]
        if versions[0] != versions[1]:
            raise SystemExit(f"schema revisions differ ({versions[1]} in {src}, {versions[0]} in {dst}): run "
                             f"`privbench db upgrade --db` on the older one first")
        run = con.execute("SELECT suite, status FROM src.runs WHERE id = ?", (run_id,)).fetchone()
        if run is None:
            raise SystemExit(f"{src} has no run {run_id}: `privbench show --list --db {src}` lists its runs")
        if run[1] != "complete":
            raise SystemExit(f"run {run_id} of {src} is {run[1]}, not complete: finish it before copying it")
        with con:  # one transaction
            if replace_suite:
                for (old,) in con.execute("SELECT id FROM main.runs WHERE suite = ?", (run[0],)).fetchall():
                    con.execute("DELETE FROM main.scores WHERE evaluation_id IN "
                                "(SELECT id FROM main.evaluations WHERE run_id = ?)", (old,))
                    con.execute("DELETE FROM main.metrics WHERE evaluation_id IN "
                                "(SELECT id FROM main.evaluations WHERE run_id = ?)", (old,))
                    for table in ("evaluations", *CHILD_TABLES):
                        con.execute(f"DELETE FROM main.{table} WHERE run_id = ?", (old,))
                    con.execute("DELETE FROM main.runs WHERE id = ?", (old,))
            cols = [c for c in _columns(con, "runs") if c != "id"]
            cur = con.execute(f"INSERT INTO main.runs ({', '.join(cols)}) SELECT {', '.join(cols)} FROM src.runs "
                              f"WHERE id = ?", (run_id,))
            new_run = cur.lastrowid
            for table in CHILD_TABLES:
                cols = [c for c in _columns(con, table) if c not in ("id", "run_id")]
                con.execute(f"INSERT INTO main.{table} (run_id, {', '.join(cols)}) SELECT ?, {', '.join(cols)} "
                            f"FROM src.{table} WHERE run_id = ? ORDER BY id", (new_run, run_id))
            ecols = [c for c in _columns(con, "evaluations") if c not in ("id", "run_id")]
            for (old_eval,) in con.execute("SELECT id FROM src.evaluations WHERE run_id = ? ORDER BY id",
                                           (run_id,)).fetchall():
                new_eval = con.execute(f"INSERT INTO main.evaluations (run_id, {', '.join(ecols)}) SELECT ?, "
                                       f"{', '.join(ecols)} FROM src.evaluations WHERE id = ?",
                                       (new_run, old_eval)).lastrowid
                for table in ("scores", "metrics"):
                    cols = [c for c in _columns(con, table) if c not in ("id", "evaluation_id")]
                    con.execute(f"INSERT INTO main.{table} (evaluation_id, {', '.join(cols)}) SELECT ?, "
                                f"{', '.join(cols)} FROM src.{table} WHERE evaluation_id = ? ORDER BY id",
                                (new_eval, old_eval))
        return new_run
    finally:
        con.close()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("src")
    ap.add_argument("run_id", type=int)
    ap.add_argument("dst")
    ap.add_argument("--replace-suite", action="store_true", help="delete the destination's runs of the same suite")
    a = ap.parse_args(argv)
    new = copy_run(a.src, a.run_id, a.dst, replace_suite=a.replace_suite)
    print(f"run {a.run_id} of {a.src} is run {new} of {a.dst}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
