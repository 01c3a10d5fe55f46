"""The leaderboard renders from a results database, read-only, with plugin-supplied text shown as text.

Every number the page shows is checked against an independent computation on the rows this file wrote.
"""

from __future__ import annotations

import io
import json
import re
import sqlite3
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from scipy import stats
from sklearn.metrics import roc_auc_score, roc_curve

from bench.store import Store
from tests.boards import (ADAPTED_LOSS, ANCHORS, ATTACK_SEED, EPSILON, GAME_OFFSET, HOSTILE, PARAMS, TRACK_AUC,
                          TRACK_ORDER, TRACK_RANKS, TRACK_RETAINED, TRACK_TPR, board_of, populate_demo,
                          populate_tracks, auc_value, write_track_run)

APP = Path(__file__).resolve().parent.parent / "leaderboard" / "app.py"
@pytest.fixture(scope="module")
def db(tmp_path_factory):
    path = tmp_path_factory.mktemp("lb") / "results.db"
    written = populate_demo(path)
    return path, written


def _app(db_path: Path, monkeypatch, page: str | None = "All results"):
    """The app on ``db_path``; by default on its "All results" page (the database browser), where the tests of
    every stored row look. ``page=None`` opens the first screen (the ranking)."""
    from streamlit.testing.v1 import AppTest
    monkeypatch.setenv("PRIVBENCH_DB", str(db_path))
    at = AppTest.from_file(str(APP), default_timeout=60)
    if page is not None:
        at.session_state["page"] = page
    return at


def _table(at) -> pd.DataFrame:
    return at.dataframe[0].value


def _row(table: pd.DataFrame, defense: str, task: str = "mini_pile") -> pd.Series:
    sel = table[(table.defense == defense) & (table.task == task)]
    assert len(sel) == 1
    return sel.iloc[0]


def _texts(at) -> list[str]:
    out = []
    for kind in ("markdown", "caption", "title", "subheader", "header", "error", "info", "warning"):
        out += [str(e.value) for e in getattr(at, kind)]
    return out


def test_main_view_worst_case_utility_guarantee_provenance(db, monkeypatch):
    path, _ = db
    before = path.read_bytes()
    at = _app(path, monkeypatch).run()
    assert not at.exception
    table = _table(at)
    assert len(table) == 4  # 3 defenses on mini_pile + finetune on names
    for defense in PARAMS:
        row = _row(table, defense)
        assert row["params"] == json.dumps(PARAMS[defense], sort_keys=True)
        assert row["seeds (n)"] == 2
        for game in GAME_OFFSET:
            # independent: mean over seeds per attack, then the attack with the highest mean
            means = {a: np.mean([auc_value(defense, game, a, s) for s in (0, 1)]) for a in ATTACK_SEED}
            if defense == "finetune" and game == "adapt":
                means["exposure"] = 1.0
            best = max(means, key=means.get)
            assert row[f"{game} · AUC attack"] == best
            assert row[f"{game} · max AUC"] == pytest.approx(means[best])
            assert row[f"{game} · AUC attacks (n)"] == len(means)  # the exposure attack stores an AUC too
            assert row[f"{game} · TPR attacks (n)"] == len(ATTACK_SEED)  # but no TPR
            if best != "exposure":
                vals = [auc_value(defense, game, best, s) for s in (0, 1)]
                assert row[f"{game} · AUC sd"] == pytest.approx(np.std(vals, ddof=1))
                # two seeds: Student-t interval of the mean, not the envelope of the per-seed CIs
                half = stats.t.ppf(0.975, df=1) * np.std(vals, ddof=1) / np.sqrt(2)  # zlib: sd 0, width 0
                lo, hi = np.mean(vals) - half, np.mean(vals) + half
                assert row[f"{game} · AUC 95% CI"] == f"[{lo:.3f}, {hi:.3f}]"
                assert row[f"{game} · AUC 95% CI"] != f"[{min(vals) - 0.05:.3f}, {max(vals) + 0.05:.3f}]"
                assert row[f"{game} · AUC CI kind"] == "Student-t over 2 seeds"
        loss = ADAPTED_LOSS[defense]
        assert row["held-out loss"] == pytest.approx(np.mean(loss))
        delta = [loss[s] - ADAPTED_LOSS["finetune"][s] for s in (0, 1)]  # default baseline: finetune
        assert row["Δ loss vs finetune"] == pytest.approx(np.mean(delta))
        assert row["train seconds, self-reported (mean)"] == pytest.approx(10.5)
        assert row["code version"] == "v1.2" and row["command"] == "privbench run --suite demo"
    # the per-seed max would give 0.675 here; the page reports the best attack on the mean (zlib, 0.85)
    assert _row(table, "dp")["adapt · max AUC"] == pytest.approx(0.65)
    assert _row(table, "dp")["guarantee: epsilon"] == pytest.approx(np.mean(list(EPSILON.values())))
    assert np.isnan(_row(table, "finetune")["guarantee: epsilon"])
    assert _row(table, "finetune")["adapt · canary exposure (mean)"] == pytest.approx(np.mean([4.5, 5.0]))
    assert _row(table, "finetune")["adapt · canary exposure (mean) attacks (n)"] == 1
    assert any("Selection bias" in t and "Per-attack breakdown" in t for t in _texts(at))
    assert any("finetune" in t and "Δ loss" in t for t in _texts(at))  # the page says which baseline
    at.radio(key="f_baseline").set_value("pretrained").run()
    row = _row(_table(at), "dp")
    assert row["Δ loss vs pretrained"] == pytest.approx(np.mean([3.5 - 4.0, 3.7 - 4.2]))
    assert path.read_bytes() == before  # read-only


def test_hostile_plugin_text_is_shown_verbatim_as_text(db, monkeypatch):
    path, _ = db
    at = _app(path, monkeypatch).run()
    table = _table(at)
    row = _row(table, HOSTILE)
    assert row["defense"] == HOSTILE
    assert json.loads(row["params"]) == {"note": HOSTILE}
    assert not any("alert(1)" in t or "<b>" in t for t in _texts(at))  # never markdown / HTML
    at.radio(key="view").set_value("Per-attack breakdown").run()
    box = at.selectbox(key="bd_config")
    assert any(HOSTILE in label for label in box.options)  # options are the shown (formatted) labels
    assert not any("alert(1)" in t for t in _texts(at))


