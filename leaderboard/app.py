"""privbench leaderboard: `streamlit run leaderboard/app.py [-- --db results.db]`.

Reads the results database read-only (SQLite URI ``mode=ro``) through leaderboard.queries, never imports
plugin code, and shows every plugin-supplied string (task, model, defense and attack names, parameters,
configs) only through st.dataframe / st.text / st.code / widget options, never as markdown or HTML.

Pages: **Ranking** (the first screen: one track at a time, its ranked table, the selection-bias note, the
per-attack view and the headline privacy–utility plot), **Defense page** (one configuration: games × attacks
heatmaps, ROC curves, utility rows, guarantees, the privacy audit, command and versions), **Compare** (two
configurations side by side: facts, and every game × attack cell with B − A) and **All results** (every stored
row, with filters). The Ranking and Defense pages show leaderboard.board, the very frames `privbench board export`
writes. Conventions for seeds, worst cases, CIs, the ranking rule and the Pareto front: leaderboard/aggregate.py.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import altair as alt
import numpy as np
import pandas as pd
import streamlit as st

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from leaderboard.aggregate import (  # noqa: E402
    BASELINES, GAME_ORDER, KEYS, RANKING_RULE, attack_breakdown, config_label, export_bytes, game_attack_grid,
    latest_per_seed, leaderboard_table, pareto_front,
)
from leaderboard.board import Board, Group, board_from_frames  # noqa: E402
from leaderboard.plots import headline_chart, headline_points, heatmap_chart, roc_chart  # noqa: E402
from leaderboard.queries import (  # noqa: E402
    LeaderboardError, check_schema, guarantee_frame, metric_frame, read_only_engine, roc_points, roc_summary,
    run_frame, scores_frame, shown_url, utility_frame,
)

PAGES = ["Ranking", "Defense page", "Compare", "All results"]
VIEWS = ["Leaderboard", "Privacy–utility", "ROC curves", "Per-attack breakdown", "Provenance"]
EPSILON = "guarantee: epsilon"
# first-screen column widths: the ranked table fits 1366 px wide without scrolling sideways
RANKING_WIDTHS = {"rank": 58, "defense": 150, "parameters": 150, "TPR@1%FPR [95% CI]": 148, "AUC [95% CI]": 148,
                  "worst attack": 120, "utility retained [95% CI]": 148, "guarantee": 80,
                  "cost (train+attack)": 110, "seeds": 50}  # 1162 px: the 1366 px screen's wide layout holds 1184


def _db_arg() -> str:
    """`-- --db PATH` on the streamlit command line, else $PRIVBENCH_DB, else the repo's results.db."""
    default = os.environ.get("PRIVBENCH_DB", str(Path(__file__).resolve().parent.parent / "results.db"))
    parser = argparse.ArgumentParser()
    parser.add_argument("--db", default=default)
    args, _ = parser.parse_known_args(sys.argv[1:])
    return args.db


def _load(db: str) -> dict[str, pd.DataFrame]:
    engine = read_only_engine(db)
    try:
        check_schema(engine)
        return {"metrics": metric_frame(engine), "utility": utility_frame(engine),
                "guarantees": guarantee_frame(engine), "runs": run_frame(engine), "engine": engine}
    except Exception:
        engine.dispose()
        raise


def _downloads(frame: pd.DataFrame, name: str, key: str) -> None:
    """CSV and JSON of exactly the frame shown above."""
    c1, c2, _ = st.columns([1, 1, 4])
    c1.download_button("CSV", export_bytes(frame, "csv"), file_name=f"{name}.csv", mime="text/csv",
                       key=f"{key}_csv")
    c2.download_button("JSON", export_bytes(frame, "json"), file_name=f"{name}.json", mime="application/json",
                       key=f"{key}_json")


def _games(metrics: pd.DataFrame) -> list[str]:
    present = set(metrics["game"])
    return [g for g in GAME_ORDER if g in present] + sorted(present - set(GAME_ORDER))


