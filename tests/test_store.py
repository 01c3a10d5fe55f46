"""Tests for bench.store: round trip, idempotence, transactions, lookups, errors, concurrency, resume after a
killed writer. Tests taking ``store`` or ``db_url`` run twice: on a SQLite file and on a real PostgreSQL server
(tests/pg_server.py, fixtures in tests/conftest.py)."""

from __future__ import annotations

import math
import multiprocessing
import os
import random
import sqlite3
from dataclasses import dataclass

import pytest

from bench.errors import StoreError
from bench.store import Store

METRIC_KEYS = {
    "run", "suite", "task", "model", "defense", "seed", "game", "attack", "metric",
    "value", "ci_low", "ci_high", "n_pos", "n_neg", "flag",
}


@dataclass(frozen=True)
class Row:  # same fields as bench.metrics.MetricRow; the store only duck-types
    metric: str
    value: float
    ci_low: float | None
    ci_high: float | None
    n_pos: int
    n_neg: int
    flag: str | None = None


METRICS = [
    Row("auc", 0.75, 0.7, 0.8, 50, 50),
    Row("tpr@fpr=0.01", 0.05, 0.0, 0.1, 50, 50, "fpr_below_resolution"),
    Row("tpr@fpr=0.1", 0.3, None, None, 50, 50),
]


def begin(store: Store, key: str = "k1", suite: str = "smoke") -> int:
    run_id, _ = store.begin_run(
        run_key=key, suite=suite, config={"suite": suite, "b": [1, 2]}, config_hash="c" + key,
        code_version="v1", plugin_versions={"loss": "1.0"}, seeds=[0, 1], hardware={"cpu": "x"},
        command="privbench run --suite " + suite,
    )
    return run_id


def evaluation(n: int = 100, *, seed: int = 0, attack: str = "loss", **over):
    rng = random.Random(seed)
    kw = dict(
        task="echr", model="gpt2", defense="none", defense_params={"p": 1}, seed=0, game="mia",
        attack=attack, attack_params={"k": 2}, world_key="w" + str(seed),
        target_ids=[f"t{i}" for i in range(n)], labels=[i % 2 for i in range(n)],
        scores=[rng.random() for _ in range(n)], metrics=METRICS, duration_s=1.5,
    )
    kw.update(over)
    return kw


@pytest.fixture
def store(db_url):
    s = Store(db_url)
    yield s
    s.close()


def test_round_trip(store):
    run_id = begin(store)
    kw = evaluation()
    assert store.write_evaluation(run_id, "e1", **kw) is True
    assert store.has_evaluation(run_id, "e1")
    assert not store.has_evaluation(run_id, "e2")

    rows = store.metric_rows(run_id)
    assert len(rows) == 3
    for row in rows:
        assert set(row) == METRIC_KEYS
    by_name = {r["metric"]: r for r in rows}
    assert [r["metric"] for r in rows] == sorted(by_name)
    for m in METRICS:
        r = by_name[m.metric]
        assert (r["value"], r["ci_low"], r["ci_high"], r["n_pos"], r["n_neg"], r["flag"]) == (
            m.value, m.ci_low, m.ci_high, m.n_pos, m.n_neg, m.flag)
        assert (r["run"], r["suite"], r["task"], r["model"], r["defense"], r["seed"], r["game"],
                r["attack"]) == (run_id, "smoke", "echr", "gpt2", "none", 0, "mia", "loss")

    (ev,) = store.evaluations(run_id)
    assert ev["eval_key"] == "e1" and ev["attack_params"] == {"k": 2}
    ids, labels, scores = store.scores_for(ev["id"])
    assert ids == kw["target_ids"] and labels == kw["labels"] and scores == kw["scores"]

    info = store.run_info(run_id)
    assert info["config"] == {"suite": "smoke", "b": [1, 2]}
    assert info["seeds"] == [0, 1] and info["status"] == "running" and info["verified_ci"] is False
    assert info["command"] == "privbench run --suite smoke"

    store.finish_run(run_id, status="complete", duration_s=3.0)
    (listed,) = store.list_runs()
    assert listed["status"] == "complete" and listed["n_evaluations"] == 1
    assert listed["duration_s"] == 3.0 and listed["started_at"].endswith("+00:00")


