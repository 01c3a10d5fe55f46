"""Tests for bench.report: table/json/csv output and the end-of-run summary."""

from __future__ import annotations

import csv
import io
import json

import pytest

from bench.errors import ConfigError
from bench.report import epsilon_summary, format_rows, format_value, summarize


def metric_row(defense, game, attack, value, metric="auc", seed=0, lo=None, hi=None, flag=None):
    return {
        "run": 1, "suite": "smoke", "task": "echr", "model": "gpt2", "defense": defense,
        "seed": seed, "game": game, "attack": attack, "metric": metric, "value": value,
        "ci_low": lo, "ci_high": hi, "n_pos": 50, "n_neg": 50, "flag": flag,
    }


ROWS = [
    metric_row("none", "mia", "loss", 0.8731, lo=0.84, hi=0.90),
    metric_row("none", "mia", "zlib", 0.91, lo=0.88, hi=0.94),
    metric_row("none", "mia", "loss", 0.12, metric="tpr@fpr=0.01", flag="fpr_below_resolution"),
    metric_row("dpsgd", "mia", "loss", 0.51, lo=0.45, hi=0.57),
    metric_row("dpsgd", "mia", "zlib", 0.5, lo=0.44, hi=0.56),
]


def test_json_round_trip():
    assert json.loads(format_rows(ROWS, "json")) == ROWS
    out = json.loads(format_rows(ROWS, "json", columns=["attack", "value"]))
    assert out[0] == {"attack": "loss", "value": 0.8731}
    assert json.loads(format_rows([{"x": float("nan")}], "json")) == [{"x": None}]
    assert json.loads(format_rows([], "json")) == []


def test_csv_header_and_lines():
    text = format_rows(ROWS, "csv")
    lines = text.strip().split("\n")
    assert len(lines) == len(ROWS) + 1
    assert lines[0].split(",") == list(ROWS[0])
    parsed = list(csv.DictReader(io.StringIO(text)))
    assert parsed[0]["attack"] == "loss" and float(parsed[0]["value"]) == 0.8731
    assert parsed[2]["ci_low"] == ""  # None -> empty cell


def test_table():
    text = format_rows(ROWS, "table")
    lines = text.split("\n")
    for col in ROWS[0]:
        assert col in lines[0]
    assert len(lines) == len(ROWS) + 2
    assert "0.8731" in text and "0.9100" in text
    assert " - " in lines[4] or lines[4].rstrip().endswith("-")  # None shown as "-"
    # columns are aligned: every data line starts its "attack" cell at the same offset
    start = lines[0].index("attack")
    assert all(line[start:start + 4] in ("loss", "zlib") for line in lines[2:])
    assert format_rows([], "table", columns=["a"]).startswith("a")


def test_format_value():
    assert format_value(None) == "-"
    assert format_value(0.123456) == "0.1235"
    assert format_value(1e-5) == "1e-05"
    assert format_value(3) == "3"
    assert format_value(True) == "true"


def test_unknown_format_and_column():
    with pytest.raises(ConfigError, match="unknown format 'xml': use table, json or csv"):
        format_rows(ROWS, "xml")
    with pytest.raises(ConfigError, match="unknown column 'nope'"):
        format_rows(ROWS, "table", columns=["nope"])


def test_summarize():
    text = summarize(ROWS)
    for name in ("loss", "zlib", "none", "dpsgd", "echr", "gpt2"):
        assert name in text
    assert "0.873 [0.84,0.90]" in text
    assert "0.910 [0.88,0.94]*" in text  # best attack against no defense
    assert "0.510 [0.45,0.57]*" in text  # best attack against dpsgd
    assert "tpr@fpr" not in text  # only AUC is summarized
    assert all(len(line) <= 100 for line in text.split("\n"))


def test_summarize_many_attacks_fits_terminal_and_seeds():
    rows = [
        metric_row("none", "mia", f"attack_{i:02d}", 0.5 + i / 100, lo=0.4, hi=0.7, seed=s)
        for i in range(12) for s in (0, 1)
    ]
    rows.append(metric_row("a_really_long_defense_name_with_params", "mia", "attack_00", 0.6, flag="few"))
    text = summarize(rows)
    assert all(len(line) <= 100 for line in text.split("\n"))
    for i in range(12):
        assert f"attack_{i:02d}" in text
    assert "±" in text and "few" in text


def test_summarize_without_auc():
    assert "no AUC rows" in summarize([metric_row("none", "mia", "loss", 0.1, metric="tpr")])
    assert summarize([]) == "no results to summarize"


def test_epsilon_summary_keeps_the_largest_bound_and_marks_indicative_ones():
    common = dict(task="t", model="m", defense="dp", game="adapt", n_pos=10, n_neg=10, ci_low=None, ci_high=None)
    rows = [dict(common, attack="loss", metric="eps_lb_roc@95%,delta=1e-05", value=0.4, flag="indicative"),
            dict(common, attack="zlib", metric="eps_lb_roc@95%,delta=1e-05", value=1.2, flag="indicative"),
            dict(common, attack="loss", metric="auc", value=0.7, flag=None)]
    text = epsilon_summary(rows)
    assert "1.200~" in text and "(zlib)" in text and "0.400" not in text
    assert epsilon_summary(rows[2:]) == ""
    assert "Largest ε lower bound" in summarize(rows)
