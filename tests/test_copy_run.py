"""scripts/copy_run.py moves a whole run between SQLite results databases: every row, nothing else, or nothing."""

from __future__ import annotations

import shutil
import sqlite3
import sys
from pathlib import Path

import pytest

from bench.store import Store
from db_snapshot import integrity_problems, snapshot

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
from copy_run import copy_run  # noqa: E402

BASELINE = Path(__file__).resolve().parent / "baselines" / "smoke.db"


def _empty(path: Path) -> Path:
    Store(f"sqlite:///{path}").close()
    return path


def test_a_copied_run_has_every_row_of_the_original(tmp_path):
    src = tmp_path / "src.db"
    shutil.copy(BASELINE, src)
    dst = _empty(tmp_path / "dst.db")
    (run_id,) = sqlite3.connect(src).execute("SELECT id FROM runs WHERE status = 'complete'").fetchone()
    copy_run(str(src), run_id, str(dst))
    assert snapshot(dst) == snapshot(src)
    assert integrity_problems(dst) == []
    # copied twice with --replace-suite: still one run, the same rows
    copy_run(str(src), run_id, str(dst), replace_suite=True)
    assert snapshot(dst) == snapshot(src)


def test_a_failed_copy_leaves_the_destination_unchanged(tmp_path):
    src = tmp_path / "src.db"
    shutil.copy(BASELINE, src)
    dst = _empty(tmp_path / "dst.db")
    with pytest.raises(SystemExit, match="has no run 999"):
        copy_run(str(src), 999, str(dst))
    con = sqlite3.connect(src)
    con.execute("UPDATE runs SET status = 'failed'")
    con.commit()
    con.close()
    with pytest.raises(SystemExit, match="not complete"):
        copy_run(str(src), 1, str(dst))
    assert sqlite3.connect(dst).execute("SELECT COUNT(*) FROM runs").fetchone() == (0,)