def test_metric_rows_accept_mappings_and_order(store):
    run_id = begin(store)
    store.write_evaluation(run_id, "b", **evaluation(attack="zlib", metrics=[dict(
        metric="auc", value=0.6, ci_low=None, ci_high=None, n_pos=1, n_neg=1)]))
    store.write_evaluation(run_id, "a", **evaluation(attack="loss", metrics=METRICS[:1]))
    assert [r["attack"] for r in store.metric_rows(run_id)] == ["loss", "zlib"]


def test_write_evaluation_is_idempotent(store):
    run_id = begin(store)
    assert store.write_evaluation(run_id, "e1", **evaluation()) is True
    before = store.count_rows()
    assert before["evaluations"] == 1 and before["scores"] == 100 and before["metrics"] == 3
    assert store.write_evaluation(run_id, "e1", **evaluation(seed=9)) is False
    assert store.count_rows() == before


def test_begin_run_is_idempotent_and_resumes(store):
    run_id = begin(store)
    assert store.begin_run(
        run_key="k1", suite="smoke", config={}, config_hash="", code_version="", plugin_versions={},
        seeds=[], hardware={}) == (run_id, "running")
    store.finish_run(run_id, status="failed", error="boom")
    assert store.run_info(run_id)["error"] == "boom"
    again, previous = store.begin_run(
        run_key="k1", suite="smoke", config={}, config_hash="", code_version="", plugin_versions={},
        seeds=[], hardware={})
    assert (again, previous) == (run_id, "failed")
    info = store.run_info(run_id)
    assert info["status"] == "running" and info["error"] is None
    assert info["config"] == {"suite": "smoke", "b": [1, 2]}  # the original record is kept
    store.finish_run(run_id, status="complete")
    assert store.begin_run(
        run_key="k1", suite="smoke", config={}, config_hash="", code_version="", plugin_versions={},
        seeds=[], hardware={}) == (run_id, "complete")
    assert store.run_info(run_id)["status"] == "complete"
    assert store.count_rows()["runs"] == 1
    with pytest.raises(StoreError):
        store.finish_run(run_id, status="done")


@pytest.mark.parametrize(
    "bad",
    [
        {"scores": [0.1] * 99 + [math.nan]},
        {"scores": [0.1] * 99 + [math.inf]},
        {"labels": [0, 1] * 49},
        {"target_ids": [f"t{i}" for i in range(101)]},
        {"target_ids": ["same"] * 100},
        {"metrics": [Row("auc", math.nan, None, None, 1, 1)]},
        {"metrics": [METRICS[0], METRICS[0]]},
        {"metrics": [object()]},
    ],
)
def test_invalid_evaluation_writes_nothing(store, bad):
    run_id = begin(store)
    store.write_evaluation(run_id, "ok", **evaluation())
    before = store.count_rows()
    with pytest.raises(StoreError):
        store.write_evaluation(run_id, "bad", **evaluation(**bad))
    assert store.count_rows() == before
    assert not store.has_evaluation(run_id, "bad")


def test_failure_inside_transaction_rolls_back(store, monkeypatch):
    """An error after the evaluation row was flushed leaves nothing behind."""
    run_id = begin(store)
    before = store.count_rows()
    import bench.store as mod

    real_insert = mod.insert

    def failing_insert(model):
        if model is mod.Metric:
            raise store._dbapi_error("disk I/O error")  # the backend driver's own error class
        return real_insert(model)

    monkeypatch.setattr(mod, "insert", failing_insert)
    with pytest.raises(StoreError, match="disk I/O error"):
        store.write_evaluation(run_id, "e1", **evaluation())
    monkeypatch.undo()
    assert store.count_rows() == before
    assert store.write_evaluation(run_id, "e1", **evaluation()) is True


def test_write_evaluation_unknown_run(store):
    with pytest.raises(StoreError, match="no run with id 42"):
        store.write_evaluation(42, "e", **evaluation())


