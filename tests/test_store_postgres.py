"""The store, the CLI and the leaderboard on a real PostgreSQL server (tests/pg_server.py), beside SQLite.

tests/test_store.py runs its writes, idempotent reruns, killed-writer resume and 4-writer concurrency on both
backends; this module adds what only a server has (roles, refused logins, read-only sessions, concurrent schema
creation) and pins where the two backends differ and where they must not: floats round-trip bit-exactly on both
(float8 = IEEE double) except the sign of -0.0, which SQLite drops; JSON columns are the same sorted text on
both; and locking differs (SQLite serialises writers on one file lock, PostgreSQL lets writers of different rows
proceed at once and resolves a race on one key through the unique constraint).
"""

from __future__ import annotations

import math
import multiprocessing
import sqlite3
import threading
import time

import pytest
from sqlalchemy import text

from bench import migrate
from bench.cli import main
from bench.errors import StoreError
from bench.schema import Base
from bench.store import Store

AUCS = {("adapt", "loss"): (0.80, 0.72, 0.88), ("null", "loss"): (0.50, 0.42, 0.58)}
FLOATS = [0.1 + 0.2, 1 / 3, math.pi * 1e-300, 1e300, -2.5e-310, 0.0, -0.0, 123456789.123456789]


def fill(url: str, aucs: dict = AUCS, scores: list[float] | None = None) -> int:
    """One complete smoke run with AUC rows {(game, attack): (value, lo, hi)} and a utility row."""
    with Store(url) as store:
        run_id, _ = store.begin_run(run_key="k", suite="smoke", config={"z": 1, "a": [1.5, "x"], "m": {"b": 2}},
                                    config_hash="h", code_version="0", plugin_versions={"loss": "1"}, seeds=[0],
                                    hardware={})
        for (game, attack), (v, lo, hi) in aucs.items():
            s = scores or [0.0, 1.0]
            store.write_evaluation(
                run_id, f"{game}-{attack}", task="mini_pile", model="nano", defense="finetune", defense_params={},
                seed=0, game=game, attack=attack, attack_params={}, world_key="w",
                target_ids=[f"t{i}" for i in range(len(s))], labels=[i % 2 for i in range(len(s))], scores=s,
                duration_s=0.1,
                metrics=[{"metric": "auc", "value": v, "ci_low": lo, "ci_high": hi, "n_pos": 1, "n_neg": 1}])
        store.write_utility(run_id, "u", task="mini_pile", model="nano", defense="finetune", seed=0,
                            role="adapted", dataset="heldout", values={"loss": 4.0, "next_token_accuracy": 0.2},
                            n_tokens=100)
        store.write_guarantee(run_id, task="mini_pile", model="nano", defense="finetune", seed=0, name="epsilon",
                              value=math.inf, details={"delta": 1e-5})
        store.finish_run(run_id, status="complete")
    return run_id


def _cli(capsys, *args: str) -> tuple[int, str, str]:
    rc = main(list(args))
    out = capsys.readouterr()
    return rc, out.out, out.err


def test_show_and_compare_agree_with_sqlite(pg_server, tmp_path, capsys):
    pg, lite = pg_server.new_database(), f"sqlite:///{tmp_path / 'lite.db'}"
    fill(pg)
    fill(lite)
    for fmt in ("csv", "json", "table"):
        rc_pg, out_pg, err = _cli(capsys, "show", "--db", pg, "--format", fmt)
        rc_lite, out_lite, _ = _cli(capsys, "show", "--db", lite, "--format", fmt)
        assert rc_pg == rc_lite == 0, err
        assert out_pg == out_lite and "0.8" in out_pg
    rc, out, err = _cli(capsys, "compare", "--baseline", lite, "--db", pg)
    assert rc == 0 and "no regressions" in out, err
    drift = pg_server.new_database()
    fill(drift, {("adapt", "loss"): (0.99, 0.97, 1.0), ("null", "loss"): (0.5, 0.42, 0.58)})
    rc, out, err = _cli(capsys, "compare", "--baseline", pg, "--db", drift)
    assert rc == 1 and "drifted" in err and err.count("\n") == 1


def test_floats_json_and_infinity_round_trip_identically(pg_server, tmp_path):
    pg, lite = pg_server.new_database(), f"sqlite:///{tmp_path / 'lite.db'}"
    for url in (pg, lite):
        fill(url, scores=FLOATS)
    got = {}
    for url in (pg, lite):
        with Store(url, create=False) as store:
            ev = store.evaluations(1)[0]
            scores = store.scores_for(ev["id"])[2]
            with store.engine.connect() as conn:
                raw_config = conn.execute(text("SELECT config_json FROM runs")).scalar()
            got[url] = (scores, store.guarantee_rows(1)[0]["value"], raw_config, store.run_info(1)["config"])
    for url, (scores, eps, raw, config) in got.items():
        # bit-exact: float8 and SQLite REAL are both IEEE doubles, and the drivers pass them in binary or repr form
        # they differ on -0.0 only: PostgreSQL keeps its sign, SQLite stores it as 0 (no metric can tell them apart)
        assert math.copysign(1, scores[6]) == (-1 if url == pg else 1)
        assert [s.hex() for i, s in enumerate(scores) if i != 6] == [f.hex() for i, f in enumerate(FLOATS) if i != 6]
        assert eps == math.inf
        assert raw == '{"a": [1.5, "x"], "m": {"b": 2}, "z": 1}' and config == {"a": [1.5, "x"], "m": {"b": 2}, "z": 1}


