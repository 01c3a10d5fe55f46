"""The defense page shows a release's claimed ε next to its audited ε lower bounds (bench/audit.py rows)."""

from __future__ import annotations

import math

from bench.metrics import MetricRow
from bench.store import Store
from boards import board_of
from leaderboard.board import audit_summary
from leaderboard.export import export_db

TRACK = {"name": "quick", "hash": "q-audit", "headline_game": "adapt"}
PARAMS = {"dp-eps1": {"epsilon": 1.0}, "broken-eps1": {"epsilon": 1.0}, "finetune": {"lr": 0.001},
          "none": {}, "hush": {"method": "lora"}}
ROC = "eps_lb_roc@95%,delta=1e-05"
ONE = "eps_lb_one_run@95%,delta=1e-05"
CLAIM = "dp_claim@95%,delta=1e-05"
SECRET = "secret_claim@95%"


def _write(path) -> None:
    store = Store(str(path))
    defenses = list(PARAMS)
    entries = [{"label": d, "name": "dp_adapt" if "eps" in d else d, "params": PARAMS[d], "version": "0.2.0"}
               for d in defenses]
    run_id, _ = store.begin_run(run_key="audit", suite="quick", config={"name": "quick", "defenses": entries,
                                                                         "seeds": [0], "track": TRACK},
                                config_hash="h", code_version="v3", plugin_versions={}, seeds=[0], hardware={},
                                command="privbench run --suite quick")
    labels = [1] * 10 + [0] * 10
    for d in defenses:
        common = dict(task="wiki", model="nano", defense=d, seed=0)
        for game in ("adapt", "null", "audit"):
            for attack, roc in (("loss", 0.4), ("zlib", 0.9)):
                metrics = [MetricRow("auc", 0.6, 0.55, 0.65, 10, 10), MetricRow("tpr@1%fpr", 0.05, 0.0, 0.1, 10, 10),
                           MetricRow(ROC, roc, None, None, 10, 10, "indicative")]
                if game == "adapt" and d == "hush":  # a secret-level KL claim, checked on a neighbour game
                    kl = 0.3 if attack == "zlib" else 0.0
                    metrics.append(MetricRow(SECRET, 0.012, kl, None, 10, 10,
                                             "claim_violated" if kl > 0.012 else "claim_ok"))
                if game == "audit":
                    one = {"dp-eps1": 0.0, "broken-eps1": 2.3 if attack == "loss" else 1.7, "finetune": 1.9,
                           "none": 0.0, "hush": 0.1}[d]
                    metrics.append(MetricRow(ONE, one, None, None, 10, 10))
                    if "eps" in d:
                        metrics.append(MetricRow(CLAIM, 1.0, one, None, 10, 10,
                                                 "claim_violated" if one > 1.0 else "claim_ok"))
                store.write_evaluation(run_id, f"{d}-{game}-{attack}", defense_params=PARAMS[d], game=game,
                                       attack=attack, attack_params={}, world_key="w0",
                                       target_ids=[f"t{i}" for i in range(20)], labels=labels,
                                       scores=[float(i % 7) + (i < 10) for i in range(20)], metrics=metrics,
                                       duration_s=0.1, **common)
        store.write_utility(run_id, f"u-{d}", role="adapted", dataset="heldout", values={"loss": 3.0},
                            n_tokens=100, **common)
    store.finish_run(run_id, status="complete", duration_s=1.0)
    store.close()


def _group(tmp_path):
    _write(tmp_path / "a.db")
    board = board_of(tmp_path / "a.db")
    return board, board.groups[board.default()]


def _cfg(group, defense):
    return group.ranking[group.ranking["defense"] == defense].iloc[0]


def test_broken_claim_is_shown_violated_and_the_correct_one_ok(tmp_path):
    _, group = _group(tmp_path)
    broken = group.config_audit(_cfg(group, "broken-eps1"))
    claim = broken[broken["bound"] == "ε, one-run at the claimed δ"]
    assert list(claim["flag"]) == ["claim_violated"]
    assert claim["lower bound"].iloc[0] == 2.3 and claim["attack"].iloc[0] == "loss"  # the largest over attacks
    assert claim["claimed"].iloc[0] == 1.0
    assert audit_summary(broken).endswith("claim_violated")
    ok = group.config_audit(_cfg(group, "dp-eps1"))
    assert set(ok.loc[ok["bound"] == "ε, one-run at the claimed δ", "flag"]) == {"claim_ok"}
    facts = dict(group.facts(_cfg(group, "dp-eps1")).values)
    assert facts["audit (claimed vs audited)"].startswith("claimed ε 1 vs audited ε ≥ 0")


def test_roc_bound_is_the_largest_over_attacks_and_keeps_its_flag(tmp_path):
    _, group = _group(tmp_path)
    audit = group.config_audit(_cfg(group, "finetune"))
    roc = audit[(audit["bound"] == "ε, ROC") & (audit["game"] == "adapt")]
    assert roc["lower bound"].tolist() == [0.9] and roc["attack"].tolist() == ["zlib"]
    assert roc["flag"].tolist() == ["indicative"] and math.isnan(roc["claimed"].iloc[0])
    assert "no DP claim audited" in audit_summary(audit) and "1.9" in audit_summary(audit)  # one-run beats ROC


def test_export_defense_page_has_the_audit_table(tmp_path):
    _write(tmp_path / "a.db")
    out = tmp_path / "site"
    export_db(str(tmp_path / "a.db"), out)
    pages = [t for t in (p.read_text() for p in out.rglob("*.html")) if "<h1>broken-eps1</h1>" in t]
    assert len(pages) == 1
    assert "Audit: claimed ε vs audited ε lower bound" in pages[0] and "claim_violated" in pages[0]


def test_secret_claim_is_shown_next_to_the_dp_bounds(tmp_path):
    _, group = _group(tmp_path)
    audit = group.config_audit(_cfg(group, "hush"))
    kl = audit[audit["bound"] == "KL, secret-level"]
    assert kl["game"].tolist() == ["adapt"] and kl["flag"].tolist() == ["claim_violated"]
    assert kl["lower bound"].tolist() == [0.3] and kl["claimed"].tolist() == [0.012] and kl["attack"].tolist() == ["zlib"]
    summary = audit_summary(audit)
    assert summary.startswith("claimed KL 0.012 vs audited KL ≥ 0.3") and summary.endswith("claim_violated")