def test_filters_change_the_table(db, monkeypatch):
    path, _ = db
    at = _app(path, monkeypatch).run()
    assert set(_table(at).task) == {"mini_pile", "names"}
    at.multiselect(key="f_task").set_value(["names"]).run()
    assert set(_table(at).task) == {"names"}
    at.multiselect(key="f_task").set_value([]).run()
    at.multiselect(key="f_game").set_value(["adapt"]).run()
    cols = _table(at).columns
    assert "adapt · max AUC" in cols and not any(c.startswith(("null ·", "pretrain ·")) for c in cols)
    # only the exposure family: its AUC (1.0) is the only attack left
    at.multiselect(key="f_family").set_value(["exposure"]).run()
    table = _table(at)
    assert list(table.defense) == ["finetune"] and table.iloc[0]["adapt · AUC attack"] == "exposure"
    at.multiselect(key="f_family").set_value(["membership"]).run()
    assert _row(_table(at), "finetune")["adapt · AUC attack"] == "zlib"
    # ε: at most 8 (the mean of 7.5 and 8.5) and no defenses without ε
    at.checkbox(key="f_eps_missing").uncheck()
    at.number_input(key="f_eps").set_value(8.0).run()
    assert list(_table(at).defense) == ["dp"]
    at.number_input(key="f_eps").set_value(7.0).run()
    assert not at.dataframe and any("no results match" in t for t in _texts(at))
    # sort: descending by held-out loss
    at.number_input(key="f_eps").set_value(None)
    at.checkbox(key="f_eps_missing").check().run()
    at.selectbox(key="sort_by").set_value("held-out loss").run()
    losses = _table(at)["held-out loss"].tolist()
    assert losses == sorted(losses, reverse=True) and len(losses) == 4


def _dominated_brute(points: list[tuple[float, float]]) -> list[bool]:
    return [not any(q[0] <= p[0] and q[1] <= p[1] and q != p for q in points) for p in points]


def test_pareto_front_matches_brute_force():
    from leaderboard.aggregate import pareto_front
    rng = np.random.default_rng(1)
    for trial in range(50):
        n = int(rng.integers(1, 30))
        pts = [(float(x), float(y)) for x, y in rng.integers(0, 6, size=(n, 2))]  # many ties
        got = pareto_front([p[0] for p in pts], [p[1] for p in pts])
        assert got.tolist() == _dominated_brute(pts), pts
    assert pareto_front([1.0, np.nan, 2.0], [1.0, 0.0, 0.5]).tolist() == [True, False, True]


def test_privacy_utility_view_marks_the_pareto_front(db, monkeypatch):
    path, _ = db
    at = _app(path, monkeypatch).run()
    at.multiselect(key="f_task").set_value(["mini_pile"]).run()
    at.radio(key="view").set_value("Privacy–utility").run()
    at.selectbox(key="pu_game").set_value("adapt").run()
    assert not at.exception
    pts = at.dataframe[0].value
    xy = list(zip(pts["held-out loss"], pts["worst-case AUC"]))
    assert pts["Pareto front"].tolist() == _dominated_brute(xy)
    # finetune: loss 3.05, AUC 1.0 (the exposure attack); hostile: 3.25, 0.75; dp: 3.6, 0.65 -> all on the front
    assert pts.set_index("defense")["Pareto front"].to_dict() == {"finetune": True, "dp": True, HOSTILE: True}
    assert pts.set_index("defense")["worst-case AUC"].to_dict() == pytest.approx(
        {"finetune": 1.0, "dp": 0.65, HOSTILE: 0.75})
    # with every task shown, the front is per (task, model): `names` has its own front
    at.multiselect(key="f_task").set_value([]).run()
    pts = at.dataframe[0].value
    for _, grp in pts.groupby(["task", "model"]):
        xy = list(zip(grp["held-out loss"], grp["worst-case AUC"]))
        assert grp["Pareto front"].tolist() == _dominated_brute(xy)
    assert pts[pts.task == "names"]["Pareto front"].tolist() == [True]
    # across tasks, names/finetune (3.05, 0.85) would have dominated mini_pile/finetune (3.05, 1.0)
    assert pts[(pts.task == "mini_pile") & (pts.defense == "finetune")]["Pareto front"].tolist() == [True]


def test_roc_points_match_sklearn(db, monkeypatch):
    path, written = db
    at = _app(path, monkeypatch).run()
    at.radio(key="view").set_value("ROC curves").run()
    box = at.selectbox(key="roc_config")
    box.select_index(next(i for i, label in enumerate(box.options) if "| dp |" in label)).run()
    at.selectbox(key="roc_game").set_value("pretrain").run()
    at.multiselect(key="roc_attacks").set_value(["loss"]).run()
    assert not at.exception
    summary, roc = at.dataframe[0].value, at.dataframe[1].value
    assert set(roc.attack) == {"loss"} and set(roc.seed) == {0, 1}
    for seed in (0, 1):
        labels, scores = written[f"mini_pile-dp-{seed}-pretrain-loss"]
        fpr, tpr, thr = roc_curve(labels, scores, drop_intermediate=False)
        got = roc[roc.seed == seed]
        np.testing.assert_allclose(got.fpr, fpr)
        np.testing.assert_allclose(got.tpr, tpr)
        np.testing.assert_allclose(got.threshold[1:], thr[1:])
        row = summary[summary.seed == seed].iloc[0]
        assert row["AUC (from ROC)"] == pytest.approx(roc_auc_score(labels, scores))
        assert row["stored AUC"] == pytest.approx(auc_value("dp", "pretrain", "loss", seed))
        # independent TPR at 1% FPR: largest TPR over thresholds whose FPR <= 1% (here: no false positive)
        y, sc = np.array(labels), np.array(scores)
        best = max(((sc[y == 1] >= t).mean() for t in np.r_[np.inf, sc] if (sc[y == 0] >= t).mean() <= 0.01))
        assert row["TPR@0.01FPR (from ROC)"] == pytest.approx(best)


def _downloads(monkeypatch) -> list:
    """Record the in-memory media stores AppTest creates, to read what a download button serves."""
    import streamlit.testing.v1.app_test as app_test
    stores = []

    class Recording(app_test.MemoryMediaFileStorage):
        def __init__(self, *a, **k):
            super().__init__(*a, **k)
            stores.append(self)

    monkeypatch.setattr(app_test, "MemoryMediaFileStorage", Recording)
    return stores


def _served(stores, button) -> bytes:
    name = button.proto.url.rsplit("/", 1)[-1]
    return stores[-1].get_file(name).content


