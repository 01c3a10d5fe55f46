"""The `privbench audit` table: worst verdict over attacks, largest bounds, union-bound confidence; bad input."""

from __future__ import annotations

import pytest

from bench.audit_report import audit_rows
from bench.cli import main


def _row(defense, attack, metric, value, ci_low=None, flag=None):
    return dict(task="t", model="m", defense=defense, seed=0, game="audit", attack=attack, metric=metric,
                value=value, ci_low=ci_low, ci_high=None, n_pos=48, n_neg=52, flag=flag)


def test_audit_rows_take_the_worst_verdict_and_state_the_union_bound_confidence():
    rows = [_row("dp", "loss", "eps_lb_one_run@95%,delta=1e-05", 0.4),
            _row("dp", "zlib", "eps_lb_one_run@95%,delta=1e-05", 1.3),
            _row("dp", "loss", "dp_claim@95%,delta=1e-05", 1.0, 0.4, "claim_ok"),
            _row("dp", "zlib", "dp_claim@95%,delta=1e-05", 1.0, 1.3, "claim_violated"),
            _row("ft", "loss", "eps_lb_one_run@95%,delta=1e-05", 2.0),
            dict(_row("dp", "loss", "auc", 0.9), game="adapt")]
    (dp, ft) = audit_rows(rows)
    assert dp["verdict"] == "claim_violated" and dp["eps_lb_one_run"] == 1.3 and dp["eps_lb_at_claim"] == 1.3
    assert dp["claimed_eps"] == 1.0 and dp["confidence"] == pytest.approx(0.9) and dp["canaries"] == 100
    assert ft["verdict"] == "no claim" and ft["confidence"] == pytest.approx(0.95)


def test_audit_command_refuses_a_suite_without_an_audit_game(tmp_path, capsys):
    assert main(["audit", "--suite", "smoke", "--db", str(tmp_path / "x.db")]) != 0
    assert "has no audit game" in capsys.readouterr().err
    assert not (tmp_path / "x.db").exists()
