"""Results store: persist and read benchmark results through SQLAlchemy 2.

Design
------
* **Per-sample scores are the source of truth.** Every evaluation stores the
  score and label of every target, so any metric can be recomputed later
  (new metrics, other confidence intervals) without rerunning an attack.
  The ``metrics`` table is derived data, written next to the scores.
* **Every write is one transaction.** An evaluation, all its scores and all
  its metric rows commit together or not at all; a crash or a validation
  error never leaves a half-written evaluation behind.
* **Keys are unique, so a rerun is idempotent.** A run is identified by its
  ``run_key`` (hash of config + code version, chosen by the caller), an
  evaluation by ``(run_id, eval_key)``, a score by ``(evaluation_id,
  target_id)``. Writing something that already exists is a no-op, so an
  interrupted run can simply be started again and skips finished work.
* **SQLite by default, any SQLAlchemy URL works.** SQLite runs in WAL mode
  (readers never block the writer) with a 30 s busy timeout, and write
  transactions start with ``BEGIN IMMEDIATE`` so several worker processes can
  write into one file at once: they queue for the write lock instead of
  failing with "database is locked".

JSON-valued columns are stored as text written with ``json.dumps(...,
sort_keys=True)`` so that equal values give equal text.
"""

from __future__ import annotations

import json
import math
import os
import re
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable, TypeVar

from sqlalchemy import (
    create_engine,
    event,
    inspect,
    func,
    insert,
    select,
)
from sqlalchemy.engine import Engine, make_url
from sqlalchemy.exc import (
    ArgumentError,
    IntegrityError,
    NoSuchModuleError,
    SQLAlchemyError,
)
from sqlalchemy.orm import Session, sessionmaker
from sqlalchemy.pool import StaticPool

from bench import migrate
from bench.errors import NoDatabase, StoreError
from bench.schema import (RUN_STATUSES, UTILITY_ROLES, Base, Evaluation, EvaluationRow, Guarantee, GuaranteeRow,
                          Metric, Run, Score, Utility, UtilityRow)

__all__ = [
    "Base",
    "Evaluation",
    "Guarantee",
    "Metric",
    "Run",
    "Score",
    "Store",
    "Utility",
    "RUN_STATUSES",
    "UTILITY_ROLES",
    "DEFAULT_URL",
]

DEFAULT_URL = "sqlite:///results.db"
SQLITE_BUSY_TIMEOUT_S = 30.0
URL_HINT = "use sqlite:///path/to/results.db or a SQLAlchemy URL"

_WRITE_OPTION = "privbench_write"  # execution option: this transaction writes
_SCHEMA_LOCK = 0x70726976  # PostgreSQL advisory lock key taken while creating or migrating the schema

T = TypeVar("T")


_TABLES: dict[str, type[Base]] = {
    "runs": Run,
    "evaluations": Evaluation,
    "scores": Score,
    "metrics": Metric,
    "utility": Utility,
    "guarantees": Guarantee,
}


# ---------------------------------------------------------------- helpers


def _utcnow() -> datetime:
    return datetime.now(timezone.utc)


def _iso(value: datetime | None) -> str | None:
    if value is None:
        return None
    if value.tzinfo is None:  # SQLite hands back naive datetimes; we store UTC
        value = value.replace(tzinfo=timezone.utc)
    return value.isoformat()


def _dumps(value: Any, what: str) -> str:
    try:
        return json.dumps(value, sort_keys=True)
    except (TypeError, ValueError) as exc:
        raise StoreError(f"{what} is not JSON-serialisable ({exc}): pass plain dicts/lists of str, numbers and bools") from None


def _loads(text: str | None) -> Any:
    return None if text is None else json.loads(text)


def _normalize_url(url: Any) -> str:
    if isinstance(url, os.PathLike):
        url = os.fspath(url)
    if not isinstance(url, str) or not url.strip():
        raise StoreError(f"empty database URL {url!r}: {URL_HINT}")
    url = url.strip()
    if "://" not in url:  # a bare filesystem path
        return "sqlite:///" + os.path.abspath(os.path.expanduser(url))
    return url


def _mask_password(url: str) -> str:
    """Hide the password of a URL that SQLAlchemy could not parse."""
    return re.sub(r"(://[^:/@]*:)[^@/]*@", r"\1***@", url)


def _first_line(exc: BaseException) -> str:
    orig = getattr(exc, "orig", None) or exc
    text = str(orig).strip().splitlines()
    return text[0] if text else type(orig).__name__


def _finite(value: Any, what: str) -> float:
    try:
        out = float(value)
    except (TypeError, ValueError):
        raise StoreError(f"{what} is {value!r}, not a number: pass a finite float") from None
    if not math.isfinite(out):
        raise StoreError(f"{what} is {out!r}, not a finite number: NaN/inf cannot be stored")
    return out