@pytest.mark.parametrize("view", ["Leaderboard", "ROC curves", "Provenance"])
def test_export_matches_the_shown_frame(db, monkeypatch, view):
    path, _ = db
    stores = _downloads(monkeypatch)
    at = _app(path, monkeypatch).run()
    at.radio(key="view").set_value(view).run()
    assert not at.exception
    shown = at.dataframe[0].value
    csv_button, json_button = at.get("download_button")[:2]  # the buttons right under the first table
    assert (csv_button.label, json_button.label) == ("CSV", "JSON")
    csv = _served(stores, csv_button)
    assert csv.decode() == shown.to_csv(index=False)
    records = json.loads(_served(stores, json_button))
    assert len(records) == len(shown) and list(records[0]) == list(shown.columns)
    back = pd.DataFrame(records)
    for col in shown.columns:
        if pd.api.types.is_numeric_dtype(shown[col]) and not pd.api.types.is_bool_dtype(shown[col]):
            finite = np.isfinite(shown[col].astype(float))
            np.testing.assert_allclose(back[col][finite].astype(float), shown[col][finite].astype(float))
        else:
            assert back[col].astype(str).tolist() == shown[col].astype(str).tolist()
    pd.testing.assert_frame_equal(pd.read_csv(io.BytesIO(csv)).iloc[:, :0], shown.iloc[:, :0])


def test_provenance_reads_optional_columns(db, monkeypatch, tmp_path):
    path, _ = db
    at = _app(path, monkeypatch).run()
    at.radio(key="view").set_value("Provenance").run()
    runs = at.dataframe[0].value
    row = runs.iloc[0]
    assert row["command"] == "privbench run --suite demo" and row["code_version"] == "v1.2"
    assert row["config_hash"] == "h1" and json.loads(row["plugin_versions"]) == {"attack:loss": "0.1"}
    assert row["submitter"] == "—" and row["verified"] == "no"  # submitted_by NULL, verified_ci false
    assert json.loads(at.code[0].value) == {"x": 1}
    # a database without the submitter/verified columns shows "—"
    copy = tmp_path / "old.db"
    copy.write_bytes(path.read_bytes())
    with sqlite3.connect(copy) as con:
        con.execute("ALTER TABLE runs DROP COLUMN submitted_by")
        con.execute("ALTER TABLE runs DROP COLUMN verified_ci")
    at = _app(copy, monkeypatch).run()
    at.radio(key="view").set_value("Provenance").run()
    row = at.dataframe[0].value.iloc[0]
    assert row["submitter"] == "—" and row["verified"] == "—"
    # and the renamed columns of the submission schema are read when present
    with sqlite3.connect(copy) as con:
        con.execute("ALTER TABLE runs ADD COLUMN submitter VARCHAR(255)")
        con.execute("ALTER TABLE runs ADD COLUMN verified BOOLEAN")
        con.execute("UPDATE runs SET submitter = ?, verified = 1", (HOSTILE,))
    at = _app(copy, monkeypatch).run()
    at.radio(key="view").set_value("Provenance").run()
    row = at.dataframe[0].value.iloc[0]
    assert row["submitter"] == HOSTILE and row["verified"] == "yes"


def test_missing_database_shows_an_error(tmp_path, monkeypatch):
    at = _app(tmp_path / "nope.db", monkeypatch).run()
    assert not at.exception
    assert any("cannot read the results database" in e.value and "privbench run" in e.value for e in at.error)


def test_not_a_database_shows_an_error(tmp_path, monkeypatch):
    bad = tmp_path / "bad.db"
    bad.write_bytes(b"this is not sqlite" * 100)
    at = _app(bad, monkeypatch).run()
    assert not at.exception
    assert any("cannot read the results database" in e.value for e in at.error)
    other = tmp_path / "other.db"
    sqlite3.connect(other).execute("CREATE TABLE t (x)").connection.close()
    at = _app(other, monkeypatch).run()
    assert not at.exception
    assert any("not a privbench results database" in e.value for e in at.error)


def test_empty_database_says_so(tmp_path, monkeypatch):
    path = tmp_path / "empty.db"
    Store(str(path)).close()
    at = _app(path, monkeypatch).run()
    assert not at.exception and not at.error
    assert any("no complete runs" in i.value for i in at.info)


