"""The regression gate (`privbench compare`) on synthetic databases: drift is caught, noise within the CI is not.

The end-to-end gate against tests/baselines/smoke.db runs in tests/test_smoke_suite.py, on the smoke run
that module already makes (so the suite runs once).
"""

from __future__ import annotations

import shutil
import sqlite3
from pathlib import Path

import pytest

from bench.cli import main
from bench.compare import compare, format_comparison
from bench.errors import ConfigError
from bench.store import Store
from tests.db_snapshot import upgraded_copy

BASELINE = Path(__file__).parent / "baselines" / "smoke.db"


def make_db(path: Path, aucs: dict, utility: dict | None = None, *, suite: str = "smoke", status: str = "complete",
            defense: str = "finetune") -> str:
    """A results DB with one run: AUC rows {(game, attack): (value, ci_low, ci_high)} and utility {metric: v}."""
    url = f"sqlite:///{path}"
    with Store(url) as store:
        run_id, _ = store.begin_run(run_key=f"k-{path.stem}", suite=suite, config={}, config_hash="h",
                                    code_version="0", plugin_versions={}, seeds=[0], hardware={})
        for (game, attack), (v, lo, hi) in aucs.items():
            store.write_evaluation(
                run_id, f"{game}-{attack}", task="mini_pile", model="nano", defense=defense, defense_params={},
                seed=0, game=game, attack=attack, attack_params={}, world_key="w", target_ids=["a", "b"],
                labels=[0, 1], scores=[0.0, 1.0], duration_s=0.1,
                metrics=[{"metric": "auc", "value": v, "ci_low": lo, "ci_high": hi, "n_pos": 1, "n_neg": 1}])
        if utility:
            store.write_utility(run_id, "u", task="mini_pile", model="nano", defense=defense, seed=0, role="adapted",
                                dataset="heldout", values=utility, n_tokens=100)
        store.finish_run(run_id, status=status)
    return url


BASE = {("adapt", "loss"): (0.80, 0.72, 0.88), ("null", "loss"): (0.50, 0.42, 0.58)}


def test_within_ci_passes(tmp_path):
    base = make_db(tmp_path / "base.db", BASE, {"loss": 4.0, "next_token_accuracy": 0.20})
    # 0.91 is outside the CI but inside CI + 0.05; the utility moved by 5 % < 10 %
    cur = make_db(tmp_path / "cur.db", {("adapt", "loss"): (0.91, 0.8, 0.97), ("null", "loss"): (0.40, 0.3, 0.5)},
                  {"loss": 4.2, "next_token_accuracy": 0.19})
    res = compare(base, cur)
    assert res.ok and res.compared == 4


def test_auc_drift_detected(tmp_path):
    base = make_db(tmp_path / "base.db", BASE)
    cur = make_db(tmp_path / "cur.db", {("adapt", "loss"): (0.95, 0.9, 0.99), ("null", "loss"): (0.5, 0.4, 0.6)})
    res = compare(base, cur)
    assert not res.ok
    (off,) = res.offenders
    assert (off.cell["game"], off.cell["attack"], off.kind) == ("adapt", "loss", "auc")
    # the allowed band is the baseline CI widened by the tolerance, computed independently here
    assert off.allowed_low == pytest.approx(0.72 - 0.05) and off.allowed_high == pytest.approx(0.88 + 0.05)
    assert compare(base, cur, tolerance=0.08).ok  # a wider stated tolerance admits it


def test_utility_drift_detected(tmp_path):
    base = make_db(tmp_path / "base.db", BASE, {"loss": 4.0, "next_token_accuracy": 0.20})
    cur = make_db(tmp_path / "cur.db", BASE, {"loss": 4.5, "next_token_accuracy": 0.20})
    res = compare(base, cur)
    assert [o.kind for o in res.offenders] == ["loss"]
    assert res.offenders[0].allowed_high == pytest.approx(4.4)


def test_submitted_plugins_are_not_gated(tmp_path):
    base = make_db(tmp_path / "base.db", BASE, defense="my_defense")
    cur = make_db(tmp_path / "cur.db", {("adapt", "loss"): (0.1, 0.0, 0.2)}, defense="my_defense")
    with pytest.raises(ConfigError, match="no overlap"):
        compare(base, cur)