def _optional_float(value: Any, what: str) -> float | None:
    """None stays None; NaN becomes None (no value); inf is kept."""
    if value is None:
        return None
    try:
        out = float(value)
    except (TypeError, ValueError):
        raise StoreError(f"{what} is {value!r}, not a number: pass a float or None") from None
    return None if math.isnan(out) else out


def _int(value: Any, what: str) -> int:
    try:
        out = int(value)
    except (TypeError, ValueError, OverflowError):
        raise StoreError(f"{what} is {value!r}, not an integer: pass an int") from None
    if out != value:
        raise StoreError(f"{what} is {value!r}, not an integer: pass an int")
    return out


_METRIC_FIELDS = ("metric", "value", "ci_low", "ci_high", "n_pos", "n_neg")


def _metric_dict(row: Any, eval_key: str) -> dict[str, Any]:
    """Read a MetricRow-like object (or a mapping) into column values."""
    get: Callable[[str], Any]
    if isinstance(row, Mapping):
        missing = [f for f in _METRIC_FIELDS if f not in row]
        get = lambda f: row.get(f)  # noqa: E731
    else:
        missing = [f for f in _METRIC_FIELDS if not hasattr(row, f)]
        get = lambda f: getattr(row, f, None)  # noqa: E731
    if missing:
        raise StoreError(
            f"evaluation {eval_key!r}: metric row {row!r} lacks {', '.join(missing)}: "
            "pass bench.metrics.MetricRow objects"
        )
    name = str(get("metric"))
    where = f"evaluation {eval_key!r}: metric {name!r}"
    flag = get("flag")
    return {
        "metric": name,
        "value": _finite(get("value"), f"{where} value"),
        "ci_low": _optional_float(get("ci_low"), f"{where} ci_low"),
        "ci_high": _optional_float(get("ci_high"), f"{where} ci_high"),
        "n_pos": _int(get("n_pos"), f"{where} n_pos"),
        "n_neg": _int(get("n_neg"), f"{where} n_neg"),
        "flag": None if flag is None else str(flag),
    }


# ---------------------------------------------------------------- store


def _refuse_foreign_sqlite(path: Path, display_url: str) -> None:
    """Refuse, without writing a byte, an SQLite file whose tables are not privbench's (another application's
    database): opening it to write would set WAL mode and add privbench's tables beside the owner's."""
    import sqlite3

    from bench.schema import TABLE_NAMES
    try:
        con = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True)
        try:
            names = {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type = 'table' "
                                               "AND name NOT LIKE 'sqlite_%'")}
        finally:
            con.close()
    except sqlite3.Error:
        return  # not a database at all, or locked: the connection below says so
    names.discard(migrate.VERSION_TABLE)
    if names and len(names & set(TABLE_NAMES)) < len(TABLE_NAMES):
        raise migrate.foreign_error(display_url, names)


def _sqlite_uri_path(database: str) -> str:
    """The file a SQLite ``file:`` URI names (``file:/a/b.db``, ``file:///a/b.db``, ``file:b.db``), query and
    fragment dropped; empty for ``file::memory:`` and the like."""
    from urllib.parse import unquote, urlsplit
    rest = database[len("file:"):].split("?", 1)[0].split("#", 1)[0]
    if rest.startswith(":memory:") or not rest:
        return ""
    if rest.startswith("//"):
        rest = urlsplit("file:" + rest).path  # file://host/path: SQLite takes only an empty host or localhost
    return unquote(rest)


