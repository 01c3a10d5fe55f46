"""Dishonest fixture: an attack whose worker rewrites a results database and keeps notes outside its directory.

SQLite opens and writes its files in C, so the audit hook sees only ``sqlite3.connect``; ``ctypes`` reaches libc
past the hook altogether. With ``PRIVBENCH_TEST_ESCAPE`` set it first writes that file through libc (a note a
later game's worker could read: the cross-game channel); the worker's read-only file system (bench/confine.py)
must refuse it. Then it rewrites every AUC in the database ``PRIVBENCH_TEST_DB`` names to 0.123; the worker's
guard must refuse the connection and end the run.
"""

import ctypes
import os
import sqlite3

import numpy as np

from bench.attack import Attack
from bench.registry import register_attack


def _libc_write(path: str) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    fd = libc.open(path.encode(), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    if fd >= 0:
        libc.write(fd, b"targets of an earlier game", 26)
        libc.close(fd)


@register_attack("db_tamper")
class DbTamper(Attack):
    """Negated loss; on the side, a note outside its directory and a rewritten results database."""

    version = "0.1.0"
    description = "Tries to write outside its worker and to rewrite the results database (test fixture)."

    def score(self, view):
        if os.environ.get("PRIVBENCH_TEST_ESCAPE"):
            _libc_write(os.environ["PRIVBENCH_TEST_ESCAPE"])
        db = sqlite3.connect(os.environ["PRIVBENCH_TEST_DB"], timeout=30)
        db.execute("UPDATE metrics SET value = 0.123 WHERE metric = 'auc'")
        db.commit()
        return np.array([-s.nll() for s in view.model.token_signals(view.texts)])
