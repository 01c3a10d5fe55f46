"""privbench leaderboard: `streamlit run leaderboard/app.py [-- --db results.db]`.

Reads the results database read-only and renders every value as plain data
(names and descriptions are never interpreted as HTML).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import streamlit as st

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from leaderboard.queries import leaderboard, metric_frame, read_only_engine, utility_frame  # noqa: E402


def _db_arg() -> str:
    """`-- --db PATH` on the streamlit command line, else $PRIVBENCH_DB, else the repo's results.db."""
    default = os.environ.get("PRIVBENCH_DB", str(Path(__file__).resolve().parent.parent / "results.db"))
    parser = argparse.ArgumentParser()
    parser.add_argument("--db", default=default)
    args, _ = parser.parse_known_args(sys.argv[1:])
    return args.db


def main() -> None:
    st.set_page_config(page_title="privbench leaderboard", layout="wide")
    st.title("privbench leaderboard")
    st.caption("Worst-case attack per game (higher AUC = more leakage; 0.5 = chance). "
               "The null game is a control and must stay near 0.5.")
    try:
        engine = read_only_engine(_db_arg())
        metrics, utility = metric_frame(engine), utility_frame(engine)
    except Exception as exc:  # the page must render something useful on a broken or missing database
        st.error(f"cannot read the results database: {exc}")
        return
    if metrics.empty:
        st.info("no complete runs yet: run `privbench run --suite quick`")
        return
    tasks = sorted(metrics.task.unique())
    models = sorted(metrics.model.unique())
    col1, col2 = st.columns(2)
    task = col1.selectbox("task", tasks)
    model = col2.selectbox("model", models)
    m = metrics[(metrics.task == task) & (metrics.model == model)]
    u = utility[(utility.task == task) & (utility.model == model)] if not utility.empty else utility
    st.subheader("defenses")
    st.dataframe(leaderboard(m, u), hide_index=True, width="stretch")
    st.subheader("per-attack breakdown")
    defense = st.selectbox("defense", sorted(m.defense.unique()))
    game = st.selectbox("game", sorted(m.game.unique()))
    sel = m[(m.defense == defense) & (m.game == game)]
    st.dataframe(sel.pivot_table(index="attack", columns="metric", values="value", aggfunc="mean").reset_index(),
                 hide_index=True, width="stretch")
    st.subheader("provenance")
    st.dataframe(m[["run", "suite", "code_version", "command"]].drop_duplicates(), hide_index=True,
                 width="stretch")


main()