def test_ten_thousand_scores_are_stored_and_read_back(store):
    run_id = begin(store)
    ev = evaluation(10_000)
    store.write_evaluation(run_id, "big", **ev)
    assert store.count_rows()["scores"] == 10_000
    (row,) = [e for e in store.evaluations(run_id) if e["eval_key"] == "big"]
    ids, labels, scores = store.scores_for(row["id"])
    assert ids == list(ev["target_ids"]) and scores == pytest.approx(list(ev["scores"]))


def test_utility_and_guarantees(store):
    run_id = begin(store)
    kw = dict(task="echr", model="gpt2", defense="dpsgd", seed=0, role="adapted", dataset="heldout",
              n_tokens=1000)
    store.write_utility(run_id, "u1", values={"loss": 2.0, "perplexity": 7.39}, **kw)
    store.write_utility(run_id, "u1", values={"loss": 9.0, "perplexity": 9.0}, **kw)
    store.write_utility(run_id, "u1", values={"loss": 2.0, "accuracy": 0.5}, **kw)
    rows = store.utility_rows(run_id)
    assert [(r["metric"], r["value"]) for r in rows] == [("accuracy", 0.5), ("loss", 2.0), ("perplexity", 7.39)]
    assert set(rows[0]) == {"run", "task", "model", "defense", "seed", "role", "dataset", "metric",
                            "value", "n_tokens"}
    with pytest.raises(StoreError):
        store.write_utility(run_id, "u2", values={"loss": math.nan}, **kw)
    with pytest.raises(StoreError):
        store.write_utility(run_id, "u3", values={"loss": 1.0}, **{**kw, "role": "target"})

    g = dict(task="echr", model="gpt2", defense="dpsgd", seed=0, name="epsilon")
    store.write_guarantee(run_id, value=8.0, details={"delta": 1e-5}, **g)
    store.write_guarantee(run_id, value=8.0, details={"delta": 1e-5}, **g)
    assert store.count_rows()["guarantees"] == 1
    store.write_guarantee(run_id, value=4.0, details={"delta": 1e-5}, **g)
    (row,) = store.guarantee_rows(run_id)
    assert row["value"] == 4.0 and row["details"] == {"delta": 1e-5}
    store.write_guarantee(run_id, value=None, details={}, **{**g, "name": "rdp"})
    assert store.count_rows()["guarantees"] == 2


def test_resolve_run(tmp_path):
    store = Store(str(tmp_path / "r.db"))  # a bare path is accepted
    assert store.url == f"sqlite:///{tmp_path / 'r.db'}"
    with pytest.raises(StoreError, match="no runs in .*privbench run --suite smoke"):
        store.resolve_run(None)
    a = begin(store, "aaaa1111", "smoke")
    b = begin(store, "bbbb2222", "full")
    c = begin(store, "abcd3333", "smoke")
    assert store.resolve_run(None) == c
    assert store.resolve_run(a) == a
    assert store.resolve_run(str(b)) == b
    assert store.resolve_run("smoke") == c
    assert store.resolve_run("full") == b
    assert store.resolve_run("bbbb") == b  # unique run_key prefix
    assert store.resolve_run("aaaa1111") == a
    with pytest.raises(StoreError, match="ambiguous"):
        store.resolve_run("a")
    with pytest.raises(StoreError, match="'nope'.*privbench show --list"):
        store.resolve_run("nope")
    with pytest.raises(StoreError, match="privbench show --list"):
        store.resolve_run(99)
    assert [r["id"] for r in store.list_runs()] == [a, b, c]


@pytest.mark.parametrize("url", ["notadialect://x", "postgresql://u:pw@host:port/db", ""])
def test_bad_urls(url):
    with pytest.raises(StoreError, match="sqlite:///path/to/results.db") as info:
        Store(url)
    assert "\n" not in str(info.value)
    assert ":pw@" not in str(info.value)


def test_file_that_is_not_a_database(tmp_path):
    path = tmp_path / "garbage.db"
    path.write_bytes(b"this is not a database\n" * 200 + os.urandom(1000))
    for create in (True, False):
        with pytest.raises(StoreError, match="not a SQLite database") as info:
            store = Store(f"sqlite:///{path}", create=create)
            store.begin_run(run_key="k", suite="s", config={}, config_hash="", code_version="",
                            plugin_versions={}, seeds=[], hardware={})
        assert "\n" not in str(info.value)


