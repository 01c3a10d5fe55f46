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

The export owns, in ``--out``, those two files and the pages in ``specs/`` and ``defense/`` (``BOARD_FILES``,
``BOARD_PAGES``); any other file there is the user's and stays. It is all or nothing: the board is built in a
temporary directory next to ``--out`` and moved in only once complete, with the pages it replaces or removes
(stale ones of an earlier export) moved aside first and put back should any move fail, so a failed export
leaves ``--out`` as it was. It never replaces or removes the results database it reads.
"""

from __future__ import annotations

import html
import json
import math
import os
import re
import shutil
import tempfile
from pathlib import Path

import numpy as np
import pandas as pd

from leaderboard.aggregate import DISPLAY_COLUMNS, RANKING_RULE, game_attack_grid
from leaderboard.board import Board, Group, load_board
from leaderboard.plots import headline_chart, headline_points, headline_svg, roc_svg
from leaderboard.queries import (LeaderboardError, read_only_engine, roc_points, roc_summary, scores_frame,
                                 shown_url, sqlite_file)

__all__ = ["BOARD_FILES", "BOARD_PAGES", "check_out", "export_board", "export_db", "group_slug"]

#: what an export owns in --out: these files, and in these folders the pages whose names match the pattern
BOARD_FILES = ("board.json", "index.html")  # in this order: index.html, which links to the rest, comes last
BOARD_PAGES = (("specs", "*.vl.json"), ("defense", "*.html"))

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


def _write_board(board: Board, out: Path, *, source: str, engine) -> dict:
    """Write index.html, board.json, specs/ and defense/ into the empty directory ``out``; return board.json's
    content."""
    for sub, _ in BOARD_PAGES:
        (out / sub).mkdir()
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


def _pages(folder: Path, pattern: str) -> list[Path]:
    """The pages of an earlier export in ``folder`` (files and links whose names match; a directory is not one)."""
    if not folder.is_dir():
        return []
    return sorted(p for p in folder.glob(pattern) if p.is_symlink() or not p.is_dir())


def _owned(out: Path) -> list[Path]:
    """Every path in ``out`` that an export replaces or removes, as far as it exists today."""
    paths = [out / name for name in BOARD_FILES if os.path.lexists(out / name)]
    for sub, pattern in BOARD_PAGES:
        paths += _pages(out / sub, pattern)
    return paths


def _same_file(path: Path, db: Path | None, db_stat) -> bool:
    if db is None:
        return False
    if Path(os.path.realpath(path)) == db:
        return True
    try:
        st = os.stat(path)
    except OSError:
        return False
    return db_stat is not None and (st.st_dev, st.st_ino) == (db_stat.st_dev, db_stat.st_ino)


def _database(db: str | Path | None) -> tuple[Path | None, os.stat_result | None]:
    """(resolved path, stat) of the SQLite file ``db`` names; (None, None) for another database."""
    path = sqlite_file(str(db)) if db is not None else None
    if path is None:
        return None, None
    try:
        return path, os.stat(path)
    except OSError:
        return path, None


def _refuse_database(out: Path, shown_out: str, db: Path | None, db_stat) -> None:
    """Refuse an --out whose board would replace or remove the database file (or the folder it is in)."""
    if db is None:
        return
    real = Path(os.path.realpath(out))
    for sub, _ in BOARD_PAGES:
        folder = Path(os.path.realpath(real / sub))
        if folder == db or folder in db.parents:
            raise LeaderboardError(f"the results database {db} is in {shown_out}/{sub}/, where the board export "
                                   f"writes and removes pages: move the database out of {shown_out}, or give "
                                   f"another --out")
    for path in [real / name for name in BOARD_FILES] + _owned(real):
        if _same_file(path, db, db_stat):
            raise LeaderboardError(f"the results database {db} is the board's {path.relative_to(real)} in "
                                   f"{shown_out}, a file the export replaces: it would overwrite the database; move "
                                   f"the database out of {shown_out}, or give another --out")


def check_out(out: str | Path, db: str | Path | None = None) -> None:
    """Refuse, before anything is read or written, an ``out`` the export cannot complete in (a directory where it
    writes a file, a file where it writes a folder) or where it would replace or remove the database ``db``."""
    shown_out = str(out).rstrip("/") or str(out)
    out = Path(out)
    if os.path.lexists(out) and not out.is_dir():
        raise LeaderboardError(f"--out {shown_out} is a file, not a directory: give a directory (created if "
                               f"missing)")
    _refuse_database(out, shown_out, *_database(db))
    for name in BOARD_FILES:
        if (out / name).is_dir() and not (out / name).is_symlink():
            raise LeaderboardError(f"{shown_out}/{name} is a directory, where the board export writes its {name} "
                                   f"file: move or remove that directory, or give another --out")
    for sub, _ in BOARD_PAGES:
        if os.path.lexists(out / sub) and not (out / sub).is_dir():
            raise LeaderboardError(f"{shown_out}/{sub} is a file, where the board export writes its {sub}/ folder "
                                   f"of pages: move or remove that file, or give another --out")


def _make_dirs(path: Path) -> list[Path]:
    """``mkdir -p path``; return the directories it created, outermost first."""
    missing = []
    while not os.path.lexists(path) and path != path.parent:
        missing.append(path)
        path = path.parent
    created = []
    try:
        for d in reversed(missing):
            d.mkdir()
            created.append(d)
    except BaseException:
        _remove_dirs(created)
        raise
    return created


def _remove_dirs(created: list[Path]) -> None:
    for d in reversed(created):
        try:
            d.rmdir()
        except OSError:
            pass


class _Install:
    """Moves the built board (``work/new``) into ``out`` by renames on one filesystem, moving what it replaces or
    removes into ``work/old`` first; ``rollback`` undoes every move, in reverse."""

    def __init__(self, work: Path, out: Path, db: Path | None, db_stat) -> None:
        self.new, self.old, self.out, self.db, self.db_stat = work / "new", work / "old", out, db, db_stat
        self.created: list[Path] = []
        self.journal: list[tuple[Path, Path | None]] = []  # (path in out, where its earlier file went or None)

    def _set_aside(self, path: Path) -> Path:
        if _same_file(path, self.db, self.db_stat):  # checked before, and again at the very move
            raise LeaderboardError(f"the results database {self.db} is the board's {path.relative_to(self.out)} in "
                                   f"{self.out}, a file the export replaces: it would overwrite the database; move "
                                   f"the database out of {self.out}, or give another --out")
        aside = self.old / path.relative_to(self.out)
        aside.parent.mkdir(parents=True, exist_ok=True)
        os.rename(path, aside)
        self.journal.append((path, aside))
        return aside

    def _place(self, src: Path, dest: Path) -> None:
        if os.path.lexists(dest):
            self._set_aside(dest)
        os.rename(src, dest)
        self.journal.append((dest, None))

    def run(self) -> None:
        if not os.path.lexists(self.out):
            self.out.mkdir()
            self.created.append(self.out)
        for sub, pattern in BOARD_PAGES:
            folder = self.out / sub
            if not os.path.lexists(folder):
                folder.mkdir()
                self.created.append(folder)
            fresh = sorted(p.name for p in (self.new / sub).iterdir())
            for stale in _pages(folder, pattern):  # no stale page of an earlier export
                if stale.name not in fresh:
                    self._set_aside(stale)
            for name in fresh:
                self._place(self.new / sub / name, folder / name)
        for name in BOARD_FILES:
            self._place(self.new / name, self.out / name)

    def rollback(self) -> bool:
        """Undo every move, newest first; True when all of them were undone."""
        ok = True
        for path, aside in reversed(self.journal):
            try:
                if aside is None:
                    os.unlink(path)
                else:
                    os.rename(aside, path)
            except OSError:
                ok = False
        _remove_dirs(self.created)
        return ok


def export_board(board: Board, out: str | Path, *, source: str = "", engine=None,
                 database: str | Path | None = None) -> dict:
    """Write index.html, board.json, specs/ and defense/ under ``out``, all or nothing; return the board.json
    content. ``database``: the SQLite file (path or URL) the board was read from, which the export refuses to
    replace or remove."""
    check_out(out, database)
    db, db_stat = _database(database)
    out = Path(os.path.realpath(out))  # the temporary directory goes next to the real folder: one filesystem
    created = _make_dirs(out.parent)
    try:
        work = Path(tempfile.mkdtemp(prefix=f".{out.name or 'board'}.export-", dir=out.parent))
    except PermissionError:
        if not out.is_dir():
            raise
        # a folder the user may write in a parent they may not (--out /srv/board, --out .): build inside it
        work = Path(tempfile.mkdtemp(prefix=".board.export-", dir=out))
    except BaseException:
        _remove_dirs(created)
        raise
    install = _Install(work, out, db, db_stat)
    try:
        (work / "new").mkdir()
        data = _write_board(board, work / "new", source=source, engine=engine)
        install.run()
    except BaseException:
        if install.rollback():  # else a file whose move could not be undone stays in work/old: not lost
            shutil.rmtree(work, ignore_errors=True)
            _remove_dirs(created)
        raise
    shutil.rmtree(work, ignore_errors=True)
    return data


def export_db(db: str, out: str | Path) -> dict:
    """Open ``db`` read-only, build the board and export it (what ``privbench board export`` runs)."""
    check_out(out, db)  # before the database is opened
    engine = read_only_engine(db)
    try:
        board = load_board(engine)
        return export_board(board, out, source=shown_url(db), engine=engine, database=db)
    finally:
        engine.dispose()