def test_no_overlap_and_no_complete_run(tmp_path):
    base = make_db(tmp_path / "base.db", BASE)
    cur = make_db(tmp_path / "cur.db", {("pretrain", "zlib"): (0.5, 0.4, 0.6)})
    with pytest.raises(ConfigError, match="no overlap"):
        compare(base, cur)
    failed = make_db(tmp_path / "failed.db", BASE, status="failed")
    with pytest.raises(ConfigError, match="no complete run of suite 'smoke'"):
        compare(base, failed)


def _cli(capsys, *args):
    rc = main(list(args))
    out = capsys.readouterr()
    return rc, out.out, out.err


def test_cli_exit_codes_and_table(tmp_path, capsys):
    base = make_db(tmp_path / "base.db", BASE)
    same = make_db(tmp_path / "same.db", BASE)
    rc, out, err = _cli(capsys, "compare", "--baseline", base, "--db", same)
    assert rc == 0, err
    assert "no regressions" in out
    drift = make_db(tmp_path / "drift.db", {("adapt", "loss"): (0.3, 0.2, 0.4)})
    rc, out, err = _cli(capsys, "compare", "--baseline", base, "--db", drift)
    assert rc == 1
    assert "adapt" in out and "0.3" in out and "drifted" in out
    assert err.startswith("error: ") and len(err.strip().splitlines()) == 1


def test_cli_missing_and_invalid_db(tmp_path, capsys):
    base = make_db(tmp_path / "base.db", BASE)
    rc, _, err = _cli(capsys, "compare", "--baseline", str(tmp_path / "nope.db"), "--db", base)
    assert rc == 2 and "baseline database" in err and "no results database" in err
    assert not (tmp_path / "nope.db").exists()
    junk = tmp_path / "junk.db"
    junk.write_bytes(b"this is not sqlite" * 100)
    rc, _, err = _cli(capsys, "compare", "--baseline", base, "--db", str(junk))
    assert rc == 2 and "current database" in err and len(err.strip().splitlines()) == 1


def test_shipped_baseline_is_a_smoke_run(tmp_path):
    """tests/baselines/smoke.db holds one complete smoke run with every built-in cell of the smoke suite."""
    baseline = upgraded_copy(BASELINE, tmp_path / "baseline.db")  # shipped before the schema was versioned
    with Store(str(baseline), create=False) as store:
        (run,) = [r for r in store.list_runs() if r["status"] == "complete" and r["suite"] == "smoke"]
        rows = store.metric_rows(run["id"])
    cells = {(r["defense"], r["game"], r["attack"]) for r in rows if r["metric"] == "auc"}
    assert len(cells) == 3 * 7 * 5          # none, finetune, lora × seven games × five attacks
    assert all(r["ci_low"] <= r["value"] <= r["ci_high"] for r in rows if r["metric"] == "auc")
    # the baseline compared with itself passes; the copy opened read-only is left untouched
    copy = tmp_path / "copy.db"
    shutil.copy(baseline, copy)
    before = copy.read_bytes()
    assert compare(str(baseline), str(copy)).ok
    assert copy.read_bytes() == before
    assert sqlite3.connect(copy).execute("select count(*) from runs").fetchone()[0] >= 1


def test_the_report_names_the_plugins_it_left_out(tmp_path):
    base = make_db(tmp_path / "base.db", BASE)
    cur = make_db(tmp_path / "cur.db", BASE)
    with Store(cur, create=False) as store:
        store.write_evaluation(
            1, "adapt-loss-mine", task="mini_pile", model="nano", defense="my_defense", defense_params={}, seed=0,
            game="adapt", attack="loss", attack_params={}, world_key="w", target_ids=["a", "b"], labels=[0, 1],
            scores=[0.0, 1.0], duration_s=0.1,
            metrics=[{"metric": "auc", "value": 0.1, "ci_low": 0.0, "ci_high": 0.2, "n_pos": 1, "n_neg": 1}])
    result = compare(base, cur)
    assert result.ok and result.compared == 2 and result.skipped == ("defense my_defense",)
    text = format_comparison(result)
    assert "not compared: defense my_defense (not built in" in text and text.endswith("no regressions")