def test_create_false_needs_an_existing_database(tmp_path):
    with pytest.raises(StoreError, match="no results database"):
        Store(str(tmp_path / "missing.db"), create=False)
    assert not (tmp_path / "missing.db").exists()
    (tmp_path / "empty.db").touch()
    with pytest.raises(StoreError, match="no privbench tables"):
        Store(str(tmp_path / "empty.db"), create=False)
    with pytest.raises(StoreError, match="directory"):
        Store(str(tmp_path))


def test_sqlite_uses_wal(tmp_path):
    store = Store(f"sqlite:///{tmp_path / 'results.db'}")
    with store.engine.connect() as conn:
        assert conn.exec_driver_sql("PRAGMA journal_mode").scalar().lower() == "wal"
        assert conn.exec_driver_sql("PRAGMA busy_timeout").scalar() >= 30_000
    # persistent in the file: a plain sqlite3 connection sees it too
    raw = sqlite3.connect(tmp_path / "results.db")
    assert raw.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    raw.close()
    store.close()


def test_in_memory_store():
    store = Store("sqlite://")
    run_id = begin(store)
    assert store.write_evaluation(run_id, "e", **evaluation(10))
    assert store.count_rows()["scores"] == 10


def _worker(url: str, run_id: int, worker: int) -> int:
    store = Store(url, create=False)
    written = 0
    for i in range(20):
        written += store.write_evaluation(
            run_id, f"w{worker}-e{i}", **evaluation(50, seed=worker * 100 + i)
        )
    # every worker also races for one shared key: exactly one may win
    written += 1000 * store.write_evaluation(run_id, "shared", **evaluation(50))
    store.close()
    return written


def test_concurrent_writers(db_url):
    url = db_url
    store = Store(url)
    run_id = begin(store)
    ctx = multiprocessing.get_context("spawn")
    with ctx.Pool(4) as pool:
        results = pool.starmap(_worker, [(url, run_id, w) for w in range(4)])
    assert [r % 1000 for r in results] == [20, 20, 20, 20]
    assert sum(r // 1000 for r in results) == 1
    counts = store.count_rows()
    assert counts["evaluations"] == 81
    assert counts["scores"] == 81 * 50
    assert counts["metrics"] == 81 * 3
    keys = sorted(e["eval_key"] for e in store.evaluations(run_id))
    assert keys == sorted([f"w{w}-e{i}" for w in range(4) for i in range(20)] + ["shared"])


def _killed_writer(url: str, run_id: int, ready) -> None:
    """Write evaluations until killed; each write is one transaction, so a kill can only lose a whole one."""
    store = Store(url, create=False)
    for i in range(10_000):
        store.write_evaluation(run_id, f"e{i}", **evaluation(200, seed=i))
        if i == 2:
            ready.set()


def test_resume_after_a_killed_writer(db_url):
    """SIGKILL a writer mid-run; the rerun resumes the run, skips what was stored and leaves no partial rows."""
    import signal
    import time

    store = Store(db_url)
    run_id = begin(store)
    ctx = multiprocessing.get_context("spawn")
    ready = ctx.Event()
    proc = ctx.Process(target=_killed_writer, args=(db_url, run_id, ready))
    proc.start()
    assert ready.wait(120), "the writer never wrote"
    time.sleep(0.2)
    os.kill(proc.pid, signal.SIGKILL)
    proc.join(30)
    assert proc.exitcode == -signal.SIGKILL
    done = store.count_rows()["evaluations"]
    assert 3 <= done < 10_000
    # the killed run is still 'running'; rerunning resumes it
    assert begin(store) == run_id and store.run_info(run_id)["status"] == "running"
    written = sum(store.write_evaluation(run_id, f"e{i}", **evaluation(200, seed=i)) for i in range(done + 5))
    assert written == 5
    counts = store.count_rows()
    assert counts["evaluations"] == done + 5
    assert counts["scores"] == 200 * (done + 5) and counts["metrics"] == 3 * (done + 5)
    # every stored evaluation is whole and equal to what a clean writer stores
    for ev in store.evaluations(run_id):
        i = int(ev["eval_key"][1:])
        assert store.scores_for(ev["id"])[2] == evaluation(200, seed=i)["scores"]
    store.close()
