"""The leaderboard renders from a results database, read-only, with plugin-supplied text shown as text."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from bench.metrics import MetricRow
from bench.store import Store

APP = Path(__file__).resolve().parent.parent / "leaderboard" / "app.py"


def _populate(path: Path) -> None:
    store = Store(str(path))
    run_id, _ = store.begin_run(run_key="k1", suite="demo", config={"x": 1}, config_hash="h", code_version="v",
                                plugin_versions={}, seeds=[0], hardware={}, command="privbench run --suite demo")
    for defense, auc in (("finetune", 0.9), ("<script>alert(1)</script>", 0.6)):
        for game in ("adapt", "null"):
            value = auc if game == "adapt" else 0.5
            store.write_evaluation(run_id, f"{defense}-{game}", task="mini_pile", model="nano", defense=defense,
                                   defense_params={}, seed=0, game=game, attack="loss", attack_params={},
                                   world_key="w", target_ids=["a", "b"], labels=[1, 0], scores=[1.0, 0.0],
                                   metrics=[MetricRow("auc", value, value - 0.05, value + 0.05, 1, 1),
                                            MetricRow("tpr@1%fpr", 0.1, 0.0, 0.2, 1, 1)],
                                   duration_s=0.1)
        store.write_utility(run_id, f"u-{defense}", task="mini_pile", model="nano", defense=defense, seed=0,
                            role="adapted", dataset="heldout", values={"loss": 4.0, "perplexity": 54.6},
                            n_tokens=100)
    store.finish_run(run_id, status="complete", duration_s=1.0)
    store.close()  # checkpoint the WAL so the file bytes are final before the read-only check


@pytest.fixture()
def db(tmp_path):
    path = tmp_path / "results.db"
    _populate(path)
    return path


def _app(db_path: Path):
    from streamlit.testing.v1 import AppTest
    at = AppTest.from_file(str(APP), default_timeout=60)
    os.environ["PRIVBENCH_DB"] = str(db_path)
    return at


def test_leaderboard_renders_rows_and_escapes_plugin_text(db):
    before = db.read_bytes()
    at = _app(db).run()
    assert not at.exception
    table = at.dataframe[0].value
    assert set(table["defense"]) == {"finetune", "<script>alert(1)</script>"}
    assert "max AUC adapt" in table.columns and "max AUC null" in table.columns
    row = table[table.defense == "finetune"].iloc[0]
    assert row["max AUC adapt"] == pytest.approx(0.9)
    # the hostile name is data in a dataframe cell, never markdown/HTML
    assert all("<script>" not in m.value for m in at.markdown)
    assert db.read_bytes() == before  # read-only


def test_leaderboard_missing_database_shows_an_error(tmp_path):
    at = _app(tmp_path / "nope.db").run()
    assert not at.exception
    assert any("cannot read the results database" in e.value for e in at.error)
