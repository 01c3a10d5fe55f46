"""A real PostgreSQL server for the store's tests, from the Debian ``postgresql`` package.

The server is initialised into a temporary directory, listens only on a Unix socket in that directory (no TCP
port, nothing reachable from outside) and is stopped when the test session ends. As root it runs as the
``postgres`` system user (PostgreSQL refuses to run as root). Without the binaries the tests that need it are
skipped with the reason, except under ``CI=true``, where a missing server fails them: CI must test PostgreSQL.

Roles: ``privbench`` (trusted over the socket, owns every test database) and ``intruder`` (password
``right``, scram-sha-256), for the unauthorised-URL test.
"""

from __future__ import annotations

import glob
import importlib.util
import itertools
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

USER = "privbench"
INTRUDER, INTRUDER_PASSWORD = "intruder", "right"


def _bin_dir() -> Path | None:
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"), key=lambda p: int(p.split("/")[4]))
    return Path(found[-1]).parent if found else None


def require_binaries() -> Path:
    """The PostgreSQL bin directory; skip (fail under CI=true) when the package is not installed."""
    bindir = _bin_dir()
    reason = "PostgreSQL server binaries not found under /usr/lib/postgresql/*/bin: apt-get install postgresql"
    if bindir is None:
        if os.environ.get("CI") == "true":
            pytest.fail(reason + " (CI=true: PostgreSQL tests must run)")
        pytest.skip(reason)
    if importlib.util.find_spec("psycopg") is None:
        msg = "the psycopg driver is not installed: pip install 'privbench[postgres]'"
        if os.environ.get("CI") == "true":
            pytest.fail(msg)
        pytest.skip(msg)
    return bindir


class PostgresServer:
    """One server in a temporary directory; :meth:`new_database` gives each test an empty database."""

    def __init__(self, bindir: Path) -> None:
        self.bindir = bindir
        self.root = Path(tempfile.mkdtemp(prefix="pbpg-"))  # short: a socket path has at most 107 bytes
        self.data = self.root / "data"
        self.as_postgres = os.geteuid() == 0
        os.chmod(self.root, 0o777 if self.as_postgres else 0o700)
        self._count = itertools.count()
        self.port = 5432

    def _run(self, *cmd: str, **kw) -> subprocess.CompletedProcess:
        full = [str(c) for c in cmd]
        if self.as_postgres:
            full = ["runuser", "-u", "postgres", "--", *full]
        return subprocess.run(full, check=True, capture_output=True, text=True, **kw)

    def start(self) -> None:
        pwfile = self.root / "pw"
        pwfile.write_text("unused\n")
        os.chmod(pwfile, 0o644)
        self._run(self.bindir / "initdb", "-D", self.data, "-U", USER, "--auth-local=trust", "--auth-host=reject",
                  "--pwfile", pwfile, "-E", "UTF8", "--locale=C.UTF-8")
        pwfile.unlink()
        hba = self.data / "pg_hba.conf"
        hba.write_text(f"local all {USER} trust\nlocal all all scram-sha-256\n")  # root keeps postgres' owner
        opts = f"-k {self.root} -c listen_addresses='' -p {self.port} -c max_connections=50 -c fsync=off"
        self._run(self.bindir / "pg_ctl", "-D", self.data, "-l", self.root / "log", "-w", "-t", "60", "-o", opts,
                  "start")
        self.sql(f"CREATE ROLE {INTRUDER} LOGIN PASSWORD '{INTRUDER_PASSWORD}'")

    def stop(self) -> None:
        try:
            self._run(self.bindir / "pg_ctl", "-D", self.data, "-m", "immediate", "-w", "stop")
        except subprocess.CalledProcessError:
            pass
        shutil.rmtree(self.root, ignore_errors=True)

    def url(self, database: str = "postgres", user: str = USER, password: str | None = None) -> str:
        auth = user if password is None else f"{user}:{password}"
        return f"postgresql+psycopg://{auth}@/{database}?host={self.root}&port={self.port}"

    def sql(self, statement: str, database: str = "postgres") -> list[tuple]:
        import psycopg
        with psycopg.connect(host=str(self.root), port=self.port, user=USER, dbname=database,
                             autocommit=True) as conn:
            cur = conn.execute(statement)
            return cur.fetchall() if cur.description else []

    def new_database(self) -> str:
        """An empty database owned by ``privbench``; its SQLAlchemy URL."""
        name = f"t{os.getpid()}_{next(self._count)}"
        self.sql(f"CREATE DATABASE {name}")
        return self.url(name)
