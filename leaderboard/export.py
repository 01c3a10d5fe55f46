"""Static export of the board: ``privbench board export --out DIR [--db ...]``.

Writes, from the same frames the Streamlit app shows (leaderboard.board):

* ``index.html``: per group (tracks first, then suites) the ranked table — the cells of
  ``aggregate.display_ranking``, verbatim — the selection-bias note, the per-attack view and the headline plot as
  inline SVG; the ranking rule. No script and no external resource: it opens offline, from disk.
* ``defense/<id>.html``: one page per configuration — facts, games × attacks tables (AUC, TPR at 1% FPR), ROC
  curves (inline SVG) and their summary for the headline game, recomputed from the stored scores, utility rows,
  guarantees, command and versions.
* ``specs/<group>.vl.json``: the Vega-Lite spec of each headline plot (the app's Altair chart, data inline).
* ``board.json``: the data behind all of it (ranking frames with every numeric column, the displayed cells, the
  per-attack view, plot points, per-configuration details).

Every plugin-supplied string is HTML-escaped. Output is deterministic for a given database (no timestamps).
"""

from __future__ import annotations

import html
import json
import math
import re
from pathlib import Path

import numpy as np
import pandas as pd

from leaderboard.aggregate import DISPLAY_COLUMNS, RANKING_RULE, game_attack_grid
from leaderboard.board import Board, Group, load_board
from leaderboard.plots import headline_chart, headline_points, headline_svg, roc_svg
from leaderboard.queries import read_only_engine, roc_points, roc_summary, scores_frame

__all__ = ["export_board", "export_db", "group_slug"]

CSS = """
body{font-family:system-ui,-apple-system,"Segoe UI",sans-serif;margin:1.5rem auto;max-width:1340px;color:#222;
padding:0 1rem;line-height:1.4}
h1{margin-bottom:.2rem}h2{margin-top:2.2rem;border-bottom:1px solid #ddd;padding-bottom:.2rem}
table{border-collapse:collapse;font-size:13px;margin:.5rem 0}
th,td{border:1px solid #ddd;padding:3px 7px;text-align:left;vertical-align:top}
th{background:#f4f4f4}tr.anchor td{background:#fafafa;color:#555}
.note{color:#555;font-size:13px;max-width:1200px}.meta{color:#444;font-size:14px}
nav a{margin-right:1rem}code,pre{background:#f6f6f6;padding:2px 4px;white-space:pre-wrap;word-break:break-all}
details{margin:.5rem 0}table.ranking td{white-space:nowrap;font-variant-numeric:tabular-nums}
table.ranking td:nth-child(2),table.ranking td:nth-child(3){white-space:normal}
"""


def group_slug(name: str) -> str:
    slug = re.sub(r"[^A-Za-z0-9_.-]+", "-", name).strip("-") or "group"
    return slug


def _e(v) -> str:
    return html.escape("" if v is None else str(v))


def _clean(v):
    if isinstance(v, np.generic):
        v = v.item()
    if isinstance(v, float) and not math.isfinite(v):
        return None if math.isnan(v) else ("inf" if v > 0 else "-inf")
    return v


def _records(frame: pd.DataFrame) -> list[dict]:
    return [{str(k): _clean(v) for k, v in r.items()} for r in frame.astype(object).to_dict("records")]


def _table(frame: pd.DataFrame, cls: str = "", row_classes: list[str] | None = None,
           links: dict[int, str] | None = None, link_col: str | None = None) -> str:
    """An HTML table of a frame, every cell escaped text; ``links`` wraps the ``link_col`` cell of a row."""
    head = "".join(f"<th>{_e(c)}</th>" for c in frame.columns)
    body = []
    for i, row in enumerate(frame.astype(object).itertuples(index=False)):
        cells = []
        for c, v in zip(frame.columns, row):
            text = "" if v is None or (isinstance(v, float) and math.isnan(v)) else v
            if isinstance(text, float):
                text = f"{text:.6g}"
            cell = _e(text)
            if links and c == link_col and i in links:
                cell = f'<a href="{_e(links[i])}">{cell}</a>'
            cells.append(f"<td>{cell}</td>")
        rc = f' class="{row_classes[i]}"' if row_classes and row_classes[i] else ""
        body.append(f"<tr{rc}>{''.join(cells)}</tr>")
    return (f'<table class="{cls}"><thead><tr>{head}</tr></thead>\n<tbody>\n' + "\n".join(body) +
            "\n</tbody></table>")


def _page(title: str, body: str) -> str:
    return (f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8"><title>{_e(title)}</title>'
            f'<meta name="viewport" content="width=device-width, initial-scale=1"><style>{CSS}</style></head>\n'
            f"<body>\n{body}\n</body></html>\n")