def _filters(metrics: pd.DataFrame) -> dict:
    sb = st.sidebar
    sb.header("Filters")
    f = {
        "task": sb.multiselect("task / split", sorted(metrics["task"].unique()), key="f_task"),
        "model": sb.multiselect("model", sorted(metrics["model"].unique()), key="f_model"),
        "game": sb.multiselect("game (stage)", _games(metrics), key="f_game"),
        "family": sb.multiselect("attack family", sorted(metrics["family"].unique()), key="f_family"),
        "eps_max": sb.number_input("max ε (empty = no limit)", min_value=0.0, value=None, step=1.0,
                                   key="f_eps"),
        "eps_missing": sb.checkbox("keep defenses without an ε", value=True, key="f_eps_missing"),
    }
    sb.caption("An empty selection means all.")
    sb.header("Utility baseline")
    f["baseline"] = sb.radio("Δ loss is measured against", list(BASELINES), key="f_baseline",
                             format_func=lambda b: {"finetune": "finetune defense", "pretrained": "pretrained θ"}[b])
    return f


def _apply(metrics: pd.DataFrame, f: dict) -> pd.DataFrame:
    m = metrics
    for col in ("task", "model", "game", "family"):
        if f[col]:
            m = m[m[col].isin(f[col])]
    return latest_per_seed(m)


def _eps_filter(table: pd.DataFrame, f: dict) -> pd.DataFrame:
    if f["eps_max"] is None or table.empty:
        return table
    eps = table[EPSILON] if EPSILON in table else pd.Series(np.nan, index=table.index)
    keep = (eps <= f["eps_max"]) | (eps.isna() & f["eps_missing"])
    return table[keep]


def _config_picker(table: pd.DataFrame, key: str) -> pd.Series | None:
    if table.empty:
        st.info("no defense configuration matches the filters")
        return None
    idx = st.selectbox("defense configuration", list(table.index), key=key,
                       format_func=lambda i: config_label(table.loc[i]))
    return table.loc[idx]


def _rows_of(metrics: pd.DataFrame, cfg: pd.Series) -> pd.DataFrame:
    sel = np.ones(len(metrics), dtype=bool)
    for k in KEYS:
        sel &= (metrics[k] == cfg[k]).to_numpy()
    return metrics[sel]


# ---------------------------------------------------------------- views


def view_leaderboard(table: pd.DataFrame, f: dict) -> None:
    st.subheader("Defense configurations")
    st.caption("One row per (task, model, defense, params). For each game: the worst-case attack — the attack "
               "with the highest mean AUC (resp. TPR at 1% FPR) over seeds, named in the 'attack' column — as "
               "mean, sd over seeds and 95% CI: for several seeds the Student-t interval of the mean over "
               "seeds, for one seed that seed's stored CI ('CI kind' says which). AUC 0.5 = chance; "
               "the null game is a control and must stay near 0.5. Exposure and extraction rates are the "
               "members' values of the game named in the column, worst over that game's attacks per seed, then "
               "the mean over seeds. Guarantees are read from the guarantees table (name: value; inf = no "
               "guarantee).")
    st.caption("Selection bias: each worst case is the maximum over the 'attacks (n)' attacks run on the same "
               "targets, so it overstates what any single attack achieves, the more so the more attacks there "
               "are; see the Per-attack breakdown view for each attack's own value.")
    st.caption(f"Δ loss = held-out loss minus that of {BASELINES[f['baseline']]}. "
               "Cost = adaptation seconds (as privbench measured adapt; the defense's own report where a run "
               "predates that) and attack seconds (what computing the evaluations took, not a later run's cache "
               "hit), per seed. "
               "'command' and 'code version' name what produced each row.")
    if table.empty:
        st.info("no results match the filters")
        return
    c1, c2 = st.columns([3, 1])
    sort_by = c1.selectbox("sort by", ["(as listed)"] + list(table.columns), key="sort_by")
    desc = c2.checkbox("descending", value=True, key="sort_desc")
    shown = table if sort_by == "(as listed)" else table.sort_values(sort_by, ascending=not desc,
                                                                     na_position="last", kind="stable")
    shown = shown.reset_index(drop=True)
    st.dataframe(shown, hide_index=True, width="stretch", key="main_table")
    _downloads(shown, "leaderboard", "dl_main")


