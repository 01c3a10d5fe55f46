"""End to end: the smoke suite through the installed CLI, then the acceptance properties of the core.

One cold run (empty cache, empty database) is shared by the module; it is the
slowest test of the default run (about two minutes on 2 cores).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from bench.game import DEFAULT_GAMES as GAMES  # the games `games: all` selects
from bench.store import Store

ATTACKS = ["loss", "zlib", "min_k", "min_k_pp", "reference"]
DEFENSES = ["none", "finetune", "lora"]


def privbench(*args: str, env: dict, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "bench", *args], env=env, cwd=cwd, capture_output=True,
                          text=True, timeout=900)


@pytest.fixture(scope="module")
def smoke(tmp_path_factory):
    root = tmp_path_factory.mktemp("smoke")
    env = dict(os.environ, PRIVBENCH_CACHE=str(root / "cache"))
    db = f"sqlite:///{root / 'results.db'}"
    proc = privbench("run", "--suite", "smoke", "--db", db, "--quiet", env=env, cwd=root)
    assert proc.returncode == 0, proc.stderr[-3000:]
    shown = privbench("show", "--format", "json", "--db", db, env=env, cwd=root)
    assert shown.returncode == 0, shown.stderr
    return {"root": root, "env": env, "db": db, "report": proc.stdout, "stderr": proc.stderr,
            "rows": json.loads(shown.stdout)}


def test_quiet_run_prints_only_its_report(smoke):
    """--quiet: the report on stdout and nothing on stderr, not even a library's warning about another library
    (LoRA's peft call used to print one from transformers)."""
    assert smoke["stderr"] == "", smoke["stderr"][-2000:]
    assert smoke["report"].startswith("Attack AUC")


def auc(rows, defense, game, attack) -> float:
    (hit,) = [r for r in rows if (r["defense"], r["game"], r["attack"], r["metric"]) == (defense, game, attack, "auc")]
    return hit["value"]


def test_every_game_attack_defense_has_metric_rows(smoke):
    rows = smoke["rows"]
    required = {"run", "suite", "task", "model", "defense", "seed", "game", "attack", "metric", "value", "ci_low",
                "ci_high", "n_pos", "n_neg"}
    assert rows and required <= set(rows[0])
    cells = {(r["defense"], r["game"], r["attack"]) for r in rows}
    assert cells == {(d, g, a) for d in DEFENSES for g in GAMES for a in ATTACKS}
    metrics = {r["metric"] for r in rows}
    assert metrics == {"auc", "tpr@0.1%fpr", "tpr@1%fpr", "tpr@5%fpr", "eps_lb_roc@95%,delta=1e-05"}
    for r in rows:
        if r["metric"].startswith("eps_lb_"):  # a lower bound without CI; the targets share one model
            assert r["value"] >= 0 and r["flag"] == "indicative"
            continue
        assert r["ci_low"] <= r["value"] + 1e-12 and r["value"] <= r["ci_high"] + 1e-12
        assert r["n_pos"] > 0 and r["n_neg"] > 0
    # the 0.1% FPR point cannot be measured with a few hundred negatives: it must be flagged
    assert all(r["flag"] == "fpr_below_resolution" for r in rows if r["metric"] == "tpr@0.1%fpr")


def test_undefended_finetune_leaks_in_adapt_game(smoke):
    assert auc(smoke["rows"], "finetune", "adapt", "loss") >= 0.8


def test_null_game_is_chance_for_every_attack(smoke):
    for d in DEFENSES:
        for a in ATTACKS:
            value = auc(smoke["rows"], d, "null", a)
            assert abs(value - 0.5) <= 0.1, (d, a, value)


def test_lora_leaks_less_than_full_finetuning(smoke):
    rows = smoke["rows"]
    assert auc(rows, "lora", "adapt", "loss") < auc(rows, "finetune", "adapt", "loss")
    worst = lambda d: max(auc(rows, d, "adapt", a) for a in ATTACKS)  # noqa: E731
    assert worst("lora") < worst("finetune")


def test_utility_recorded_for_every_released_model(smoke):
    store = Store(smoke["db"], create=False)
    rows = store.utility_rows(store.resolve_run(None))
    roles = {(r["role"], r["defense"]) for r in rows if r["metric"] == "loss"}
    assert roles == {("pretrained", "-"), ("reference", "-"), ("adapted", "none"), ("adapted", "finetune"),
                     ("adapted", "lora")}
    for r in rows:
        if r["metric"] == "perplexity":
            assert 1.0 < r["value"] < 8192
    # the anchors: `none` releases θ (its loss is θ's), fine-tuning on the new domain lowers held-out loss clearly,
    # and every adapted model has its utility retained against them
    loss = {r["defense"]: r["value"] for r in rows if r["metric"] == "loss" and r["dataset"] == "heldout"
            and r["role"] != "reference"}
    assert loss["none"] == loss["-"] and loss["finetune"] <= loss["-"] - 0.3
    retained = {r["defense"]: r["value"] for r in rows if r["metric"] == "utility_retained"}
    assert retained["none"] == 0.0 and retained["finetune"] == 1.0 and 0.0 < retained["lora"] < 1.0


def test_report_is_printed(smoke):
    assert "finetune / adapt" in smoke["report"] and "utility (held-out" in smoke["report"]


def test_rerun_same_database_adds_nothing(smoke):
    store = Store(smoke["db"], create=False)
    before = store.count_rows()
    proc = privbench("run", "--suite", "smoke", "--db", smoke["db"], "--quiet", env=smoke["env"], cwd=smoke["root"])
    assert proc.returncode == 0, proc.stderr
    assert store.count_rows() == before
    assert store.list_runs()[-1]["status"] == "complete"


def test_warm_cache_rebuilds_nothing_and_is_deterministic(smoke):
    """A second database on the same cache trains no model and recomputes no signal: the cache directories are
    unchanged (speed lives in docs/benchmarks.md, not in a timed test), and every metric is identical."""
    db2 = f"sqlite:///{smoke['root'] / 'second.db'}"
    cache = smoke["root"] / "cache"

    def artifacts() -> set[str]:
        return {str(p.relative_to(cache)) for p in cache.rglob("*") if p.is_file() and p.suffix != ".lock"}
    before = artifacts()
    proc = privbench("run", "--suite", "smoke", "--db", db2, "--quiet", "--no-report", env=smoke["env"],
                     cwd=smoke["root"])
    assert proc.returncode == 0, proc.stderr
    assert artifacts() == before
    shown = privbench("show", "--format", "json", "--db", db2, env=smoke["env"], cwd=smoke["root"])
    again = json.loads(shown.stdout)
    key = lambda r: (r["defense"], r["game"], r["attack"], r["metric"])  # noqa: E731
    first = {key(r): r["value"] for r in smoke["rows"]}
    assert {key(r): r["value"] for r in again} == first


def test_ray_executor_gives_the_local_metrics(smoke):
    """The smoke suite run with `--executor ray` on a local Ray instance stores the local run's metrics exactly."""
    pytest.importorskip("ray")
    db3 = f"sqlite:///{smoke['root'] / 'ray.db'}"
    proc = privbench("run", "--suite", "smoke", "--db", db3, "--quiet", "--no-report", "--executor", "ray",
                     env=smoke["env"], cwd=smoke["root"])
    assert proc.returncode == 0, proc.stderr[-3000:]
    shown = privbench("show", "--format", "json", "--db", db3, env=smoke["env"], cwd=smoke["root"])
    key = lambda r: (r["defense"], r["game"], r["attack"], r["metric"])  # noqa: E731
    assert {key(r): r["value"] for r in json.loads(shown.stdout)} == {key(r): r["value"] for r in smoke["rows"]}


def test_show_formats(smoke):
    csv_out = privbench("show", "--format", "csv", "--db", smoke["db"], env=smoke["env"], cwd=smoke["root"])
    lines = csv_out.stdout.strip().splitlines()
    assert lines[0].startswith("run,") and len(lines) == len(smoke["rows"]) + 1
    table = privbench("show", "--db", smoke["db"], env=smoke["env"], cwd=smoke["root"])
    assert table.returncode == 0 and "joint/fresh" in table.stdout


# ---- regression gate (bench/compare.py): this module's smoke run against the shipped baseline --------------

def test_smoke_matches_the_baseline(smoke, tmp_path):
    """`privbench compare --baseline tests/baselines/smoke.db` passes on a fresh smoke run (see its README)."""
    from tests.db_snapshot import upgraded_copy
    baseline = upgraded_copy(Path(__file__).parent / "baselines" / "smoke.db", tmp_path / "baseline.db")
    proc = privbench("compare", "--baseline", str(baseline), "--db", smoke["db"], "--suite", "smoke",
                     env=smoke["env"], cwd=smoke["root"])
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr
    # 3 defenses x 7 games x 5 attacks = 105 AUC cells, plus loss and next-token accuracy of 5 released models
    assert "no regressions" in proc.stdout and "compared 115 cells" in proc.stdout