def _meta_line(group: Group) -> str:
    m = group.meta
    line = (f"task {m['task']} · model {m['model']} · headline game {group.game} · seeds {m['seeds']} · "
            f"{group.n_attacks} attacks ({m['attacks']})")
    if m["track_hash"]:
        line += f" · track hash {m['track_hash']}"
    return line


def _roc(group: Group, cfg: pd.Series, engine) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(ROC points with a ``curve`` label, per-curve summary) of the headline game, from the stored scores."""
    rows = group.config_rows(cfg)
    evs = rows[rows["game"] == group.game][["evaluation_id", "attack", "seed"]].drop_duplicates()
    if evs.empty or engine is None:
        return pd.DataFrame(), pd.DataFrame()
    roc = roc_points(scores_frame(engine, evs["evaluation_id"].tolist())).merge(evs, on="evaluation_id")
    if roc.empty:
        return roc, pd.DataFrame()
    roc["curve"] = roc["attack"] + " (seed " + roc["seed"].astype(str) + ")"
    stored = rows[rows["metric"] == "auc"][["evaluation_id", "value"]].rename(columns={"value": "stored AUC"})
    summary = (evs.merge(roc_summary(roc), on="evaluation_id").merge(stored, on="evaluation_id", how="left")
               .sort_values(["attack", "seed"]).drop(columns="evaluation_id").reset_index(drop=True))
    return roc, summary


def _grid_tables(grid: pd.DataFrame) -> str:
    parts = []
    for metric in ("AUC", "TPR@1%FPR"):
        g = grid[grid["metric"] == metric]
        if g.empty:
            continue
        games = list(dict.fromkeys(g["game"]))
        wide = g.pivot(index="game", columns="attack", values="mean").reindex(games)
        wide = wide.map(lambda v: "—" if v != v else f"{v:.3f}").reset_index()
        wide.columns.name = None
        parts.append(f"<h3>{_e(metric)} (mean over seeds): games × attacks</h3>" + _table(wide, "grid"))
    return "\n".join(parts)


def _defense_page(group: Group, cfg: pd.Series, board: Board, engine) -> tuple[str, dict]:
    facts = group.facts(cfg)
    grid = game_attack_grid(group.config_rows(cfg))
    util = group.config_utility(cfg)
    gts = group.config_guarantees(cfg)
    audit = group.config_audit(cfg)
    roc_pts, roc = _roc(group, cfg, engine)
    runs = board.runs[board.runs["run"].isin([int(x) for x in str(cfg["runs"]).split(", ") if x])]
    versions: dict = {}
    for v in runs["plugin_versions"]:
        try:
            versions.update(json.loads(v))
        except (TypeError, ValueError):
            pass
    try:
        params = json.dumps(json.loads(cfg["params"]), indent=2, sort_keys=True)
    except (TypeError, ValueError):
        params = str(cfg["params"])
    body = [f'<p><a href="../index.html#{_e(group_slug(group.name))}">← {_e(group.title())}</a></p>',
            f"<h1>{_e(cfg['defense'])}</h1>", f'<p class="meta">{_e(_meta_line(group))}</p>',
            _table(facts, "facts"), "<h2>Parameters</h2>", f"<pre>{_e(params)}</pre>",
            "<h2>Games × attacks</h2>", _grid_tables(grid) or "<p>no AUC or TPR stored</p>",
            f"<h2>ROC curves ({_e(group.game)} game)</h2>",
            '<p class="note">From the stored per-sample scores (higher score = member), log–log (points with FPR or '
            "TPR = 0 cannot be drawn); dashed: chance. Per curve, AUC and TPR at 1% FPR recomputed from it, next to "
            "the stored AUC.</p>",
            roc_svg(roc_pts, f"ROC curves, {group.game} game") if not roc.empty else "",
            _table(roc, "roc") if not roc.empty else "<p>no stored scores with both classes</p>",
            "<h2>Utility</h2>", _table(util, "utility") if not util.empty else "<p>no utility rows stored</p>",
            "<h2>Guarantees</h2>", _table(gts, "guarantees") if not gts.empty else "<p>no formal guarantee stored</p>",
            "<h2>Audit: claimed ε vs audited ε lower bound</h2>",
            _table(audit.astype(str), "audit") if not audit.empty else "<p>no ε lower bound stored</p>",
            "<h2>Provenance</h2>", "<p>Command:</p>"]
    body += [f"<pre>{_e(c)}</pre>" for c in sorted(set(runs["command"].astype(str)))]
    body += [_table(runs[["run", "suite", "code_version", "config_hash", "started_at", "finished_at"]].astype(str),
                    "runs"), "<p>Plugin versions:</p>", f"<pre>{_e(json.dumps(versions, indent=2, sort_keys=True))}"
                                                        f"</pre>"]
    details = {"facts": _records(facts), "grid": _records(grid), "roc_summary": _records(roc),
               "utility": _records(util), "guarantees": _records(gts), "plugin_versions": versions,
               "commands": sorted(set(runs["command"].astype(str)))}
    return _page(f"{cfg['defense']} · {group.name} · privbench", "\n".join(body)), details


def export_board(board: Board, out: str | Path, *, source: str = "", engine=None) -> dict:
    """Write index.html, board.json, specs/ and defense/ under ``out``; return the board.json content."""
    out = Path(out)
    for sub, pattern in (("specs", "*.vl.json"), ("defense", "*.html")):  # no stale page of an earlier export
        (out / sub).mkdir(parents=True, exist_ok=True)
        for old in (out / sub).glob(pattern):
            old.unlink()
    nav = " ".join(f'<a href="#{_e(group_slug(n))}">{_e(g.title())}</a>' for n, g in board.groups.items())
    body = ["<h1>privbench leaderboard</h1>",
            f'<p class="meta">One ranking per track; suites without a track follow. Source: {_e(source)} · '
            f"data: <a href=\"board.json\">board.json</a></p>", f"<nav>{nav}</nav>",
            f'<p class="note">{_e(RANKING_RULE)}</p>']
    data = {"source": source, "ranking_rule": RANKING_RULE, "display_columns": DISPLAY_COLUMNS, "groups": []}
    for name, group in board.groups.items():
        slug = group_slug(name)
        pts = headline_points(group.ranking)
        spec = f"specs/{slug}.vl.json"
        if not pts.empty:
            (out / spec).write_text(json.dumps(headline_chart(pts, title=name).to_dict(), indent=1, default=str),
                                    encoding="utf-8")
        links = {i: f"defense/{cid}.html" for i, cid in enumerate(group.ranking["config_id"])}
        rows = ["anchor" if a else "" for a in group.ranking["anchor"]]
        per_attack = group.per_attack()
        body += [f'<section id="{_e(slug)}" data-group="{_e(name)}">', f"<h2>{_e(group.title())}</h2>",
                 f'<p class="meta">{_e(_meta_line(group))}</p>',
                 _table(group.display, "ranking", rows, links, "defense"),
                 f'<p class="note">{_e(group.selection_bias())}</p>',
                 "<details><summary>Per-attack view: each attack's own TPR at 1% FPR and AUC on the headline game"
                 "</summary>" + _table(per_attack, "per-attack") + "</details>"]
        if pts.empty:
            body.append("<p>No configuration has both a privacy value and utility retained: nothing to plot.</p>")
        else:
            body += [headline_svg(pts, f"{name}: privacy vs utility retained"),
                     '<p class="note">Left: worst-case TPR at 1% FPR (log scale; below 0.001 drawn at 0.001; dashed: '
                     "chance). Right: worst-case AUC (dashed: chance 0.5). Bars: 95% CIs; squares: anchors; red: the "
                     f'Pareto front (layer 1) of the ranking. Vega-Lite spec: <a href="{_e(spec)}">{_e(spec)}</a>.'
                     "</p>"]
        body.append("</section>")
        configs = {}
        for cfg in group.ranking.to_dict("records"):
            page, details = _defense_page(group, pd.Series(cfg), board, engine)
            (out / "defense" / f"{cfg['config_id']}.html").write_text(page, encoding="utf-8")
            configs[cfg["config_id"]] = details
        data["groups"].append({"name": name, "kind": group.kind, "slug": slug,
                               "meta": {k: _clean(v) for k, v in group.meta.items()},
                               "selection_bias": group.selection_bias(), "display": _records(group.display),
                               "ranking": _records(group.ranking), "per_attack": _records(per_attack),
                               "plot": _records(pts), "spec": spec if not pts.empty else None, "configs": configs})
    (out / "index.html").write_text(_page("privbench leaderboard", "\n".join(body)), encoding="utf-8")
    (out / "board.json").write_text(json.dumps(data, indent=1, ensure_ascii=False), encoding="utf-8")
    return data


def export_db(db: str, out: str | Path) -> dict:
    """Open ``db`` read-only, build the board and export it (what ``privbench board export`` runs)."""
    engine = read_only_engine(db)
    try:
        board = load_board(engine)
        return export_board(board, out, source=db, engine=engine)
    finally:
        engine.dispose()