class Store:
    """The results database. Thread-safe for reads and writes; open one per process."""

    def __init__(self, url: str = DEFAULT_URL, *, create: bool = True, upgrade: bool = False) -> None:
        """``create``: make the tables of an empty database. ``upgrade``: migrate an older schema to head
        first (``privbench db upgrade``); ``upgraded`` then holds (from revision, to revision)."""
        self.upgraded: tuple[str | None, str] | None = None
        self.url = _normalize_url(url)
        try:
            parsed = make_url(self.url)
        except (ArgumentError, ValueError) as exc:
            shown = _mask_password(self.url)
            reason = _first_line(exc).replace(self.url, shown)
            raise StoreError(f"malformed database URL {shown!r} ({reason}): {URL_HINT}") from None
        self.display_url = parsed.render_as_string(hide_password=True)
        self.is_sqlite = parsed.get_backend_name() == "sqlite"

        kwargs: dict[str, Any] = {}
        if self.is_sqlite:
            database = parsed.database
            if "mode" in parsed.query and str(parsed.query.get("uri", "")).lower() != "true":
                # pysqlite would ignore the mode, with a warning, and open the file writable
                raise StoreError(f"{self.display_url}: the SQLite option mode= takes effect only in a URI: write "
                                 f"sqlite:///file:{database}?mode={parsed.query['mode']}&uri=true")
            if database in (None, "", ":memory:"):
                # One shared connection, or every session would see a new empty DB.
                kwargs.update(poolclass=StaticPool, connect_args={"check_same_thread": False})
            else:
                kwargs["connect_args"] = {"timeout": SQLITE_BUSY_TIMEOUT_S}
                # a file: URI (with uri=true) names a file as a plain path does, and is checked the same way;
                # only an in-memory one (mode=memory) has no file
                file_uri = database.startswith("file:")
                is_uri = file_uri and (parsed.query.get("mode") == "memory" or not _sqlite_uri_path(database))
                path = Path(_sqlite_uri_path(database) if file_uri else database).expanduser()
                if not is_uri and path.is_dir():
                    raise StoreError(
                        f"{self.display_url} is a directory, not a database file: "
                        f"use sqlite:///{path / 'results.db'}"
                    )
                if not create and not is_uri and not path.exists():
                    raise NoDatabase(
                        f"no results database at {str(path)!r}: run `privbench run --suite smoke` first, "
                        f"or {URL_HINT}"
                    )
                if not is_uri and path.is_file() and path.stat().st_size > 0:
                    _refuse_foreign_sqlite(path, self.display_url)  # before a connection sets WAL mode on it
                parent = path.parent
                if create and not is_uri and not parent.exists():
                    try:
                        parent.mkdir(parents=True, exist_ok=True)
                    except OSError as exc:
                        raise StoreError(
                            f"cannot create directory {str(parent)!r} for {self.display_url} "
                            f"({exc.strerror}): choose a writable path"
                        ) from None
        try:
            engine = create_engine(parsed, **kwargs)
        except NoSuchModuleError:
            raise StoreError(
                f"unknown database dialect {parsed.drivername!r} in {self.display_url!r}: {URL_HINT}"
            ) from None
        except ImportError as exc:
            raise StoreError(
                f"the database driver for {parsed.drivername!r} is not installed ({exc.name or exc}): "
                f"install it, or {URL_HINT}"
            ) from None
        except (ArgumentError, TypeError, ValueError) as exc:
            raise StoreError(f"bad database URL {self.display_url!r} ({_first_line(exc)}): {URL_HINT}") from None

        self.engine: Engine = engine
        dbapi = getattr(engine.dialect, "loaded_dbapi", None) or getattr(engine.dialect, "dbapi", None)
        self._dbapi_error: type[BaseException] = getattr(dbapi, "Error", SQLAlchemyError)
        pysqlite = self.is_sqlite and engine.dialect.driver == "pysqlite"
        if pysqlite:
            self._install_sqlite_events(engine)
        self._sessions = sessionmaker(engine, expire_on_commit=False)

        try:
            if upgrade:
                self._upgrade(engine)
            self._open(engine, create)
            if pysqlite and create:
                self._enable_wal(engine)
        except BaseException:
            engine.dispose()
            raise

    def _open(self, engine: Engine, create: bool) -> None:
        """Create an empty database at the schema's head revision, else require it to be at head
        (bench/migrate.py): an older or newer schema is an error naming the fix, never a silent write."""
        with self._guard("open the database"):
            with engine.connect() as conn:
                if create:
                    conn = conn.execution_options(**{_WRITE_OPTION: True})
                    with conn.begin():
                        if conn.dialect.name == "postgresql":
                            # PostgreSQL has no file lock: writers opening an empty database at once would all
                            # create the tables; a transaction-scoped advisory lock lets one create, the rest see it
                            conn.exec_driver_sql(f"SELECT pg_advisory_xact_lock({_SCHEMA_LOCK})")
                        if migrate.check_current(conn, self.display_url) == "empty":
                            Base.metadata.create_all(conn)
                            migrate.stamp_head(conn)
                else:
                    with conn.begin():
                        missing = [t for t in _TABLES if not inspect(conn).has_table(t)]
                        if not missing:
                            migrate.check_current(conn, self.display_url)
                    if missing:
                        raise StoreError(
                            f"{self.display_url} has no privbench tables ({', '.join(missing)} missing): "
                            "point at a results database written by `privbench run`"
                        )

    def check_writable(self, action: str = "write") -> None:
        """Refuse a database this process cannot write (a read-only file, URI or user) before long work whose
        results would then be lost: an update that changes nothing, in a transaction that is rolled back."""
        with self._guard(action):
            with self.engine.connect() as conn:
                conn = conn.execution_options(**{_WRITE_OPTION: True})
                trans = conn.begin()
                try:
                    conn.exec_driver_sql(f"UPDATE {migrate.VERSION_TABLE} SET version_num = version_num")
                finally:
                    trans.rollback()

    def _upgrade(self, engine: Engine) -> None:
        """Migrate to head in one write transaction: a failed migration leaves the old schema untouched."""
        with self._guard("upgrade the database schema"):
            with engine.connect() as conn:
                conn = conn.execution_options(**{_WRITE_OPTION: True})
                with conn.begin():
                    if conn.dialect.name == "postgresql":
                        conn.exec_driver_sql(f"SELECT pg_advisory_xact_lock({_SCHEMA_LOCK})")
                    if migrate.schema_state(conn)[0] == "empty":  # e.g. a zero-byte file: not a database to migrate
                        raise StoreError(f"{self.display_url} has no privbench tables: nothing to upgrade; point --db "
                                         f"at a results database written by `privbench run` (a run creates a new "
                                         f"one at the current schema)")
                    self.upgraded = migrate.upgrade(conn, self.display_url)

    # -------------------------------------------------------- plumbing

    def _enable_wal(self, engine: Engine) -> None:
        """WAL journal mode (readers never wait for the writer), switched on only after the file proved to be a
        privbench database at the current schema: a refused file keeps every byte, its journal mode included. The
        mode is stored in the file, so later connections use it too; a read-only `show` never switches it."""
        with self._guard("switch the database to WAL mode"):
            raw = engine.raw_connection()  # outside any transaction, which SQLite requires for this pragma
            try:
                cur = raw.cursor()
                cur.execute("PRAGMA journal_mode = WAL").fetchall()
                cur.close()
            finally:
                raw.close()

    @staticmethod
    def _install_sqlite_events(engine: Engine) -> None:
        """Busy timeout and foreign keys on every connection."""
        @event.listens_for(engine, "connect")
        def _on_connect(dbapi_conn: Any, _record: Any) -> None:
            # Let SQLAlchemy's "begin" event issue BEGIN, not the driver.
            dbapi_conn.isolation_level = None
            cur = dbapi_conn.cursor()
            try:
                cur.execute(f"PRAGMA busy_timeout = {int(SQLITE_BUSY_TIMEOUT_S * 1000)}")
                cur.execute("PRAGMA foreign_keys = ON")
            finally:
                cur.close()

        @event.listens_for(engine, "begin")
        def _on_begin(conn: Any) -> None:
            # Writers take the write lock up front (waiting up to the busy
            # timeout) rather than failing when a read lock must be upgraded.
            if conn.get_execution_options().get(_WRITE_OPTION):
                conn.exec_driver_sql("BEGIN IMMEDIATE")
            else:
                conn.exec_driver_sql("BEGIN")

    def _translate(self, exc: BaseException, action: str) -> StoreError:
        msg = _first_line(exc)
        low = msg.lower()
        url = self.display_url
        if "database disk image is malformed" in low:
            return StoreError(f"{url} is damaged ({msg}; cannot {action}): restore it from a copy, or point at "
                              f"another file")
        if "file is not a database" in low or "file is encrypted" in low:
            return StoreError(f"{url} is not a SQLite database (cannot {action}): {URL_HINT}")
        if "no such table" in low or ("does not exist" in low and "relation" in low):
            return StoreError(
                f"{url} has no privbench tables ({msg}): point at a results database "
                "written by `privbench run`, or open it with create=True"
            )
        if "database is locked" in low or "database is busy" in low:
            return StoreError(
                f"{url} is locked by another process (waited {SQLITE_BUSY_TIMEOUT_S:.0f} s to {action}): "
                "retry, or stop the other writer"
            )
        if "unable to open database file" in low:
            return StoreError(
                f"cannot open {url} ({msg}): check that the directory exists and is writable"
            )
        refused = ("authentication failed", "no pg_hba.conf entry", "access denied for user")
        if any(r in low for r in refused) or ("role" in low and "does not exist" in low):
            return StoreError(f"{url} refused the login ({msg}): check the user name and password in the URL")
        if "connection refused" in low or ("no such file or directory" in low and "socket" in low):
            return StoreError(f"no database server answers at {url} ({msg}): start the server, or fix the host, "
                              "port or socket directory in the URL")
        if "readonly" in low or "read-only" in low:
            return StoreError(f"{url} is read-only (cannot {action}): use a writable file or URL")
        return StoreError(
            f"database error on {url} while trying to {action} ({msg}): "
            f"check the database URL and that it is reachable; {URL_HINT}"
        )

    @contextmanager
    def _guard(self, action: str) -> Iterator[None]:
        try:
            yield
        except (StoreError, IntegrityError):
            # IntegrityError = a concurrent writer inserted the same key;
            # _retry_conflict handles it.
            raise
        except (SQLAlchemyError, self._dbapi_error) as exc:  # type: ignore[misc]
            raise self._translate(exc, action) from exc

    def database_errors(self, action: str):
        """A context in which errors of this database's driver (damaged file, lost server, locked file) become
        the one-line :class:`StoreError` the store itself raises, e.g. for code reading the same database through
        another engine (the leaderboard's read-only one)."""
        return self._guard(action)

    @contextmanager
    def _write(self, action: str) -> Iterator[Session]:
        """A session inside one write transaction (BEGIN IMMEDIATE on SQLite)."""
        with self._guard(action):
            with self._sessions() as session, session.begin():
                session.connection(execution_options={_WRITE_OPTION: True})
                yield session

    @contextmanager
    def _read(self, action: str) -> Iterator[Session]:
        """A read session; a stored value that cannot be decoded (a date or JSON column edited by hand, a damaged
        row) is named as the database's problem, not raised as privbench's own."""
        with self._guard(action):
            with self._sessions() as session:
                try:
                    yield session
                except (ValueError, TypeError) as exc:
                    raise StoreError(f"cannot read a stored value of {self.display_url} while trying to {action} "
                                     f"({type(exc).__name__}: {_first_line(exc)}): a row was edited by hand or the "
                                     f"file is damaged; restore it from a copy") from exc

    def _retry_conflict(self, fn: Callable[[], T], action: str) -> T:
        """Run a write; if a concurrent writer inserted the same key first
        (possible on servers without a global write lock), run it again: the
        second pass sees the row and skips it."""
        try:
            return fn()
        except IntegrityError:
            pass
        try:
            return fn()
        except IntegrityError as exc:
            raise self._translate(exc, action) from exc

    @staticmethod
    def _require_run(session: Session, run_id: int) -> Run:
        run = session.get(Run, run_id)
        if run is None:
            raise StoreError(f"no run with id {run_id}: list runs with `privbench show --list`")
        return run

    def close(self) -> None:
        """Release pooled connections."""
        self.engine.dispose()

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Store({self.display_url!r})"

    # -------------------------------------------------------- runs

    def begin_run(
        self,
        *,
        run_key: str,
        suite: str,
        config: dict,
        config_hash: str,
        code_version: str,
        plugin_versions: dict,
        seeds: list[int],
        hardware: dict,
        command: str | None = None,
        submitted_by: str | None = None,
        started_at: datetime | None = None,
    ) -> tuple[int, str]:
        """Start (or resume) the run ``run_key``; return ``(run_id, previous_status)``. ``started_at`` (UTC) is
        when the work began where that was before the run is stored (a submission stores its run once its
        sandboxed child is done); now by default.

        previous_status is ``"new"`` for a fresh run; ``"complete"`` means the
        run is already finished and nothing was changed; ``"running"`` or
        ``"failed"`` means an earlier attempt is resumed (status set back to
        running, error cleared, started_at reset).
        """
        values = dict(
            suite=suite,
            config_json=_dumps(config, "config"),
            config_hash=config_hash,
            code_version=code_version,
            plugin_versions_json=_dumps(plugin_versions, "plugin_versions"),
            seeds_json=_dumps([_int(s, "seed") for s in seeds], "seeds"),
            hardware_json=_dumps(hardware, "hardware"),
            command=command,
            submitted_by=submitted_by,
        )

        def attempt() -> tuple[int, str]:
            with self._write("begin a run") as s:
                run = s.scalars(select(Run).where(Run.run_key == run_key)).one_or_none()
                if run is None:
                    run = Run(run_key=run_key, status="running", started_at=started_at or _utcnow(), **values)
                    s.add(run)
                    s.flush()
                    return run.id, "new"
                previous = run.status
                if previous != "complete":
                    run.status = "running"
                    run.error = None
                    run.started_at = started_at or _utcnow()
                    run.finished_at = None
                    run.duration_s = None
                return run.id, previous

        return self._retry_conflict(attempt, "begin a run")

    def finish_run(
        self,
        run_id: int,
        *,
        status: str,
        error: str | None = None,
        duration_s: float | None = None,
    ) -> None:
        """Mark a run complete or failed."""
        if status not in ("complete", "failed"):
            raise StoreError(f"cannot finish run {run_id} with status {status!r}: use 'complete' or 'failed'")
        with self._write("finish a run") as s:
            run = self._require_run(s, run_id)
            run.status = status
            run.error = error
            run.finished_at = _utcnow()
            run.duration_s = None if duration_s is None else float(duration_s)

    def mark_submission(self, run_id: int, *, submitter: str | None, verified: bool) -> None:
        """Record who submitted a plugin run and whether it ran in CI (``privbench submit``)."""
        with self._write("mark a submission") as s:
            run = self._require_run(s, run_id)
            run.submitted_by = submitter
            run.verified_ci = bool(verified)

    def resolve_run(self, ref: str | int | None) -> int:
        """Turn a user's run reference into a run id.

        None: the latest run. An int or digit string: that id. Otherwise a
        run_key, a suite name (its latest run) or a unique run_key prefix.
        """
        with self._read("look up a run") as s:
            if ref is None:
                latest = s.scalar(select(func.max(Run.id)))
                if latest is None:
                    raise StoreError(f"no runs in {self.display_url}: run `privbench run --suite smoke` first")
                return int(latest)
            if isinstance(ref, bool) or not isinstance(ref, (int, str)):
                raise StoreError(f"run reference {ref!r} is not an id, run key or suite name: see `privbench show --list`")
            text = str(ref).strip()
            if isinstance(ref, int) or text.isdecimal():
                if int(text) >= 2 ** 63 or s.get(Run, int(text)) is None:
                    raise StoreError(f"no run with id {text} in {self.display_url}: see `privbench show --list`")
                return int(text)
            if text:
                exact = s.scalar(select(Run.id).where(Run.run_key == text))
                if exact is not None:
                    return int(exact)
                by_suite = s.scalar(select(func.max(Run.id)).where(Run.suite == text))
                if by_suite is not None:
                    return int(by_suite)
                prefix = text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
                matches = s.execute(
                    select(Run.id, Run.run_key)
                    .where(Run.run_key.like(prefix + "%", escape="\\"))
                    .order_by(Run.id)
                    .limit(6)
                ).all()
                if len(matches) == 1:
                    return int(matches[0].id)
                if len(matches) > 1:
                    keys = ", ".join(m.run_key[: len(text) + 4] for m in matches[:5])
                    raise StoreError(
                        f"run key prefix {text!r} is ambiguous ({keys}, ...): "
                        "give more characters or the run id from `privbench show --list`"
                    )
            raise StoreError(
                f"unknown run {ref!r} in {self.display_url}: it is not a run id, run key or suite name; "
                "see `privbench show --list`"
            )

    def list_runs(self) -> list[dict]:
        """All runs, oldest first, with their number of evaluations."""
        n_eval = (
            select(Evaluation.run_id, func.count(Evaluation.id).label("n"))
            .group_by(Evaluation.run_id)
            .subquery()
        )
        with self._read("list runs") as s:
            rows = s.execute(
                select(Run, func.coalesce(n_eval.c.n, 0))
                .outerjoin(n_eval, n_eval.c.run_id == Run.id)
                .order_by(Run.id)
            ).all()
            return [
                {
                    "id": run.id,
                    "suite": run.suite,
                    "status": run.status,
                    "started_at": _iso(run.started_at),
                    "duration_s": run.duration_s,
                    "code_version": run.code_version,
                    "n_evaluations": int(n),
                }
                for run, n in rows
            ]

    def run_info(self, run_id: int) -> dict:
        """Every column of a run; JSON columns decoded (``config``, ``plugin_versions``,
        ``seeds``, ``hardware``), datetimes as ISO strings."""
        with self._read("read a run") as s:
            run = self._require_run(s, run_id)
            return {
                "id": run.id,
                "run_key": run.run_key,
                "suite": run.suite,
                "config": _loads(run.config_json),
                "config_hash": run.config_hash,
                "code_version": run.code_version,
                "plugin_versions": _loads(run.plugin_versions_json),
                "seeds": _loads(run.seeds_json),
                "hardware": _loads(run.hardware_json),
                "status": run.status,
                "error": run.error,
                "started_at": _iso(run.started_at),
                "finished_at": _iso(run.finished_at),
                "duration_s": run.duration_s,
                "submitted_by": run.submitted_by,
                "verified_ci": bool(run.verified_ci),
                "command": run.command,
            }

    # -------------------------------------------------------- evaluations

    def has_evaluation(self, run_id: int, eval_key: str) -> bool:
        with self._read("look up an evaluation") as s:
            found = s.scalar(
                select(Evaluation.id).where(Evaluation.run_id == run_id, Evaluation.eval_key == eval_key)
            )
            return found is not None

    def write_row(self, run_id: int, row: EvaluationRow | UtilityRow | GuaranteeRow) -> None:
        """Write one row a job returned (bench/schema.py), into the table its type names."""
        if isinstance(row, EvaluationRow):
            self.write_evaluation(run_id, **row.fields())
        elif isinstance(row, UtilityRow):
            self.write_utility(run_id, **row.fields())
        elif isinstance(row, GuaranteeRow):
            self.write_guarantee(run_id, **row.fields())
        else:
            raise StoreError(f"cannot write a {type(row).__name__}: rows are EvaluationRow, UtilityRow or "
                             f"GuaranteeRow (bench/schema.py)")

    def write_evaluation(
        self,
        run_id: int,
        eval_key: str,
        *,
        task: str,
        model: str,
        defense: str,
        defense_params: dict,
        seed: int,
        game: str,
        attack: str,
        attack_params: dict,
        world_key: str,
        target_ids: Sequence[str],
        labels: Sequence[int],
        scores: Sequence[float],
        metrics: Sequence[Any],
        duration_s: float,
    ) -> bool:
        """Write an evaluation with all its scores and metric rows in one transaction.

        Returns False (and writes nothing) if ``(run_id, eval_key)`` exists.
        Raises StoreError (and writes nothing) if the lengths of target_ids,
        labels and scores differ, a score is not finite, a target id repeats,
        or a metric row is malformed.
        """
        # Validate everything before touching the database.
        n = len(target_ids)
        if len(labels) != n or len(scores) != n:
            raise StoreError(
                f"evaluation {eval_key!r}: {n} target_ids, {len(labels)} labels and {len(scores)} scores: "
                "pass exactly one label and one score per target"
            )
        ids = [str(t) for t in target_ids]
        if len(set(ids)) != n:
            seen: set[str] = set()
            dup = next(t for t in ids if t in seen or seen.add(t))  # type: ignore[func-returns-value]
            raise StoreError(f"evaluation {eval_key!r}: target id {dup!r} appears twice: target ids must be unique")
        score_rows: list[dict[str, Any]] = []
        for tid, label, score in zip(ids, labels, scores):
            score_rows.append(
                {
                    "target_id": tid,
                    "label": _int(label, f"evaluation {eval_key!r}: label of target {tid!r}"),
                    "score": _finite(score, f"evaluation {eval_key!r}: score of target {tid!r}"),
                }
            )
        metric_rows = [_metric_dict(m, eval_key) for m in metrics]
        names = [m["metric"] for m in metric_rows]
        if len(set(names)) != len(names):
            dup_name = next(x for x in names if names.count(x) > 1)
            raise StoreError(f"evaluation {eval_key!r}: metric {dup_name!r} appears twice: pass each metric once")
        evaluation = dict(
            run_id=run_id,
            eval_key=eval_key,
            task=task,
            model=model,
            defense=defense,
            defense_params_json=_dumps(defense_params, "defense_params"),
            seed=_int(seed, f"evaluation {eval_key!r}: seed"),
            game=game,
            attack=attack,
            attack_params_json=_dumps(attack_params, "attack_params"),
            world_key=world_key,
            duration_s=_finite(duration_s, f"evaluation {eval_key!r}: duration_s"),
        )
        action = f"write evaluation {eval_key!r}"

        def attempt() -> bool:
            with self._write(action) as s:
                self._require_run(s, run_id)
                exists = s.scalar(
                    select(Evaluation.id).where(Evaluation.run_id == run_id, Evaluation.eval_key == eval_key)
                )
                if exists is not None:
                    return False
                ev = Evaluation(created_at=_utcnow(), **evaluation)
                s.add(ev)
                s.flush()
                if score_rows:
                    s.execute(insert(Score), [{"evaluation_id": ev.id, **r} for r in score_rows])
                if metric_rows:
                    s.execute(insert(Metric), [{"evaluation_id": ev.id, **r} for r in metric_rows])
                return True

        return self._retry_conflict(attempt, action)

    def evaluations(self, run_id: int) -> list[dict]:
        """The evaluations of a run (id, eval_key, parameters), for re-deriving
        metrics from :meth:`scores_for`."""
        with self._read("list evaluations") as s:
            self._require_run(s, run_id)
            evs = s.scalars(
                select(Evaluation)
                .where(Evaluation.run_id == run_id)
                .order_by(
                    Evaluation.task, Evaluation.model, Evaluation.defense, Evaluation.seed,
                    Evaluation.game, Evaluation.attack, Evaluation.id,
                )
            ).all()
            return [
                {
                    "id": e.id,
                    "run": e.run_id,
                    "eval_key": e.eval_key,
                    "task": e.task,
                    "model": e.model,
                    "defense": e.defense,
                    "defense_params": _loads(e.defense_params_json),
                    "seed": e.seed,
                    "game": e.game,
                    "attack": e.attack,
                    "attack_params": _loads(e.attack_params_json),
                    "world_key": e.world_key,
                    "duration_s": e.duration_s,
                    "created_at": _iso(e.created_at),
                }
                for e in evs
            ]

    def scores_for(self, evaluation_id: int) -> tuple[list[str], list[int], list[float]]:
        """(target_ids, labels, scores) of an evaluation, in the order written."""
        with self._read("read scores") as s:
            if s.get(Evaluation, evaluation_id) is None:
                raise StoreError(f"no evaluation with id {evaluation_id} in {self.display_url}: check the id")
            rows = s.execute(
                select(Score.target_id, Score.label, Score.score)
                .where(Score.evaluation_id == evaluation_id)
                .order_by(Score.id)
            ).all()
        return [r[0] for r in rows], [int(r[1]) for r in rows], [float(r[2]) for r in rows]

    def metric_rows(self, run_id: int) -> list[dict]:
        """One dict per metric row of a run, ordered by task, model, defense,
        seed, game, attack, metric."""
        with self._read("read metrics") as s:
            self._require_run(s, run_id)
            rows = s.execute(
                select(
                    Run.id, Run.suite, Evaluation.task, Evaluation.model, Evaluation.defense,
                    Evaluation.seed, Evaluation.game, Evaluation.attack, Metric.metric, Metric.value,
                    Metric.ci_low, Metric.ci_high, Metric.n_pos, Metric.n_neg, Metric.flag,
                )
                .join(Evaluation, Evaluation.run_id == Run.id)
                .join(Metric, Metric.evaluation_id == Evaluation.id)
                .where(Run.id == run_id)
                .order_by(
                    Evaluation.task, Evaluation.model, Evaluation.defense, Evaluation.seed,
                    Evaluation.game, Evaluation.attack, Metric.metric,
                )
            ).all()
        keys = ("run", "suite", "task", "model", "defense", "seed", "game", "attack", "metric",
                "value", "ci_low", "ci_high", "n_pos", "n_neg", "flag")
        return [dict(zip(keys, r)) for r in rows]

    # -------------------------------------------------------- utility and guarantees

    def write_utility(
        self,
        run_id: int,
        utility_key: str,
        *,
        task: str,
        model: str,
        defense: str,
        seed: int,
        role: str,
        dataset: str,
        values: Mapping[str, float],
        n_tokens: int,
    ) -> None:
        """Write utility metrics (e.g. {"loss": 2.1, "perplexity": 8.2});
        metrics already stored under (run_id, utility_key) are skipped."""
        if role not in UTILITY_ROLES:
            raise StoreError(f"utility role {role!r} is unknown: use one of {', '.join(UTILITY_ROLES)}")
        common = dict(
            run_id=run_id, utility_key=utility_key, task=task, model=model, defense=defense,
            seed=_int(seed, "utility seed"), role=role, dataset=dataset,
            n_tokens=_int(n_tokens, "utility n_tokens"),
        )
        rows = {str(k): _finite(v, f"utility {utility_key!r} metric {k!r}") for k, v in values.items()}
        action = f"write utility {utility_key!r}"

        def attempt() -> None:
            with self._write(action) as s:
                self._require_run(s, run_id)
                existing = set(
                    s.scalars(
                        select(Utility.metric).where(Utility.run_id == run_id, Utility.utility_key == utility_key)
                    )
                )
                new = [{**common, "metric": m, "value": v} for m, v in rows.items() if m not in existing]
                if new:
                    s.execute(insert(Utility), new)

        self._retry_conflict(attempt, action)

    def utility_rows(self, run_id: int) -> list[dict]:
        """Utility rows of a run: run, task, model, defense, seed, role, dataset,
        metric, value, n_tokens."""
        with self._read("read utility") as s:
            self._require_run(s, run_id)
            rows = s.execute(
                select(
                    Utility.run_id, Utility.task, Utility.model, Utility.defense, Utility.seed,
                    Utility.role, Utility.dataset, Utility.metric, Utility.value, Utility.n_tokens,
                )
                .where(Utility.run_id == run_id)
                .order_by(
                    Utility.task, Utility.model, Utility.defense, Utility.seed, Utility.role,
                    Utility.dataset, Utility.metric,
                )
            ).all()
        keys = ("run", "task", "model", "defense", "seed", "role", "dataset", "metric", "value", "n_tokens")
        return [dict(zip(keys, r)) for r in rows]

    def write_guarantee(
        self,
        run_id: int,
        *,
        task: str,
        model: str,
        defense: str,
        seed: int,
        name: str,
        value: float | None,
        details: dict,
    ) -> None:
        """Record a formal guarantee (e.g. name="epsilon"). Writing the same key
        again updates value/details if they changed, else does nothing.
        NaN is stored as None; inf (no guarantee) is kept."""
        val = _optional_float(value, f"guarantee {name!r} value")
        details_json = _dumps(details, f"guarantee {name!r} details")
        seed = _int(seed, "guarantee seed")
        action = f"write guarantee {name!r}"

        def attempt() -> None:
            with self._write(action) as s:
                self._require_run(s, run_id)
                row = s.scalars(
                    select(Guarantee).where(
                        Guarantee.run_id == run_id, Guarantee.task == task, Guarantee.model == model,
                        Guarantee.defense == defense, Guarantee.seed == seed, Guarantee.name == name,
                    )
                ).one_or_none()
                if row is None:
                    s.add(Guarantee(run_id=run_id, task=task, model=model, defense=defense, seed=seed,
                                    name=name, value=val, details_json=details_json))
                else:
                    if row.value != val:
                        row.value = val
                    if row.details_json != details_json:
                        row.details_json = details_json

        self._retry_conflict(attempt, action)

    def guarantee_rows(self, run_id: int) -> list[dict]:
        """Guarantee rows of a run: run, task, model, defense, seed, name, value, details."""
        with self._read("read guarantees") as s:
            self._require_run(s, run_id)
            rows = s.scalars(
                select(Guarantee)
                .where(Guarantee.run_id == run_id)
                .order_by(Guarantee.task, Guarantee.model, Guarantee.defense, Guarantee.seed, Guarantee.name)
            ).all()
            return [
                {"run": g.run_id, "task": g.task, "model": g.model, "defense": g.defense, "seed": g.seed,
                 "name": g.name, "value": g.value, "details": _loads(g.details_json)}
                for g in rows
            ]

    # -------------------------------------------------------- misc

    def count_rows(self) -> dict[str, int]:
        """Number of rows in each table."""
        with self._read("count rows") as s:
            return {name: int(s.scalar(select(func.count()).select_from(model)) or 0)
                    for name, model in _TABLES.items()}