def view_privacy_utility(table: pd.DataFrame, games: list[str]) -> None:
    st.subheader("Privacy–utility trade-off")
    game = st.selectbox("game for the privacy axis", games, key="pu_game",
                        index=games.index("adapt") if "adapt" in games else 0)
    auc_col = f"{game} · max AUC"
    if table.empty or auc_col not in table or "held-out loss" not in table:
        st.info("no configuration has both a worst-case AUC for this game and a held-out loss")
        return
    pts = table[KEYS + [auc_col, "held-out loss"]].rename(columns={auc_col: "worst-case AUC"})
    pts = pts.dropna(subset=["worst-case AUC", "held-out loss"]).reset_index(drop=True)
    front_mask = np.zeros(len(pts), dtype=bool)
    for _, idx in pts.groupby(["task", "model"]).groups.items():  # losses of different tasks/models differ
        front_mask[idx] = pareto_front(pts.loc[idx, "held-out loss"], pts.loc[idx, "worst-case AUC"])
    pts["Pareto front"] = front_mask
    pts = pts.sort_values(["task", "model", "held-out loss"], kind="stable").reset_index(drop=True)
    st.caption("Both axes: lower is better. A configuration is on the Pareto front of its (task, model) when "
               "no other configuration of that task and model has lower-or-equal held-out loss and worst-case "
               "AUC with one strictly lower.")
    plot = pts.assign(world=pts["task"] + " | " + pts["model"])
    base = alt.Chart(plot).encode(
        x=alt.X("held-out loss:Q", scale=alt.Scale(zero=False)),
        y=alt.Y("worst-case AUC:Q", scale=alt.Scale(zero=False)),
        tooltip=["task", "model", "defense", "params", "held-out loss", "worst-case AUC"])
    chart = base.mark_point(size=90, filled=True).encode(
        color=alt.Color("Pareto front:N", scale=alt.Scale(domain=[True, False], range=["#d62728", "#888888"])),
        shape=alt.Shape("world:N", title="task | model"))
    front = base.transform_filter(alt.datum["Pareto front"]).mark_line(color="#d62728").encode(detail="world:N")
    st.altair_chart(chart + front, width="stretch")
    st.dataframe(pts, hide_index=True, width="stretch", key="pu_table")
    _downloads(pts, "privacy_utility", "dl_pu")


def view_roc(table: pd.DataFrame, metrics: pd.DataFrame, engine, games: list[str]) -> None:
    st.subheader("ROC curves (log–log)")
    cfg = _config_picker(table, "roc_config")
    if cfg is None:
        return
    rows = _rows_of(metrics, cfg)
    game = st.selectbox("game", [g for g in games if g in set(rows["game"])], key="roc_game")
    evs = rows[(rows["game"] == game)][["evaluation_id", "attack", "seed"]].drop_duplicates()
    attacks = st.multiselect("attacks (empty = all)", sorted(evs["attack"].unique()), key="roc_attacks")
    if attacks:
        evs = evs[evs["attack"].isin(attacks)]
    roc = roc_points(scores_frame(engine, evs["evaluation_id"].tolist())).merge(evs, on="evaluation_id")
    if roc.empty:
        st.info("no stored per-sample scores with both members and non-members for this selection")
        return
    roc["curve"] = roc["attack"] + " (seed " + roc["seed"].astype(str) + ")"
    shown = roc[["attack", "seed", "evaluation_id", "fpr", "tpr", "threshold"]].reset_index(drop=True)
    st.caption("From the stored per-sample scores (sklearn roc_curve, higher score = member). Log–log axes "
               "show the low-FPR regime; points with FPR = 0 or TPR = 0 cannot be drawn on log axes. "
               "Dashed: chance (TPR = FPR).")
    st.altair_chart(roc_chart(roc), width="stretch")
    stored = rows[(rows["metric"] == "auc")][["evaluation_id", "value"]].rename(columns={"value": "stored AUC"})
    summary = (evs.merge(roc_summary(roc), on="evaluation_id").merge(stored, on="evaluation_id", how="left")
               .sort_values(["attack", "seed"]).reset_index(drop=True))
    st.caption("Per curve: AUC and TPR at 1% FPR recomputed from the ROC points, next to the stored AUC.")
    st.dataframe(summary, hide_index=True, width="stretch", key="roc_summary")
    _downloads(summary, "roc_summary", "dl_roc_summary")
    st.caption("ROC points.")
    st.dataframe(shown, hide_index=True, width="stretch", key="roc_table")
    _downloads(shown, "roc_points", "dl_roc")


