"""Schema versions of the results store (bench/migrate.py, bench/migrations): upgrade keeps every row, and an
older, unversioned or newer database is refused with a one-line error that names the fix.

tests/fixtures/schema_0_2_0.db is a copy of a database written by privbench 0.2.0, before the schema was
versioned, with the schema of the shipped results.db (the smoke baseline: one run, every score, metric and
utility row of the smoke suite).
"""

from __future__ import annotations

import re
import shutil
import sqlite3
from pathlib import Path

import pytest
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import create_engine

from bench import migrate
from bench.cli import main
from bench.errors import StoreError
from bench.schema import TABLE_NAMES, Base
from bench.store import Store

OLD = Path(__file__).parent / "fixtures" / "schema_0_2_0.db"


def _dump(path: Path) -> dict[str, list[tuple]]:
    """Every row of every privbench table, in id order."""
    con = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        return {t: con.execute(f"SELECT * FROM {t} ORDER BY id").fetchall() for t in TABLE_NAMES}
    finally:
        con.close()


def _tables(path: Path) -> set[str]:
    con = sqlite3.connect(path)
    try:
        return {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    finally:
        con.close()


def _cli(capsys, *args: str) -> tuple[int, str, str]:
    rc = main(list(args))
    out = capsys.readouterr()
    return rc, out.out, out.err


@pytest.fixture()
def old_db(tmp_path) -> Path:
    path = tmp_path / "old.db"
    shutil.copyfile(OLD, path)
    return path


def test_fixture_is_unversioned_and_holds_results():
    assert OLD.stat().st_size < 2 * 1024 * 1024
    assert migrate.VERSION_TABLE not in _tables(OLD)
    rows = _dump(OLD)
    assert len(rows["runs"]) >= 1 and len(rows["scores"]) > 1000 and len(rows["metrics"]) > 100
    assert rows["utility"]


def test_unversioned_database_is_refused_with_the_upgrade_command(old_db, capsys):
    before = _dump(old_db)
    for create in (False, True):
        with pytest.raises(StoreError, match=r"unversioned schema.*run `privbench db upgrade --db sqlite:///"):
            Store(str(old_db), create=create)
    rc, out, err = _cli(capsys, "show", "--db", str(old_db))
    assert rc == 2 and out == ""
    assert err.count("\n") == 1 and f"privbench db upgrade --db sqlite:///{old_db}" in err
    # nothing written: same rows, no version table
    assert _dump(old_db) == before and migrate.VERSION_TABLE not in _tables(old_db)


def test_upgrade_keeps_every_row_and_show_reads_them(old_db, capsys):
    before = _dump(old_db)
    rc, out, err = _cli(capsys, "db", "upgrade", "--db", str(old_db))
    assert rc == 0, err
    assert f"from unversioned to schema revision {migrate.head()}" in out
    assert _dump(old_db) == before  # every run, evaluation, score, metric, utility and guarantee row
    with Store(str(old_db), create=False) as store:
        (run_id,) = [r["id"] for r in store.list_runs()]
        rows = store.metric_rows(run_id)
    stored = sorted((r[1], r[2], r[3]) for r in before["metrics"])  # (evaluation_id, metric, value)
    assert len(rows) == len(stored) and sorted(r["value"] for r in rows) == sorted(v for _, _, v in stored)
    rc, out, _ = _cli(capsys, "show", "--db", str(old_db), "--format", "csv")
    assert rc == 0 and len(out.strip().splitlines()) == len(rows) + 1
    # a second upgrade is a no-op
    rc, out, _ = _cli(capsys, "db", "upgrade", "--db", str(old_db))
    assert rc == 0 and "already at schema revision" in out and _dump(old_db) == before


def test_new_database_is_stamped_at_head_and_matches_the_migrations(tmp_path):
    created = tmp_path / "new.db"
    Store(str(created)).close()
    migrated = tmp_path / "migrated.db"
    engine = create_engine(f"sqlite:///{migrated}")
    with engine.begin() as conn:
        assert migrate.upgrade(conn, "migrated") == (None, migrate.head())
    for path in (created, migrated):
        eng = create_engine(f"sqlite:///{path}")
        with eng.connect() as conn:
            assert migrate.revision_of(conn) == migrate.head()
            # the ORM tables (bench/schema.py) and the migrations describe the same schema
            assert compare_metadata(MigrationContext.configure(conn), Base.metadata) == []
        eng.dispose()
    engine.dispose()
    Store(str(migrated), create=False).close()  # a database made by the migrations opens


def test_newer_database_is_refused_everywhere(old_db, capsys):
    Store(str(old_db), create=False, upgrade=True).close()
    con = sqlite3.connect(old_db)
    con.execute("UPDATE alembic_version SET version_num = '9999_future'")
    con.commit()
    con.close()
    before = _dump(old_db)
    for args in (("show", "--db", str(old_db)), ("db", "upgrade", "--db", str(old_db))):
        rc, out, err = _cli(capsys, *args)
        assert rc == 2 and err.count("\n") == 1
        assert "'9999_future', newer than this privbench knows" in err and "pip install -U privbench" in err
    with pytest.raises(StoreError, match="newer than this privbench"):
        Store(str(old_db), create=True)
    assert _dump(old_db) == before


def test_older_revision_is_refused_until_upgraded(monkeypatch, old_db):
    """A database at a known revision before head: simulated by a head one step ahead of the baseline."""
    Store(str(old_db), create=False, upgrade=True).close()
    monkeypatch.setattr(migrate, "head", lambda: "0002_next")
    with pytest.raises(StoreError, match=r"schema revision '0001_baseline', this privbench needs '0002_next': "
                                         r"run `privbench db upgrade"):
        Store(str(old_db), create=False)


def test_unversioned_database_with_foreign_columns_is_not_stamped(old_db, capsys):
    con = sqlite3.connect(old_db)
    con.execute("ALTER TABLE runs ADD COLUMN extra TEXT")
    con.commit()
    con.close()
    before = _dump(old_db)
    rc, _, err = _cli(capsys, "db", "upgrade", "--db", str(old_db))
    assert rc == 2 and err.count("\n") == 1 and "differs from the baseline schema (columns extra)" in err
    assert _dump(old_db) == before and migrate.VERSION_TABLE not in _tables(old_db)


def test_upgrade_of_a_missing_or_unreachable_database_fails_cleanly(tmp_path, capsys):
    missing = tmp_path / "none.db"
    rc, _, err = _cli(capsys, "db", "upgrade", "--db", str(missing))
    assert rc == 2 and "no results database" in err and not missing.exists()
    rc, _, err = _cli(capsys, "db", "upgrade", "--db", "postgresql+psycopg://u:secret@127.0.0.1:1/x")
    assert rc == 2 and err.count("\n") == 1 and "secret" not in err


def test_migrations_ship_as_package_data():
    """The migrations are read from the package (script_location bench:migrations), so an installed privbench
    must carry them: pyproject's package-data names every file Alembic needs."""
    import tomllib
    root = Path(__file__).parent.parent
    data = tomllib.loads((root / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]["bench"]
    needed = ["migrations/env.py", "migrations/script.py.mako"]
    needed += [str(p.relative_to(root / "bench")) for p in (root / "bench" / "migrations" / "versions").glob("*.py")]
    from fnmatch import fnmatch
    assert all(any(fnmatch(n, pat) for pat in data) for n in needed), (needed, data)


def test_leaderboard_refuses_unversioned_and_newer_databases(old_db, tmp_path):
    from leaderboard.queries import LeaderboardError, check_schema, read_only_engine
    before = _dump(old_db)
    engine = read_only_engine(str(old_db))
    with pytest.raises(LeaderboardError, match=r"unversioned schema.*run `privbench db upgrade --db "
                                               + re.escape(f"sqlite:///{old_db}") + "` first"):
        check_schema(engine)
    engine.dispose()
    assert _dump(old_db) == before and migrate.VERSION_TABLE not in _tables(old_db)
    Store(str(old_db), create=False, upgrade=True).close()
    engine = read_only_engine(str(old_db))
    check_schema(engine)  # at head: shown
    engine.dispose()
    con = sqlite3.connect(old_db)
    con.execute("UPDATE alembic_version SET version_num = '9999_future'")
    con.commit()
    con.close()
    engine = read_only_engine(str(old_db))
    with pytest.raises(LeaderboardError, match="newer than this privbench knows"):
        check_schema(engine)
    engine.dispose()


def test_upgrade_of_the_shipped_results_db_keeps_every_row(tmp_path):
    """The repo's results.db, as shipped before versioning: every table's rows survive `privbench db upgrade`."""
    shipped = Path(__file__).parent.parent / "results.db"
    if not shipped.exists() or migrate.VERSION_TABLE in _tables(shipped):
        pytest.skip("no unversioned results.db in this checkout (tests/fixtures/schema_0_2_0.db covers the upgrade)")
    copy = tmp_path / "results.db"
    shutil.copyfile(shipped, copy)
    before = _dump(copy)
    with Store(str(copy), create=False, upgrade=True) as store:
        assert store.upgraded == (None, migrate.head())
        n_metric_rows = sum(len(store.metric_rows(r["id"])) for r in store.list_runs())
    assert _dump(copy) == before and n_metric_rows == len(before["metrics"])
