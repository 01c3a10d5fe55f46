"""The leaderboard renders from a results database, read-only, with plugin-supplied text shown as text.

Every number the page shows is checked against an independent computation on the rows this file wrote.
"""

from __future__ import annotations

import io
import itertools
import json
import sqlite3
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from scipy import stats
from sklearn.metrics import roc_auc_score, roc_curve

from bench.metrics import MetricRow
from bench.store import Store

APP = Path(__file__).resolve().parent.parent / "leaderboard" / "app.py"
HOSTILE = "<script>alert(1)</script> **bold**"
PARAMS = {"finetune": {"lr": 0.002}, "dp": {"epsilon": 8.0}, HOSTILE: {"note": HOSTILE}}
BASE_AUC = {"finetune": 0.8, "dp": 0.6, HOSTILE: 0.7}
GAME_OFFSET = {"pretrain": -0.1, "adapt": 0.0, "null": -0.3}
ATTACK_SEED = {"loss": (0.1, -0.1), "zlib": (0.05, 0.05)}  # loss wins on seed 0, zlib on the mean
PRETRAINED_LOSS = {0: 4.0, 1: 4.2}
ADAPTED_LOSS = {"finetune": (3.0, 3.1), "dp": (3.5, 3.7), HOSTILE: (3.2, 3.3)}
EPSILON = {0: 7.5, 1: 8.5}
N = 40


def auc_value(defense: str, game: str, attack: str, seed: int) -> float:
    return BASE_AUC[defense] + GAME_OFFSET[game] + ATTACK_SEED[attack][seed]


def _populate(path: Path) -> dict[int, tuple[list[int], list[float]]]:
    """A two-seed run: 2 tasks, 3 defenses (one hostile), 3 games, 2 MIAs + one exposure attack."""
    store = Store(str(path))
    run_id, _ = store.begin_run(run_key="k1", suite="demo", config={"x": 1}, config_hash="h1", code_version="v1.2",
                                plugin_versions={"attack:loss": "0.1"}, seeds=[0, 1], hardware={"cpu": 2},
                                command="privbench run --suite demo")
    rng = np.random.default_rng(0)
    written: dict[str, tuple[list[int], list[float]]] = {}
    worlds = [("mini_pile", d) for d in PARAMS] + [("names", "finetune")]
    for (task, defense), seed in itertools.product(worlds, (0, 1)):
        common = dict(task=task, model="nano", seed=seed)
        for game, attack in itertools.product(GAME_OFFSET, ATTACK_SEED):
            labels = [1] * (N // 2) + [0] * (N // 2)
            scores = (rng.normal(size=N) + np.array(labels) * BASE_AUC[defense]).round(3).tolist()
            auc = auc_value(defense, game, attack, seed)
            tpr = abs(auc - 0.5)
            key = f"{task}-{defense}-{seed}-{game}-{attack}"
            store.write_evaluation(run_id, key, defense=defense, defense_params=PARAMS[defense], game=game,
                                   attack=attack, attack_params={}, world_key=f"w{seed}",
                                   target_ids=[f"t{i}" for i in range(N)], labels=labels, scores=scores,
                                   metrics=[MetricRow("auc", auc, auc - 0.05, auc + 0.05, N // 2, N // 2),
                                            MetricRow("tpr@1%fpr", tpr, 0.0, tpr + 0.1, N // 2, N // 2)],
                                   duration_s=0.5, **common)
            written[key] = (labels, scores)
        if defense == "finetune" and task == "mini_pile":
            exp = [5.0 + seed, 4.0, 1.0, 1.5]
            store.write_evaluation(run_id, f"exp-{seed}", defense=defense, defense_params=PARAMS[defense],
                                   game="adapt", attack="exposure", attack_params={}, world_key=f"w{seed}",
                                   target_ids=["c0", "c1", "c2", "c3"], labels=[1, 1, 0, 0], scores=exp,
                                   metrics=[MetricRow("auc", 1.0, 1.0, 1.0, 2, 2),
                                            MetricRow("exposure_mean_pos", 4.5 + seed / 2, None, None, 2, 2)],
                                   duration_s=0.5, **common)
        store.write_utility(run_id, f"p-{task}-{defense}-{seed}", defense="-", role="pretrained", dataset="heldout",
                            values={"loss": PRETRAINED_LOSS[seed]}, n_tokens=100, **common)
        store.write_utility(run_id, f"a-{task}-{defense}-{seed}", defense=defense, role="adapted", dataset="heldout",
                            values={"loss": ADAPTED_LOSS[defense][seed], "train_seconds": 10.0 + seed},
                            n_tokens=100, **common)
        if defense == "dp":
            store.write_guarantee(run_id, defense=defense, name="epsilon", value=EPSILON[seed],
                                  details={"delta": 1e-5}, **common)
    store.finish_run(run_id, status="complete", duration_s=1.0)
    store.close()  # checkpoint the WAL so the file bytes are final before the read-only check
    return written


@pytest.fixture(scope="module")
def db(tmp_path_factory):
    path = tmp_path_factory.mktemp("lb") / "results.db"
    written = _populate(path)
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
        assert row["train seconds (mean)"] == pytest.approx(10.5)
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
                 duration_s=1.0, code_version="v", command="c")
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