def view_breakdown(table: pd.DataFrame, metrics: pd.DataFrame) -> None:
    st.subheader("Per-attack breakdown")
    cfg = _config_picker(table, "bd_config")
    if cfg is None:
        return
    shown = attack_breakdown(_rows_of(metrics, cfg))
    st.caption("Every stored metric of this configuration per game and attack: mean, sd and n over seeds, "
               "the 95% CI (Student-t over seeds for several seeds, the stored per-seed CI for one; 'ci_kind'), "
               "and flags (e.g. an FPR below the resolution 1/n_neg).")
    st.dataframe(shown, hide_index=True, width="stretch", key="bd_table")
    _downloads(shown, "per_attack", "dl_bd")


def view_provenance(runs: pd.DataFrame) -> None:
    st.subheader("Run provenance")
    st.caption("Every run: the command and code version that produced it, its config hash, plugin versions, "
               "seeds, hardware, durations, who submitted it and whether CI verified it ('—' = not recorded).")
    shown = runs.drop(columns=["config"]).reset_index(drop=True)
    st.dataframe(shown, hide_index=True, width="stretch", key="prov_table")
    _downloads(shown, "provenance", "dl_prov")
    run_id = st.selectbox("full config of run", runs["run"].tolist(), key="prov_run")
    cfg = runs.loc[runs["run"] == run_id, "config"].iloc[0]
    try:
        cfg = json.dumps(json.loads(cfg), indent=2, sort_keys=True)
    except (TypeError, ValueError):
        cfg = str(cfg)
    st.code(cfg, language="json")


# ---------------------------------------------------------------- ranking and defense pages


def _open_defense_page() -> None:
    """Callback of the "open the page of" picker: show that configuration on the Defense page."""
    cid = st.session_state.get("open_cfg")
    if cid:
        st.session_state["defense_cfg"] = cid
        st.session_state["page"] = "Defense page"
        st.session_state["open_cfg"] = None


def _cfg_label(group: Group, cid: str) -> str:
    r = group.config(cid)
    rank = "anchor" if r["anchor"] else (f"#{int(r['rank'])}" if r["rank"] == r["rank"] else "unranked")
    return f"{rank} · {r['defense']} · {r['params_summary']}"


def view_ranking(group: Group) -> None:
    meta = group.meta
    st.text(f"{group.title()} · task {meta['task']} · model {meta['model']} · headline game {group.game} · "
            f"seeds {meta['seeds']} · {group.n_attacks} attacks" +
            (f" · track hash {meta['track_hash']}" if meta["track_hash"] else ""))
    if group.display.empty:
        st.info("no configuration of this group has results")
        return
    st.dataframe(group.display, hide_index=True, width="stretch", key="ranking",
                 column_config={c: st.column_config.TextColumn(c, width=w) for c, w in RANKING_WIDTHS.items()})
    st.caption("Ranked by Pareto layer on (worst-case TPR at 1% FPR ↓, utility retained ↑), then utility retained; "
               "anchors (none, finetune) are reference rows without a rank. Values: mean over seeds [95% CI, "
               "Student-t over seeds]. The full rule is below the plot.")
    st.caption(group.selection_bias())
    ids = group.ranking["config_id"].tolist()
    st.selectbox("open the page of", ids, index=None, key="open_cfg", placeholder="a defense configuration…",
                 format_func=lambda cid: _cfg_label(group, cid), on_change=_open_defense_page)
    with st.expander("Per-attack view: each attack's own TPR at 1% FPR and AUC on the headline game"):
        st.dataframe(group.per_attack(), hide_index=True, width="stretch", key="per_attack")
    st.subheader("Privacy vs utility retained")
    pts = headline_points(group.ranking)
    if pts.empty:
        st.info("no configuration has both a privacy value and utility retained: nothing to plot")
    else:
        st.altair_chart(headline_chart(pts), key="headline_plot")
        st.caption("Left: worst-case TPR at 1% FPR (log scale; below 0.001 drawn at 0.001; dashed: chance, "
                   "TPR = FPR = 0.01). Right: worst-case AUC (dashed: chance 0.5). Bars: 95% CIs; squares: "
                   "anchors; red: the Pareto front (layer 1) of the ranking.")
    st.caption(RANKING_RULE)
    _downloads(group.ranking, f"ranking_{group.name}", "dl_ranking")