def test_postgres_writers_do_not_wait_for_each_other(pg_server, tmp_path):
    """Locking differs: a PostgreSQL writer holding its transaction open does not block another writer of other
    rows; on SQLite the same second writer waits for the file's write lock (here: fails on a 0.2 s timeout)."""
    pg = pg_server.new_database()
    fill(pg)
    a, b = Store(pg, create=False), Store(pg, create=False)
    held, release = threading.Event(), threading.Event()

    def hold() -> None:
        with a._write("hold a transaction") as s:
            s.execute(text("UPDATE runs SET command = 'held'"))
            held.set()
            release.wait(30)

    t = threading.Thread(target=hold)
    t.start()
    assert held.wait(30)
    start = time.monotonic()
    assert b.write_evaluation(1, "other", task="t", model="m", defense="d", defense_params={}, seed=0, game="g",
                              attack="x", attack_params={}, world_key="w", target_ids=["a"], labels=[1],
                              scores=[0.5], metrics=[], duration_s=0.1)
    assert time.monotonic() - start < 5
    release.set()
    t.join()
    a.close()
    b.close()

    path = tmp_path / "lite.db"
    fill(f"sqlite:///{path}")
    holder = sqlite3.connect(path, isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")
    other = sqlite3.connect(path, timeout=0.2, isolation_level=None)
    with pytest.raises(sqlite3.OperationalError, match="database is locked"):
        other.execute("BEGIN IMMEDIATE")
    holder.execute("ROLLBACK")
    holder.close()
    other.close()


def _open(url: str) -> str:
    Store(url).close()
    return "ok"


def test_concurrent_first_open_creates_the_schema_once(pg_server):
    url = pg_server.new_database()
    with multiprocessing.get_context("spawn").Pool(4) as pool:
        assert pool.map(_open, [url] * 4) == ["ok"] * 4
    name = url.split("@/")[1].split("?")[0]
    assert pg_server.sql("SELECT version_num FROM alembic_version", name) == [(migrate.head(),)]


def test_leaderboard_connection_cannot_write(pg_server):
    from leaderboard.queries import check_schema, metric_frame, read_only_engine
    url = pg_server.new_database()
    fill(url)
    engine = read_only_engine(url)
    check_schema(engine)
    assert sorted(metric_frame(engine)["value"]) == [0.5, 0.8]
    with engine.connect() as conn:
        with pytest.raises(Exception, match="read-only transaction"):
            conn.execute(text("DELETE FROM metrics"))
    engine.dispose()
    with Store(url, create=False) as store:
        assert store.count_rows()["metrics"] == 2


def test_unauthorised_and_unreachable_servers(pg_server, capsys, tmp_path, monkeypatch):
    url = pg_server.new_database()
    name = url.split("@/")[1].split("?")[0]
    wrong = pg_server.url(name, "intruder", "wrong-secret")
    with pytest.raises(StoreError, match="password authentication failed") as info:
        Store(wrong)
    assert "wrong-secret" not in str(info.value) and "\n" not in str(info.value)
    rc, out, err = _cli(capsys, "show", "--db", wrong)
    assert rc == 2 and out == "" and err.count("\n") == 1 and "check the user name and password" in err
    gone = f"postgresql+psycopg://privbench@/{name}?host={pg_server.root}/nowhere&port=5432"
    rc, _, err = _cli(capsys, "db", "upgrade", "--db", gone)
    assert rc == 2 and err.count("\n") == 1 and "no database server answers" in err and "start the server" in err
    cache = tmp_path / "cache"
    monkeypatch.setenv("PRIVBENCH_CACHE", str(cache))
    monkeypatch.chdir(tmp_path)
    rc, _, err = _cli(capsys, "run", "--suite", "smoke", "--db", wrong)
    assert rc == 2 and err.count("\n") == 1 and "refused the login" in err
    assert not cache.exists() and sorted(p.name for p in tmp_path.iterdir()) == []
    # nothing was written by the refused attempts
    assert pg_server.sql("SELECT count(*) FROM pg_tables WHERE schemaname = 'public'", name) == [(0,)]


def test_upgrade_and_newer_schema_on_postgres(pg_server, capsys):
    url = pg_server.new_database()
    name = url.split("@/")[1].split("?")[0]
    with Store(url) as store:  # tables without a version stamp: a database written before versioning
        with store.engine.begin() as conn:
            conn.execute(text("DROP TABLE alembic_version"))
            Base.metadata.create_all(conn)
    with pytest.raises(StoreError, match="unversioned schema.*privbench db upgrade --db postgresql"):
        Store(url, create=False)
    rc, out, err = _cli(capsys, "db", "upgrade", "--db", url)
    assert rc == 0 and "from unversioned" in out, err
    fill(url)
    pg_server.sql("UPDATE alembic_version SET version_num = '9999_future'", name)
    rc, _, err = _cli(capsys, "show", "--db", url)
    assert rc == 2 and "newer than this privbench" in err and err.count("\n") == 1


def test_missing_binaries_skip_locally_and_fail_under_ci(monkeypatch):
    import tests.pg_server as pgs
    monkeypatch.setattr(pgs, "_bin_dir", lambda: None)
    monkeypatch.delenv("CI", raising=False)
    with pytest.raises(pytest.skip.Exception, match="apt-get install postgresql"):
        pgs.require_binaries()
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception, match="CI=true"):
        pgs.require_binaries()
