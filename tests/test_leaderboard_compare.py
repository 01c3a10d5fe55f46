"""The Compare page: two configurations of a track side by side, with B − A per game × attack."""

from __future__ import annotations

from pathlib import Path

import pytest

from boards import TRACK_AUC, board_of, populate_tracks

APP = Path(__file__).resolve().parent.parent / "leaderboard" / "app.py"


@pytest.fixture(scope="module")
def tracks(tmp_path_factory):
    path = tmp_path_factory.mktemp("cmp") / "results.db"
    populate_tracks(path)
    return path


def _cid(group, defense):
    return group.ranking[group.ranking["defense"] == defense]["config_id"].iloc[0]


def test_compare_differences_and_disjoint_cis(tracks):
    quick = board_of(tracks).groups["quick"]
    a, b = quick.config(_cid(quick, "none")), quick.config(_cid(quick, "finetune"))
    table = quick.compare(a, b)
    cell = table[(table.game == "adapt") & (table.attack == "loss") & (table.metric == "AUC")].iloc[0]
    assert cell["mean A"] == pytest.approx(TRACK_AUC["none"])
    assert cell["mean B"] == pytest.approx(TRACK_AUC["finetune"])
    assert cell["Δ (B − A)"] == pytest.approx(TRACK_AUC["finetune"] - TRACK_AUC["none"])
    assert bool(cell["CIs disjoint"])  # 0.95 vs 0.50: t-intervals over two seeds (±0.13) apart
    null = table[(table.game == "null") & (table.attack == "loss") & (table.metric == "AUC")].iloc[0]
    assert null["Δ (B − A)"] == pytest.approx(0.0) and not bool(null["CIs disjoint"])  # both at chance
    same = quick.compare(a, a)
    assert (same["Δ (B − A)"] == 0).all() and not same["CIs disjoint"].any()
    facts = quick.compare_facts(a, b)
    assert list(facts.columns) == ["", "A", "B"]
    assert dict(zip(facts[""], facts["A"]))["defense label"] == "none"
    assert dict(zip(facts[""], facts["B"]))["defense label"] == "finetune"


def test_compare_page_in_the_app(tracks, monkeypatch):
    from streamlit.testing.v1 import AppTest
    monkeypatch.setenv("PRIVBENCH_DB", str(tracks))
    at = AppTest.from_file(str(APP), default_timeout=60)
    at.session_state["page"] = "Compare"
    at.run()
    assert not at.exception
    quick = board_of(tracks).groups[at.selectbox(key="track").value]
    at.selectbox(key="cmp_a").set_value(_cid(quick, "lora"))
    at.selectbox(key="cmp_b").set_value(_cid(quick, "finetune")).run()
    assert not at.exception
    shown = next(d.value for d in at.dataframe if "Δ (B − A)" in d.value.columns)
    expected = quick.compare(quick.config(_cid(quick, "lora")), quick.config(_cid(quick, "finetune")))
    assert shown["Δ (B − A)"].tolist() == pytest.approx(expected["Δ (B − A)"].tolist())
    assert at.query_params["page"] in (["compare"], "compare")  # the page can be linked to