def view_compare(group: Group) -> None:
    """Two configurations of the group side by side: their facts, and every game × attack cell with the difference
    B − A and whether the seeds' CIs are disjoint (the regression gate's table, for reviewing a submission)."""
    ids = group.ranking["config_id"].tolist()
    if len(ids) < 2:
        st.info("this group has fewer than two configurations to compare")
        return
    for key, default in (("cmp_a", 0), ("cmp_b", 1)):
        if st.session_state.get(key) not in ids:
            st.session_state[key] = ids[default]
    cols = st.columns(2)
    a = cols[0].selectbox("A", ids, key="cmp_a", format_func=lambda c: _cfg_label(group, c))
    b = cols[1].selectbox("B", ids, key="cmp_b", format_func=lambda c: _cfg_label(group, c))
    ra, rb = group.config(a), group.config(b)
    st.subheader("Compare two configurations")
    st.dataframe(group.compare_facts(ra, rb), hide_index=True, width="stretch", key="cmp_facts")
    table = group.compare(ra, rb)
    if table.empty:
        st.info("neither configuration has AUC or TPR rows")
        return
    st.caption("Per game × attack: mean over seeds and 95% CI of A and B, the difference B − A, and whether the "
               "CIs are disjoint (a difference the seeds support). Bars: B − A in AUC; red where the CIs are "
               "disjoint.")
    auc = table[table["metric"] == "AUC"].dropna(subset=["Δ (B − A)"])
    if not auc.empty:
        import altair as alt
        data = auc.assign(cell=auc["game"] + " · " + auc["attack"])
        st.altair_chart(alt.Chart(data).mark_bar().encode(
            x=alt.X("Δ (B − A):Q", title="AUC of B − AUC of A"), y=alt.Y("cell:N", sort=None, title=None),
            color=alt.condition("datum['CIs disjoint']", alt.value("#c0392b"), alt.value("#7f8c8d")),
            tooltip=["game", "attack", "mean A", "mean B", "Δ (B − A)", "CIs disjoint"]), key="cmp_chart")
    st.dataframe(table, hide_index=True, width="stretch", key="cmp_table")