def test_leaderboard_never_imports_plugin_code():
    """The page's modules import only SQL/pandas/streamlit, so opening it cannot run a plugin."""
    import ast
    import subprocess
    import sys
    forbidden = ("attacks", "defenses", "tasks", "bench")
    for src in (APP.parent).glob("*.py"):
        for node in ast.walk(ast.parse(src.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else (
                [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            assert not any(n.split(".")[0] in forbidden for n in names), (src.name, names)
    code = ("import sys, leaderboard.queries, leaderboard.aggregate; "
            "bad = [m for m in sys.modules if m.split('.')[0] in ('attacks', 'defenses', 'tasks', 'bench')]; "
            "print(bad); sys.exit(1 if bad else 0)")
    res = subprocess.run([sys.executable, "-c", code], cwd=APP.parent.parent, capture_output=True, text=True,
                         timeout=60)
    assert res.returncode == 0, res.stdout + res.stderr


def test_latest_run_wins_per_configuration_and_seed():
    from leaderboard.aggregate import latest_per_seed
    rows = pd.DataFrame({"task": "t", "model": "m", "defense": ["d", "d", "d", "e"], "params": "{}",
                         "seed": [0, 0, 1, 0], "run": [1, 2, 1, 1], "value": [0.9, 0.6, 0.7, 0.8]})
    kept = latest_per_seed(rows)
    # (d, seed 0): run 2 replaces run 1; (d, seed 1) and (e, seed 0) exist in run 1 only
    assert sorted(zip(kept.defense, kept.seed, kept.run)) == [("d", 0, 2), ("d", 1, 1), ("e", 0, 1)]


def test_engine_is_read_only_for_paths_and_sqlite_urls(db, tmp_path):
    from sqlalchemy import text
    from leaderboard.queries import read_only_engine
    path, _ = db
    odd = tmp_path / "odd name #1?%.db"  # URI metacharacters in the file name
    odd.write_bytes(path.read_bytes())
    for ref in (str(path), f"sqlite:///{path}", str(odd)):
        engine = read_only_engine(ref)
        with engine.connect() as conn:
            assert conn.execute(text("SELECT COUNT(*) FROM runs")).scalar() == 1
            with pytest.raises(Exception, match="readonly"):
                conn.execute(text("DELETE FROM runs"))
        engine.dispose()


def _metrics_frame(rows: list[tuple]) -> pd.DataFrame:
    """A metric frame as leaderboard.queries returns it, from (defense, game, attack, seed, metric, value,
    ci_low, ci_high) tuples; one evaluation per (defense, game, attack, seed)."""
    cols = ["defense", "game", "attack", "seed", "metric", "value", "ci_low", "ci_high"]
    f = pd.DataFrame(rows, columns=cols)
    f = f.assign(task="t", model="m", params="{}", run=1, family="membership", n_pos=50, n_neg=50, flag=None,
                 duration_s=1.0, attack_cost_s=1.0, code_version="v", command="c")
    f["evaluation_id"] = f.groupby(["defense", "game", "attack", "seed"], sort=False).ngroup()
    return f


def test_worst_case_ci_is_student_t_over_seeds():
    from leaderboard.aggregate import worst_case
    vals = {"loss": [0.62, 0.70, 0.66, 0.75], "zlib": [0.60, 0.61, 0.59, 0.62]}
    rows = [("d", "adapt", a, s, "auc", v, 0.0, 1.0) for a, vs in vals.items() for s, v in enumerate(vs)]
    w = worst_case(_metrics_frame(rows), "auc").iloc[0]
    assert w["attack"] == "loss" and w["n"] == 4 and w["n_attacks"] == 2
    x = np.array(vals["loss"])
    half = stats.t.ppf(0.975, 3) * x.std(ddof=1) / np.sqrt(4)  # by hand
    assert (w["ci_low"], w["ci_high"]) == pytest.approx((x.mean() - half, x.mean() + half), abs=1e-12)
    assert (w["ci_low"], w["ci_high"]) == pytest.approx(stats.t.interval(0.95, 3, loc=x.mean(), scale=stats.sem(x)))
    assert w["ci_kind"] == "Student-t over 4 seeds"
    assert 0.0 < w["ci_low"] < w["ci_high"] < 1.0  # not the envelope [0, 1] of the per-seed CIs


def test_a_rate_interval_over_seeds_stays_in_zero_one():
    """Two seeds' TPR 0.0 and 0.056: the t-interval (t = 12.7) runs to -0.30; a mean of rates cannot, so the interval
    is cut to [0, 1] on the worst-case table and on the defense page's grid and breakdown."""
    from leaderboard.aggregate import attack_breakdown, game_attack_grid, worst_case
    rows = [("d", "adapt", "loss", s, "tpr@1%fpr", v, 0.0, 0.2) for s, v in enumerate([0.0, 0.056])]
    rows += [("d", "adapt", "loss", s, "auc", v, 0.9, 1.0) for s, v in enumerate([0.97, 1.0])]
    frame = _metrics_frame(rows)
    lo, hi = stats.t.interval(0.95, 1, loc=0.028, scale=stats.sem([0.0, 0.056]))
    assert lo < 0  # what it was before
    w = worst_case(frame, "tpr@1%fpr").iloc[0]
    assert (w["ci_low"], w["ci_high"]) == pytest.approx((0.0, hi))
    a = worst_case(frame, "auc").iloc[0]
    assert a["ci_high"] == 1.0 and a["ci_low"] < 0.985
    for table in (game_attack_grid(frame), attack_breakdown(frame)):
        assert (table["ci_low"] >= 0).all() and (table["ci_high"] <= 1).all(), table


def test_one_seed_keeps_the_stored_ci():
    from leaderboard.aggregate import leaderboard_table, worst_case
    rows = [("d", "adapt", "loss", 0, "auc", 0.70, 0.61, 0.79), ("d", "adapt", "zlib", 0, "auc", 0.65, 0.55, 0.74)]
    frame = _metrics_frame(rows)
    w = worst_case(frame, "auc").iloc[0]
    assert w["n"] == 1 and np.isnan(w["sd"])
    assert (w["attack"], w["ci_low"], w["ci_high"]) == ("loss", 0.61, 0.79)
    assert w["ci_kind"] == "stored per-seed CI (1 seed)"
    row = leaderboard_table(frame, pd.DataFrame(), pd.DataFrame(), games=["adapt"]).iloc[0]
    assert row["adapt · AUC 95% CI"] == "[0.610, 0.790]"
    assert row["adapt · AUC CI kind"] == "stored per-seed CI (1 seed)" and row["adapt · AUC attacks (n)"] == 2


def test_exposure_is_aggregated_per_game():
    from leaderboard.aggregate import leaderboard_table
    # game "pretrain" holds much larger exposures than "adapt"; neither may leak into the other's columns
    exp = {("pretrain", "exposure"): (20.0, 30.0),
           ("adapt", "exposure"): (4.0, 2.0), ("adapt", "exposure_ref"): (3.0, 5.0)}
    rows = [("d", g, a, s, "exposure_mean_pos", v, None, None) for (g, a), vs in exp.items() for s, v in enumerate(vs)]
    rows += [("d", g, "loss", s, "auc", 0.6, 0.5, 0.7) for g in ("adapt", "pretrain") for s in (0, 1)]
    frame = _metrics_frame(rows)
    games = ["pretrain", "adapt"]
    row = leaderboard_table(frame, pd.DataFrame(), pd.DataFrame(), games=games).iloc[0]
    # default: the adapt game; per seed the max over its two attacks (4, 5), then the mean
    assert row["adapt · canary exposure (mean)"] == pytest.approx(np.mean([4.0, 5.0]))
    assert row["adapt · canary exposure (mean) sd"] == pytest.approx(np.std([4.0, 5.0], ddof=1))
    assert row["adapt · canary exposure (mean) attacks (n)"] == 2
    assert not any(c.startswith("pretrain · canary") for c in row.index)
    other = leaderboard_table(frame, pd.DataFrame(), pd.DataFrame(), games=games, extras_game="pretrain").iloc[0]
    assert other["pretrain · canary exposure (mean)"] == pytest.approx(25.0)
    assert other["pretrain · canary exposure (mean) attacks (n)"] == 1
    assert not any(c.startswith("adapt · canary") for c in other.index)
    # without adapt among the shown games, the first shown game is used
    only = leaderboard_table(frame[frame.game == "pretrain"], pd.DataFrame(), pd.DataFrame(), games=["pretrain"])
    assert only.iloc[0]["pretrain · canary exposure (mean)"] == pytest.approx(25.0)


def test_breakdown_ci_follows_the_same_rule():
    from leaderboard.aggregate import attack_breakdown
    rows = [("d", "adapt", "loss", s, "auc", v, 0.0, 1.0) for s, v in enumerate([0.6, 0.7, 0.65])]
    rows += [("d", "null", "loss", 0, "auc", 0.52, 0.45, 0.59)]
    bd = attack_breakdown(_metrics_frame(rows)).set_index("game")
    x = np.array([0.6, 0.7, 0.65])
    lo, hi = stats.t.interval(0.95, 2, loc=x.mean(), scale=stats.sem(x))
    assert (bd.loc["adapt", "ci_low"], bd.loc["adapt", "ci_high"]) == pytest.approx((lo, hi))
    assert (bd.loc["null", "ci_low"], bd.loc["null", "ci_high"]) == (0.45, 0.59)
    assert bd.loc["null", "ci_kind"] == "stored per-seed CI (1 seed)"
    assert bd.loc["adapt", "n_pos"] == 50


# ---------------------------------------------------------------- the board: one ranking per track

@pytest.fixture(scope="module")
def tracks_db(tmp_path_factory):
    path = tmp_path_factory.mktemp("tracks") / "results.db"
    populate_tracks(path)
    return path


def _df(at, *columns: str) -> pd.DataFrame:
    """The first shown dataframe that has these columns (dataframes carry no key in AppTest)."""
    for d in at.dataframe:
        if all(c in d.value.columns for c in columns):
            return d.value
    raise KeyError(columns)


def test_runs_are_grouped_by_track_then_suite(tracks_db):
    board = board_of(tracks_db)
    # tracks first, quick first; an older hash of a track is its own group; failed runs are not shown (nor does
    # the newer hash of a failed run take the track's name)
    assert board.names == ["quick", "canaries", "quick@q-old", "adhoc"]
    assert board.default() == "quick"
    assert [board.groups[n].kind for n in board.names] == ["track", "track", "track", "suite"]
    quick = board.groups["quick"]
    assert quick.meta["track_hash"] == "q-new" and quick.game == "adapt" and quick.meta["seeds"] == "0, 1"
    assert set(quick.ranking["defense"]) == set(TRACK_ORDER)
    # the rows of the old hash never mix into the current track's numbers
    assert set(board.groups["quick@q-old"].ranking["defense"]) == {"none", "finetune"}
    assert set(quick.ranking["runs"]) == {"2"}
    assert set(board.groups["canaries"].ranking["task"]) == {"canaries-x3"}
    # a suite named like a track would not be confused with it; a suite with two worlds is split per world
    from leaderboard.aggregate import run_groups, world_groups
    runs = pd.DataFrame({"run": [1, 2], "suite": ["quick", "mix"],
                         "config": [json.dumps({"track": {"name": "quick", "hash": "x"}}), json.dumps({})]})
    groups = run_groups(pd.concat([runs, pd.DataFrame({"run": [3], "suite": ["quick"], "config": ["{}"]})]))
    assert groups.set_index("run")["group"].to_dict() == {1: "quick", 2: "mix", 3: "quick (suite)"}
    metrics = pd.DataFrame({"run": [2, 2, 1], "task": ["a", "b", "a"], "model": ["m", "m", "m"]})
    worlds = world_groups(groups, metrics)
    assert sorted(worlds["group"]) == ["mix · a · m", "mix · b · m", "quick"]


def _layers_brute(points: list[tuple[float, float]]) -> list[int]:
    """Non-dominated sorting by definition: risk minimised, utility maximised."""
    left = set(range(len(points)))
    layer, out = 0, [0] * len(points)
    while left:
        layer += 1
        front = {i for i in left if not any(points[j][0] <= points[i][0] and points[j][1] >= points[i][1]
                                             and points[j] != points[i] for j in left)}
        for i in front:
            out[i] = layer
        left -= front
    return out


def test_pareto_layers_match_brute_force():
    from leaderboard.aggregate import pareto_layers
    rng = np.random.default_rng(3)
    for _ in range(60):
        n = int(rng.integers(1, 25))
        pts = [(float(a), float(b)) for a, b in rng.integers(0, 5, size=(n, 2))]
        assert pareto_layers([p[0] for p in pts], [p[1] for p in pts]).tolist() == _layers_brute(pts), pts
    assert pareto_layers([0.1, np.nan, 0.2], [0.5, 0.9, np.nan]).tolist() == [1, 0, 0]


def test_track_ranking_follows_the_rule(tracks_db):
    board = board_of(tracks_db)
    r = board.groups["quick"].ranking
    # privacy: the worst case (loss) on the headline game, mean over the two seeds; utility retained likewise
    for row in r.to_dict("records"):
        d = row["defense"]
        assert row["tpr"] == pytest.approx(TRACK_TPR[d]) and row["auc"] == pytest.approx(TRACK_AUC[d])
        assert row["tpr_attack"] == row["auc_attack"] == "loss" and row["n_attacks"] == 2
        if TRACK_RETAINED[d] is None:
            assert np.isnan(row["retained"])
        else:
            assert row["retained"] == pytest.approx(TRACK_RETAINED[d])
        assert row["anchor"] == (d in ANCHORS) and row["n_seeds"] == 2
    # layers by definition on (TPR ↓, retained ↑); nout has no utility retained: unranked
    ranked = r[r["retained"].notna()]
    brute = _layers_brute(list(zip(ranked["tpr"], ranked["retained"])))
    assert ranked["pareto_layer"].astype(int).tolist() == brute
    layer = dict(zip(r["defense"], r["pareto_layer"]))
    assert layer["weak"] == 2 and layer[HOSTILE] == 2 and np.isnan(layer["nout"])  # lora dominates both
    assert {d for d, v in layer.items() if v == 1} == {"none", "finetune", "lora", "dp-eps8", "twin"}
    # order: layer, then utility retained (higher first), then AUC (twin 0.55 before dp-eps8 0.60 at equal TPR
    # and utility); anchors take no rank number; the unranked row comes last
    assert r["defense"].tolist() == TRACK_ORDER
    assert [("anchor" if a else ("—" if k != k else str(int(k)))) for a, k in zip(r["anchor"], r["rank"])] == \
        TRACK_RANKS
    # utility retained CI: Student-t over the two seeds, as seed_interval computes it
    lora = r[r["defense"] == "lora"].iloc[0]
    x = np.array([0.8 - 0.02, 0.8 + 0.02])
    assert (lora["retained_low"], lora["retained_high"]) == pytest.approx(
        stats.t.interval(0.95, 1, loc=x.mean(), scale=stats.sem(x)))
    # TPR CI: the same rule for the worst-case attack's per-seed values
    t = np.array([0.3 - 0.01, 0.3 + 0.01])
    assert (lora["tpr_low"], lora["tpr_high"]) == pytest.approx(stats.t.interval(0.95, 1, loc=t.mean(),
                                                                                 scale=stats.sem(t)))
    # plugin name and version from the run's config; guarantee, cost
    dp = r[r["defense"] == "dp-eps8"].iloc[0]
    assert (dp["name"], dp["version"]) == ("dp_adapt", "0.2.0")
    assert json.loads(dp["guarantees"]) == {"epsilon": pytest.approx(8.0)} and dp["guarantee"] == "ε 8"
    assert dp["train_seconds"] == pytest.approx(15.0)  # mean of 10 and 20 s measured, not the 0.75 s reported
    assert dp["train_seconds_source"] == "measured"
    assert dp["attack_seconds"] == pytest.approx(4 * 0.25)  # 2 games × 2 attacks per seed
    assert dp["params_summary"] == "full · ε 8 · clip 0.1"  # unset values and plumbing left out


def test_train_cost_prefers_what_privbench_measured():
    """The cost column reads ``adapt_seconds`` (timed by privbench around adapt) over the defense's own report, per
    seed; a configuration with one seed that has only the report is marked self-reported, and says so on screen."""
    from leaderboard.aggregate import _train_cost, display_ranking, RANKING_COLUMNS
    keys = dict(task="t", model="m", params="{}")
    configs = pd.DataFrame([dict(run=1, defense=d, seed=s, **keys) for d in ("honest", "liar", "old", "nulls")
                            for s in (0, 1)])

    def row(d, s, metric, v):
        return dict(run=1, defense=d, seed=s, role="adapted", dataset="heldout", metric=metric, value=v, **keys)
    util = pd.DataFrame([row("honest", 0, "adapt_seconds", 10.0), row("honest", 1, "adapt_seconds", 12.0),
                         row("honest", 0, "train_seconds", 9.0), row("honest", 1, "train_seconds", 11.0),
                         # a defense that reports almost no training time: the measured time stands
                         row("liar", 0, "adapt_seconds", 30.0), row("liar", 1, "adapt_seconds", 34.0),
                         row("liar", 0, "train_seconds", 0.001), row("liar", 1, "train_seconds", 0.001),
                         # a run from before privbench measured: one seed has only the report
                         row("old", 0, "adapt_seconds", 5.0), row("old", 1, "train_seconds", 7.0),
                         # values stored as NULL are missing, not 0 s: a NULL measurement falls back to the report
                         row("nulls", 0, "adapt_seconds", np.nan), row("nulls", 0, "train_seconds", 4.0),
                         row("nulls", 1, "train_seconds", np.nan)])
    cost = _train_cost(configs, util).set_index("defense")
    assert cost.loc["honest", "train_seconds"] == pytest.approx(11.0)
    assert cost.loc["liar", "train_seconds"] == pytest.approx(32.0)
    assert cost.loc["old", "train_seconds"] == pytest.approx(6.0)
    assert cost.loc["nulls", "train_seconds"] == pytest.approx(4.0)  # seed 1 has no time at all: left out
    assert cost["train_seconds_source"].to_dict() == {"honest": "measured", "liar": "measured",
                                                      "old": "self-reported", "nulls": "self-reported"}
    ranking = pd.DataFrame([{c: np.nan for c in RANKING_COLUMNS} | {
        "anchor": False, "rank": 1.0, "defense": d, "name": d, "version": "1", "params_summary": "", "n_seeds": 2,
        "guarantee": "—", "tpr_attack": "loss", "auc_attack": "loss", "attack_seconds": 1.0,
        "train_seconds": cost.loc[d, "train_seconds"], "train_seconds_source": cost.loc[d, "train_seconds_source"]}
        for d in ("liar", "old")])
    shown = display_ranking(ranking)["cost (train+attack)"].tolist()
    assert shown == ["32 s + 1.0 s", "6.0 s + 1.0 s (train self-reported)"]


def test_attack_cost_is_what_computing_the_evaluations_took_not_a_later_cache_hit(tmp_path):
    """A run that reads an earlier run's generations or signals from the cache stores the cache hit as its
    evaluations' durations. The board's attack cost is the longest any complete run at the same code version spent
    on the same evaluation (same eval_key), so the anchors of a baselines suite run after their track keep the cost
    the track measured; a run at another code version measured nothing this code computes, and does not count."""
    from leaderboard.queries import evaluation_frame, read_only_engine
    path = tmp_path / "cost.db"
    store = Store(str(path))
    track = {"name": "quick", "hash": "q", "headline_game": "adapt"}
    write_track_run(store, "track", track=track, suite="quick", defenses=["none", "finetune"], task="wiki",
                    duration_s=2.0)
    write_track_run(store, "baselines", track=track, suite="quick_baselines", defenses=["none", "finetune", "lora"],
                    task="wiki", duration_s=0.01)
    store.close()
    r = board_of(path).groups["quick"].ranking.set_index("defense")
    assert r.loc["finetune", "runs"] == "2"                            # the privacy numbers are the latest run's
    assert r.loc["finetune", "attack_seconds"] == pytest.approx(4 * 2.0)  # 2 games × 2 attacks, as computed
    assert r.loc["lora", "attack_seconds"] == pytest.approx(4 * 0.01)     # computed in the latest run itself
    engine = read_only_engine(str(path))
    try:
        ev = evaluation_frame(engine)
    finally:
        engine.dispose()
    assert sorted(ev[ev["run"] == 2]["duration_s"].unique()) == [0.01]    # what each run stored is left as it is

    store = Store(str(path))  # the anchors again at another code version, from a cache that code did not fill
    write_track_run(store, "next", track=track, suite="quick", defenses=["none", "finetune"], task="wiki",
                    code_version="v3.0", duration_s=0.01)
    store.close()
    r = board_of(path).groups["quick"].ranking.set_index("defense")
    assert r.loc["finetune", "runs"] == "3" and r.loc["finetune", "attack_seconds"] == pytest.approx(4 * 0.01)


def test_train_cost_against_the_finetune_anchor_of_the_same_run():
    """Seconds depend on the machine; the ratio to the finetune anchor trained in the same run and seed does not. A
    configuration is compared with its own run's anchor even where the anchor's latest run is another one, and a
    run without a measured anchor gets no ratio."""
    from leaderboard.aggregate import _train_cost, display_ranking, RANKING_COLUMNS
    keys = dict(task="t", model="m", params="{}")
    # run 1 on a fast machine (lora, finetune); run 2 on one twice as slow (a submission and the anchors again);
    # run 3 has no finetune anchor
    times = {(1, "finetune"): (10.0, 12.0), (1, "lora"): (5.0, 6.0), (2, "finetune"): (20.0, 24.0),
             (2, "mine"): (30.0, 36.0), (3, "solo"): (8.0, 8.0)}
    util = pd.DataFrame([dict(run=r, defense=d, seed=s, role="adapted", dataset="heldout", metric="adapt_seconds",
                              value=v, **keys) for (r, d), vs in times.items() for s, v in enumerate(vs)])
    configs = pd.DataFrame([dict(run=r, defense=d, seed=s, **keys) for (r, d) in times if (r, d) != (1, "finetune")
                            for s in (0, 1)])   # the anchor's latest run is run 2
    cost = _train_cost(configs, util).set_index("defense")
    assert cost.loc["lora", "train_vs_finetune"] == pytest.approx(0.5)    # against run 1's anchor, not run 2's
    assert cost.loc["mine", "train_vs_finetune"] == pytest.approx(1.5)
    assert cost.loc["finetune", "train_vs_finetune"] == pytest.approx(1.0)
    assert np.isnan(cost.loc["solo", "train_vs_finetune"])
    assert cost.loc["mine", "train_seconds"] == pytest.approx(33.0)
    ranking = pd.DataFrame([{c: np.nan for c in RANKING_COLUMNS} | {
        "anchor": d == "finetune", "rank": 1.0, "defense": d, "name": d, "version": "1", "params_summary": "",
        "n_seeds": 2, "guarantee": "—", "tpr_attack": "loss", "auc_attack": "loss", "attack_seconds": 1.0,
        "train_seconds": cost.loc[d, "train_seconds"], "train_vs_finetune": cost.loc[d, "train_vs_finetune"],
        "train_seconds_source": "measured"} for d in ("mine", "finetune", "solo")])
    ranking.loc[len(ranking)] = ranking.iloc[0].to_dict() | {"defense": "none", "anchor": True, "train_seconds": 0.01,
                                                              "train_vs_finetune": 0.0005}
    shown = display_ranking(ranking)["cost (train+attack)"].tolist()
    assert shown == ["33 s (1.50× finetune) + 1.0 s", "22 s + 1.0 s", "8.0 s + 1.0 s", "0.0 s + 1.0 s"]


def test_display_and_params_summary():
    from leaderboard.aggregate import params_summary
    summary = params_summary(json.dumps({"lr": 0.002, "epochs": 4.0, "r": 8, "batch_size": 16}))
    assert summary == "lr 2e-3 · 4 ep · r 8"
    assert params_summary("{}") == "—" and params_summary({"epsilon": float("inf")}) == "ε ∞"
    long = {f"p{i}": i for i in range(8)}
    assert params_summary(long).endswith(" · …") and params_summary(long).count("·") == 5
    # dp_adapt stores a LoRA rank for every method: only a LoRA configuration shows it
    dp = {"method": "full", "epsilon": 8.0, "clip": 0.1, "epochs": 4.0, "r": 8, "prefix_length": 32}
    assert params_summary(dp) == "full · ε 8 · clip 0.1 · 4 ep"
    assert params_summary({**dp, "method": "lora"}) == "lora · ε 8 · clip 0.1 · 4 ep · r 8"
    # a variant names the algorithm (naf), and the settings that define it come before the alphabetical rest
    naf = {"variant": "scp_delta_r_b", "epochs": 4.0, "lr": 0.002, "batch_size": 16, "constant_base": "mean_logits",
           "fuse_grid": 10, "guarantee_texts": 256, "k": 2, "m": 10}
    assert params_summary(naf) == "scp_delta_r_b · lr 2e-3 · 4 ep · k 2 · m 10 · …"
    goldfish = {"epochs": 4.0, "lr": 0.002, "k": 4, "h": 3, "adapt_goldfish": True}
    assert params_summary(goldfish) == "lr 2e-3 · 4 ep · k 4 · h 3 · adapt_goldfish true"


def test_display_ranking_cells(tracks_db):
    board = board_of(tracks_db)
    shown = board.groups["quick"].display
    from leaderboard.aggregate import DISPLAY_COLUMNS
    assert list(shown.columns) == DISPLAY_COLUMNS
    assert shown["rank"].tolist() == TRACK_RANKS
    row = shown.set_index("rank").loc["1"]
    assert row["defense"] == "lora 0.1.0" and row["parameters"] == "lr 3e-3 · 4 ep · r 8"
    half = stats.t.ppf(0.975, 1) * np.std([0.29, 0.31], ddof=1) / np.sqrt(2)
    assert row["TPR@1%FPR [95% CI]"] == f"0.300 [{0.3 - half:.3f}, {0.3 + half:.3f}]"
    assert row["worst attack"] == "loss" and row["seeds"] == "2" and row["guarantee"] == "—"
    assert row["cost (train+attack)"] == "15 s (1.00× finetune) + 1.0 s"
    assert shown.set_index("rank").loc["3", "defense"] == "dp-eps8 (dp_adapt 0.2.0)"
    assert shown[shown["defense"].str.startswith("nout")]["utility retained [95% CI]"].tolist() == ["—"]


def test_first_screen_is_the_default_tracks_ranking(tracks_db, monkeypatch):
    before = tracks_db.read_bytes()
    at = _app(tracks_db, monkeypatch, page=None).run()
    assert not at.exception
    assert at.selectbox(key="track").value == "quick"
    assert at.selectbox(key="track").options[:2] == ["quick (track)", "canaries (track)"]
    shown = _df(at, "rank", "utility retained [95% CI]")
    board = board_of(tracks_db)
    pd.testing.assert_frame_equal(shown.reset_index(drop=True).astype(str), board.groups["quick"].display)
    texts = _texts(at)
    assert any("Selection bias" in t and "2 attacks" in t and "per-attack view" in t for t in texts)
    assert any(t.startswith("Ranking rule:") for t in texts)
    per_attack = _df(at, "loss (TPR · AUC)")
    assert list(per_attack.columns) == ["defense", "parameters", "loss (TPR · AUC)", "zlib (TPR · AUC)"]
    assert per_attack.iloc[1].tolist()[2:] == ["0.300 · 0.800", "0.280 · 0.780"]  # lora: each attack's own value
    assert at.get("vega_lite_chart")  # the headline plot
    assert not any("alert(1)" in t for t in texts)
    # another track
    at.selectbox(key="track").set_value("canaries").run()
    assert _df(at, "rank", "utility retained [95% CI]")["defense"].tolist() == \
        ["finetune 0.1.0", "lora 0.1.0", "none 1.0.0"]
    assert tracks_db.read_bytes() == before


def test_defense_page(tracks_db, monkeypatch):
    at = _app(tracks_db, monkeypatch, page=None).run()
    board = board_of(tracks_db)
    quick = board.groups["quick"]
    cid = quick.ranking[quick.ranking["defense"] == "dp-eps8"]["config_id"].iloc[0]
    at.selectbox(key="open_cfg").set_value(cid).run()  # "open the page of" switches to the defense page
    assert not at.exception
    assert at.radio(key="page").value == "Defense page" and at.selectbox(key="defense_cfg").value == cid
    facts = dict(_df(at, "", "value").values.tolist())
    assert facts["rank"] == "3" and facts["plugin"] == "dp_adapt 0.2.0" and facts["guarantee"] == "ε 8"
    grid = _df(at, "game", "attack", "metric", "mean")
    assert set(grid["game"]) == {"adapt", "null"} and set(grid["attack"]) == {"loss", "zlib"}
    cell = grid[(grid.game == "adapt") & (grid.attack == "zlib") & (grid.metric == "AUC")]["mean"].iloc[0]
    assert cell == pytest.approx(TRACK_AUC["dp-eps8"] - 0.02)
    roc = _df(at, "AUC (from ROC)")
    assert set(roc["attack"]) == {"loss", "zlib"} and set(roc["seed"]) == {0, 1}
    util = _df(at, "seed", "role", "dataset")
    assert set(util["dataset"]) == {"heldout", "retained"} and "utility_retained" in util
    gts = _df(at, "seed", "name", "value", "details")
    assert gts["value"].tolist() == [7.5, 8.5]
    codes = [c.value for c in at.code]
    assert "privbench run --suite quick" in codes and json.loads(codes[0])["epsilon"] == 8.0
    # the hostile configuration's page shows its text as text
    hid = quick.ranking[quick.ranking["defense"] == HOSTILE]["config_id"].iloc[0]
    at.selectbox(key="defense_cfg").set_value(hid).run()
    assert not at.exception
    assert dict(_df(at, "", "value").values.tolist())["defense label"] == HOSTILE
    assert not any("alert(1)" in t for t in _texts(at))


class _Tables(__import__("html.parser").parser.HTMLParser):
    """Cells (text) of every <table class="ranking"> under its section's data-group."""

    def __init__(self):
        super().__init__()
        self.tables: dict[str, list[list[str]]] = {}
        self.group = None
        self.in_table = self.in_cell = False
        self.row: list[str] = []

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "section":
            self.group = a.get("data-group")
        elif tag == "table" and a.get("class") == "ranking":
            self.in_table = True
            self.tables[self.group] = []
        elif self.in_table and tag == "tr":
            self.row = []
        elif self.in_table and tag in ("td", "th"):
            self.in_cell = True
            self.row.append("")

    def handle_endtag(self, tag):
        if tag == "table":
            self.in_table = False
        elif self.in_table and tag == "tr":
            self.tables[self.group].append(self.row)
        elif tag in ("td", "th"):
            self.in_cell = False

    def handle_data(self, data):
        if self.in_table and self.in_cell:
            self.row[-1] += data


def test_export_agrees_with_the_app_cell_by_cell(tracks_db, monkeypatch, tmp_path):
    from bench.cli import main
    out = tmp_path / "board"
    assert main(["board", "export", "--out", str(out), "--db", str(tracks_db)]) == 0
    page = (out / "index.html").read_text()
    # offline: no script, nothing loaded from elsewhere (the only URL is the SVG namespace, which loads nothing)
    assert "<script" not in page.lower() and not re.search(r"""(src|href)\s*=\s*["']?(https?:)?//""", page)
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    parser = _Tables()
    parser.feed(page)
    data = json.loads((out / "board.json").read_text())
    board = board_of(tracks_db)
    assert list(parser.tables) == board.names == [g["name"] for g in data["groups"]]
    at = _app(tracks_db, monkeypatch, page=None).run()
    for name in board.names:
        at.selectbox(key="track").set_value(name).run()
        app_frame = _df(at, "rank", "utility retained [95% CI]").astype(str)
        header, *cells = parser.tables[name]
        assert header == list(app_frame.columns)
        assert cells == app_frame.values.tolist()  # the HTML table is the app's table, cell by cell
        group = next(g for g in data["groups"] if g["name"] == name)
        assert [list(r.values()) for r in group["display"]] == app_frame.values.tolist()
        assert [r["config_id"] for r in group["ranking"]] == board.groups[name].ranking["config_id"].tolist()
        for cid in group["configs"]:
            assert 'polyline class="roc"' in (out / "defense" / f"{cid}.html").read_text()  # ROC curves drawn
    quick = next(g for g in data["groups"] if g["name"] == "quick")
    lora = next(r for r in quick["ranking"] if r["defense"] == "lora")
    assert lora["tpr"] == pytest.approx(0.3) and lora["retained"] == pytest.approx(0.8) and lora["rank"] == 1
    assert (out / quick["spec"]).is_file() and json.loads((out / quick["spec"]).read_text())["$schema"]
    assert main(["board", "export", "--out", str(tmp_path / "x"), "--db", str(tmp_path / "none.db")]) != 0


def test_ranking_and_defense_pages_have_urls(tracks_db, monkeypatch):
    board = board_of(tracks_db)
    lora = board.groups["canaries"].ranking
    cid = lora[lora["defense"] == "lora"]["config_id"].iloc[0]
    at = _app(tracks_db, monkeypatch, page=None)
    at.query_params["track"] = "canaries"
    at.query_params["page"] = "defense"
    at.query_params["config"] = cid
    at.run()
    assert not at.exception
    assert at.selectbox(key="track").value == "canaries" and at.radio(key="page").value == "Defense page"
    assert dict(_df(at, "", "value").values.tolist())["defense label"] == "lora"
    # the URL follows the page shown
    at.selectbox(key="track").set_value("quick").run()
    at.radio(key="page").set_value("Ranking").run()
    assert dict(at.query_params) == {"track": "quick", "page": "ranking"}


def test_a_unit_level_epsilon_is_shown_per_unit():
    """dp_adapt's ``unit`` (user-level DP-SGD) changes what ε bounds: the board says so in the guarantee text and
    the parameter summary; record-level DP reads as before."""
    from leaderboard.aggregate import _epsilon_unit, _guarantee_text, params_summary

    def rows(*details):
        return pd.DataFrame({"name": ["epsilon"] * len(details), "details": [json.dumps(d) for d in details]})

    assert _epsilon_unit(rows({"unit": "user"}, {"unit": "user"})) == "user"
    assert _epsilon_unit(rows({"unit": "record"}, {"delta": 1e-5})) is None
    assert _epsilon_unit(pd.DataFrame({"name": ["epsilon"], "details": ["{not json"]})) is None
    assert _guarantee_text({"epsilon": 8.0}, "user") == "ε 8 per user"
    assert _guarantee_text({"epsilon": float("inf")}, "user") == "ε ∞"  # no guarantee is no guarantee per user
    assert _guarantee_text({"epsilon": 8.0}) == "ε 8"
    base = {"method": "full", "epsilon": 8.0, "clip": 0.1}
    assert params_summary({**base, "unit": "user"}) == "full · ε 8 · clip 0.1 · per user"
    assert params_summary({**base, "unit": "record"}) == "full · ε 8 · clip 0.1"
