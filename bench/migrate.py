"""Schema versions of the results store (Alembic): which revision a database is at, and bringing it to head.

Why: every schema change used to strand the ``results.db`` files users already have. The migrations ship inside
the package (``bench/migrations``) and are driven from code, so they work from an installed privbench without an
``alembic.ini``. A database is in one of these states:

* ``empty``: no table at all; the store creates the tables and stamps them at head.
* ``foreign``: tables that are not privbench's (or only some of its six): refused, never written to.
* ``unversioned``: the six tables of privbench 0.2.0 and no ``alembic_version`` table (written before the schema
  was versioned); ``privbench db upgrade`` stamps it at the baseline revision and upgrades from there.
* ``older``: a known revision before head; ``privbench db upgrade`` upgrades it.
* ``current``: at head.
* ``newer``: a revision this code does not know (written by a newer privbench); only a newer privbench reads it.
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from alembic.util import CommandError
from sqlalchemy import create_engine, inspect
from sqlalchemy.engine import Connection

from bench.errors import StoreError
from bench.schema import TABLE_NAMES

__all__ = ["BASELINE", "VERSION_TABLE", "head", "revision_of", "schema_state", "check_current", "stamp_head",
           "upgrade", "upgrade_hint"]

BASELINE = "0001_baseline"
VERSION_TABLE = "alembic_version"
#: a directory path, not the "bench:migrations" resource form: importlib.resources cannot open files through the
#: editable-install finder (``pip install -e .``), and the scripts are plain files in an installed wheel too
SCRIPT_LOCATION = str(Path(__file__).resolve().parent / "migrations")


def _config(conn: Connection | None = None) -> Config:
    cfg = Config()
    cfg.set_main_option("script_location", SCRIPT_LOCATION)
    if conn is not None:
        cfg.attributes["connection"] = conn
    return cfg


@lru_cache(maxsize=1)
def _scripts() -> ScriptDirectory:
    return ScriptDirectory.from_config(_config())


def head() -> str:
    """The revision this code writes and reads."""
    rev = _scripts().get_current_head()
    assert rev is not None, "bench/migrations has no revision"
    return rev


def _known(rev: str) -> bool:
    try:
        return _scripts().get_revision(rev) is not None
    except Exception:  # alembic raises ResolutionError/CommandError for unknown ids
        return False


@lru_cache(maxsize=1)
def _baseline_columns() -> dict[str, frozenset[str]]:
    """The columns of every table at the baseline revision, read from running the baseline on an empty
    in-memory database (not copied by hand, so it cannot drift from the migration)."""
    engine = create_engine("sqlite://")
    try:
        with engine.begin() as conn:
            command.upgrade(_config(conn), BASELINE)
            insp = inspect(conn)
            return {t: frozenset(c["name"] for c in insp.get_columns(t)) for t in TABLE_NAMES}
    finally:
        engine.dispose()


def revision_of(conn: Connection) -> str | None:
    """The revision stamped in the database, None when it has no ``alembic_version`` row; a table holding several
    revisions (hand-edited, or two tools' stamps in one file) is refused, naming them."""
    try:
        return MigrationContext.configure(conn).get_current_revision()
    except CommandError:
        revs = [r for (r,) in conn.exec_driver_sql(f"SELECT version_num FROM {VERSION_TABLE}")]
        url = conn.engine.url.render_as_string(hide_password=True)
        raise StoreError(f"{url} has {len(revs)} schema revisions stamped in {VERSION_TABLE} ({', '.join(revs)}), "
                         f"where a privbench database has one: restore the file from a copy, or delete the row "
                         f"that is not {head()!r}") from None


def schema_state(conn: Connection) -> tuple[str, str | None]:
    """(state, revision): state is empty, foreign, unversioned, older, current or newer (module docstring)."""
    names = set(inspect(conn).get_table_names())
    if VERSION_TABLE in names and not names & set(TABLE_NAMES):
        rev = revision_of(conn)
        if rev is not None and not _known(rev):
            return "foreign", rev  # another tool's alembic stamp, none of privbench's tables: not a newer privbench
    if VERSION_TABLE in names:
        rev = revision_of(conn)
        if rev is not None:
            if rev == head():
                return "current", rev
            return ("older" if _known(rev) else "newer"), rev
    present = [t for t in TABLE_NAMES if t in names]
    if not present:
        return ("foreign" if names - {VERSION_TABLE} else "empty"), None
    if len(present) < len(TABLE_NAMES):
        return "foreign", None
    return "unversioned", None


def foreign_error(display_url: str, tables) -> StoreError:
    """The refusal of a database whose ``tables`` are not (all of) privbench's."""
    names = sorted(set(tables) - {VERSION_TABLE})
    holds = f"the tables {', '.join(names)}" if names else f"only an {VERSION_TABLE} table, of another tool"
    return StoreError(f"{display_url} is not a privbench results database (it holds {holds}): "
                      f"point --db at a database written by `privbench run`, or at a new file")


def _foreign(conn: Connection, display_url: str) -> StoreError:
    return foreign_error(display_url, inspect(conn).get_table_names())


def upgrade_hint(display_url: str) -> str:
    return f"run `privbench db upgrade --db {display_url}`"


def _newer(display_url: str, rev: str | None) -> StoreError:
    return StoreError(
        f"{display_url} has schema revision {rev!r}, newer than this privbench knows (head {head()!r}): "
        "upgrade privbench (`pip install -U privbench`) to open it"
    )


def check_current(conn: Connection, display_url: str) -> str:
    """Raise StoreError unless the database is empty or at head; return the state."""
    state, rev = schema_state(conn)
    if state in ("empty", "current"):
        return state
    if state == "newer":
        raise _newer(display_url, rev)
    if state == "foreign":
        raise _foreign(conn, display_url)
    what = (f"schema revision {rev!r}" if state == "older"
            else "an unversioned schema (written before privbench versioned its schema)")
    raise StoreError(f"{display_url} has {what}, this privbench needs {head()!r}: {upgrade_hint(display_url)}")


def stamp_head(conn: Connection) -> None:
    """Record that freshly created tables are at head."""
    MigrationContext.configure(conn).stamp(_scripts(), "head")


def _check_baseline(conn: Connection, display_url: str) -> None:
    """An unversioned database must hold exactly the baseline's tables and columns before it is stamped."""
    insp = inspect(conn)
    names = set(insp.get_table_names())
    missing = [t for t in TABLE_NAMES if t not in names]
    if missing:
        raise StoreError(f"{display_url} lacks the privbench tables {', '.join(missing)}: "
                         "point at a results database written by `privbench run`")
    for table, expected in _baseline_columns().items():
        have = {c["name"] for c in insp.get_columns(table)}
        if have != expected:
            diff = sorted(expected ^ have)
            raise StoreError(
                f"{display_url}: table {table!r} differs from the baseline schema (columns {', '.join(diff)}), "
                "so it cannot be stamped safely: open it with the privbench version that wrote it and export it"
            )


def upgrade(conn: Connection, display_url: str) -> tuple[str | None, str]:
    """Bring the database on ``conn`` to head inside the caller's transaction; return (from, to).

    ``from`` is None for an unversioned database (stamped at the baseline first) and for an empty one (every
    migration runs, which creates the tables; `privbench db upgrade` refuses an empty file, see Store)."""
    state, rev = schema_state(conn)
    if state == "newer":
        raise _newer(display_url, rev)
    if state == "foreign":
        raise _foreign(conn, display_url)
    if state == "unversioned":
        _check_baseline(conn, display_url)
        MigrationContext.configure(conn).stamp(_scripts(), BASELINE)
    if state != "current":
        command.upgrade(_config(conn), "head")
    return rev, head()