def view_defense(group: Group, board: Board, engine) -> None:
    ids = group.ranking["config_id"].tolist()
    if not ids:
        st.info("no configuration of this group has results")
        return
    if st.session_state.get("defense_cfg") not in ids:
        st.session_state.pop("defense_cfg", None)
    cid = st.selectbox("defense configuration", ids, key="defense_cfg", format_func=lambda c: _cfg_label(group, c))
    r = group.config(cid)
    st.subheader("Defense page")
    st.dataframe(group.facts(r), hide_index=True, width="stretch", key="dp_facts")
    st.caption("Parameters (all, as stored):")
    try:
        st.code(json.dumps(json.loads(r["params"]), indent=2, sort_keys=True), language="json")
    except (TypeError, ValueError):
        st.code(str(r["params"]))
    rows = group.config_rows(r)

    st.subheader("Games × attacks")
    grid = game_attack_grid(rows)
    st.caption("Mean over seeds of each attack's AUC and TPR at 1% FPR in every game of the track (the null game "
               "is a control: it must stay near chance).")
    if not grid.empty:
        st.altair_chart(heatmap_chart(grid), key="dp_heatmap")
        st.dataframe(grid, hide_index=True, width="stretch", key="dp_grid")

    st.subheader("ROC curves")
    games = [g for g in GAME_ORDER if g in set(rows["game"])] + sorted(set(rows["game"]) - set(GAME_ORDER))
    game = st.selectbox("game", games, key="dp_roc_game", index=games.index(group.game) if group.game in games else 0)
    evs = rows[rows["game"] == game][["evaluation_id", "attack", "seed"]].drop_duplicates()
    attacks = st.multiselect("attacks (empty = all)", sorted(evs["attack"].unique()), key="dp_roc_attacks")
    if attacks:
        evs = evs[evs["attack"].isin(attacks)]
    roc = roc_points(scores_frame(engine, evs["evaluation_id"].tolist())).merge(evs, on="evaluation_id")
    if roc.empty:
        st.info("no stored per-sample scores with both members and non-members for this selection")
    else:
        roc["curve"] = roc["attack"] + " (seed " + roc["seed"].astype(str) + ")"
        st.altair_chart(roc_chart(roc), key="dp_roc")
        stored = rows[rows["metric"] == "auc"][["evaluation_id", "value"]].rename(columns={"value": "stored AUC"})
        summary = (evs.merge(roc_summary(roc), on="evaluation_id").merge(stored, on="evaluation_id", how="left")
                   .sort_values(["attack", "seed"]).reset_index(drop=True))
        st.caption("From the stored per-sample scores (sklearn roc_curve, higher score = member), log–log; per "
                   "curve AUC and TPR at 1% FPR recomputed from the curve, next to the stored AUC.")
        st.dataframe(summary, hide_index=True, width="stretch", key="dp_roc_summary")

    st.subheader("Utility")
    util = group.config_utility(r)
    if util.empty:
        st.info("no utility rows stored for this configuration")
    else:
        st.caption("Per seed, as stored: held-out loss and perplexity, utility retained and the gains behind it "
                   "(dataset 'retained'), adapt_seconds (as privbench measured adapt) and train_seconds (the "
                   "defense's own report).")
        st.dataframe(util, hide_index=True, width="stretch", key="dp_utility")

    st.subheader("Guarantees")
    gts = group.config_guarantees(r)
    if gts.empty:
        st.info("no formal guarantee stored for this configuration")
    else:
        st.dataframe(gts, hide_index=True, width="stretch", key="dp_guarantees")

    st.subheader("Audit: claimed ε vs audited ε lower bound")
    audit = group.config_audit(r)
    if audit.empty:
        st.info("no ε lower bound stored for this configuration (runs of privbench before 0.3.0 have none)")
    else:
        st.caption("Per seed and game, the largest lower bound over attacks (docs/audit.md). ROC bounds flagged "
                   "'indicative' come from many targets scored on one model; the one-run bound of the audit game "
                   "is valid for one training run; 'KL, secret-level' checks a secret-level guarantee (Hush) on a "
                   "game whose negatives are the same records with the secret replaced; claim_violated: the audited "
                   "bound exceeds the claim.")
        st.dataframe(audit, hide_index=True, width="stretch", key="dp_audit")

    st.subheader("Provenance")
    runs = board.runs[board.runs["run"].isin([int(x) for x in str(r["runs"]).split(", ") if x])]
    st.caption("The exact command behind this configuration's results:")
    for cmd in sorted(set(runs["command"].astype(str))):
        st.code(cmd, language="bash")
    versions = {}
    for v in runs["plugin_versions"]:
        try:
            versions.update(json.loads(v))
        except (TypeError, ValueError):
            pass
    st.dataframe(runs[["run", "suite", "code_version", "config_hash", "started_at", "finished_at", "submitter",
                       "verified"]].reset_index(drop=True), hide_index=True, width="stretch", key="dp_runs")
    st.caption("Plugin versions of those runs:")
    st.code(json.dumps(versions, indent=2, sort_keys=True), language="json")


def view_all(data: dict) -> None:
    """Every stored row of every complete run, with filters: the database browser."""
    f = _filters(data["metrics"])
    metrics = _apply(data["metrics"], f)
    games = f["game"] or _games(data["metrics"])
    games = [g for g in games if g in set(metrics["game"])]
    table = _eps_filter(leaderboard_table(metrics, data["utility"], data["guarantees"], games=games,
                                          baseline=f["baseline"]), f)
    families = sorted(set(metrics["family"]))
    st.text(f"{len(table)} defense configuration(s) match · games: {', '.join(games) or '—'} · "
            f"attack families: {', '.join(families) or '—'}")
    view = st.radio("view", VIEWS, horizontal=True, key="view", label_visibility="collapsed")
    if view == "Leaderboard":
        view_leaderboard(table, f)
    elif view == "Privacy–utility":
        view_privacy_utility(table, games)
    elif view == "ROC curves":
        view_roc(table, metrics, data["engine"], games)
    elif view == "Per-attack breakdown":
        view_breakdown(table, metrics)
    else:
        view_provenance(data["runs"])


PAGE_SLUGS = {"Ranking": "ranking", "Defense page": "defense", "Compare": "compare", "All results": "all"}


def _from_url(board: Board) -> None:
    """On a session's first run, take track, page and configuration from the URL (``?track=quick&page=defense
    &config=<id>``), so a ranking or a defense page can be linked to."""
    if st.session_state.get("_url_read"):
        return
    st.session_state["_url_read"] = True
    qp = st.query_params
    if qp.get("track") in board.groups and "track" not in st.session_state:
        st.session_state["track"] = qp["track"]
    pages = {v: k for k, v in PAGE_SLUGS.items()}
    if qp.get("page") in pages and "page" not in st.session_state:
        st.session_state["page"] = pages[qp["page"]]
    if qp.get("config") and "defense_cfg" not in st.session_state:
        st.session_state["defense_cfg"] = qp["config"]


def _to_url(track: str, page: str) -> None:
    params = {"track": track, "page": PAGE_SLUGS[page]}
    if page == "Defense page" and st.session_state.get("defense_cfg"):
        params["config"] = st.session_state["defense_cfg"]
    if dict(st.query_params) != params:
        st.query_params.from_dict(params)


def main() -> None:
    st.set_page_config(page_title="privbench leaderboard", layout="wide", initial_sidebar_state="auto")
    head = st.columns([7, 4, 5], vertical_alignment="bottom")  # one row: the table starts high on the screen
    head[0].title("privbench leaderboard")
    db = _db_arg()
    try:
        data = _load(db)
    except LeaderboardError as exc:
        st.error(f"cannot read the results database: {exc}")
        return
    except Exception as exc:  # the page must say what is wrong, never show a traceback
        first = (str(getattr(exc, "orig", exc)).strip().splitlines() or [type(exc).__name__])[0]
        st.error(f"cannot read the results database ({first}): pass a privbench results database with "
                 "`-- --db PATH`")
        return
    try:
        if data["metrics"].empty:
            st.text(f"database: {shown_url(db)} (read-only)")  # a password masked
            st.info("the results database holds no complete runs yet: run `privbench run --suite quick`")
            return
        board = board_from_frames(data["metrics"], data["utility"], data["guarantees"], data["runs"])
        _from_url(board)
        name = head[1].selectbox("track", board.names, key="track", format_func=lambda n: board.groups[n].title(),
                                 disabled=st.session_state.get("page") == "All results")  # browses every run
        page = head[2].radio("page", PAGES, horizontal=True, key="page", label_visibility="collapsed")
        if page == "Ranking":
            view_ranking(board.groups[name])
        elif page == "Defense page":
            view_defense(board.groups[name], board, data["engine"])
        elif page == "Compare":
            view_compare(board.groups[name])
        else:
            view_all(data)
        _to_url(name, page)
        st.text(f"database: {shown_url(db)} (read-only)")  # a password masked
    finally:
        data["engine"].dispose()


main()
