"""`privbench board export` on bad input: one "error: " line naming the problem and the fix, exit 2, and nothing
lost or half-written: the database file and the --out folder hold exactly the bytes they held before.

Every case calls ``bench.cli.main`` in process (as tests/test_cli_errors.py does) on a copy of one small database
of runs on tracks (tests/boards.py), written once per module.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import sqlite3
from pathlib import Path

import pytest

from bench.cli import main
from tests.boards import populate_tracks

PASSWORD = "s3cr3tPW"


@pytest.fixture(scope="module")
def tracks_file(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("tracks") / "tracks.db"
    populate_tracks(path)  # closed: the WAL is checkpointed, the file alone holds every row
    return path


@pytest.fixture
def db(tracks_file, tmp_path) -> Path:
    """A fresh copy of the database, in a folder of its own (its -wal/-shm files land there, not in --out)."""
    path = tmp_path / "db" / "results.db"
    path.parent.mkdir()
    shutil.copyfile(tracks_file, path)
    return path


def call(capsys, *argv: str) -> tuple[int, str, str]:
    rc = main(list(argv))
    out, err = capsys.readouterr()
    return rc, out, err


def one_error_line(rc: int, err: str, *words: str) -> str:
    assert rc == 2, (rc, err)
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1, err
    assert lines[0].startswith("error: ") and "Traceback" not in err, err
    assert "internal error" not in lines[0], err
    for w in words:
        assert w in lines[0], (w, lines[0])
    return lines[0]


def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def tree(root: Path) -> dict[str, str]:
    """Every entry under ``root``: files by content, folders and links as such (nothing followed)."""
    if not os.path.lexists(root):
        return {}
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            p = Path(dirpath) / name
            rel = str(p.relative_to(root))
            out[rel] = ("link " + os.readlink(p)) if p.is_symlink() else "dir" if p.is_dir() else sha(p)
    return out


def earlier_board(out: Path) -> None:
    """What an earlier export (and the user) left in --out: pages this export replaces or removes, and the user's
    own files, which stay."""
    (out / "specs").mkdir(parents=True)
    (out / "defense").mkdir()
    (out / "index.html").write_text("earlier index")
    (out / "board.json").write_text("{}")
    (out / "specs" / "quick.vl.json").write_text("earlier spec")
    (out / "specs" / "stale.vl.json").write_text("stale spec")
    (out / "specs" / "README.txt").write_text("the user's")
    (out / "defense" / "stale.html").write_text("stale page")
    (out / "notes.txt").write_text("the user's")


def export(capsys, out: Path, db: str | Path) -> tuple[int, str, str]:
    return call(capsys, "board", "export", "--out", str(out), "--db", str(db))


# ------------------------------------------------------------------ 1: the database is never written over

@pytest.mark.parametrize("where", ["board.json", "index.html", "specs/quick.vl.json", "defense/0a1b2c.html",
                                   "specs/results.db", "defense/old/results.db"])
def test_a_database_where_the_board_writes_is_refused(capsys, tracks_file, tmp_path, where):
    out = tmp_path / "site"
    dbfile = out / where
    dbfile.parent.mkdir(parents=True)
    shutil.copyfile(tracks_file, dbfile)
    before, digest = tree(out), sha(dbfile)
    for ref in (str(dbfile), f"sqlite:///{dbfile}"):
        rc, _, err = export(capsys, out, ref)
        one_error_line(rc, err, str(dbfile), "give another --out")
        assert sha(dbfile) == digest and tree(out) == before


def test_a_hard_link_to_the_database_in_the_board_is_refused(capsys, db, tmp_path):
    out = tmp_path / "site"
    out.mkdir()
    os.link(db, out / "index.html")  # the old export truncated index.html: the database's bytes
    before, digest = tree(out), sha(db)
    rc, _, err = export(capsys, out, db)
    one_error_line(rc, err, "would overwrite the database", "give another --out")
    assert sha(db) == digest and tree(out) == before


def test_a_database_beside_the_board_is_read_and_kept(capsys, tracks_file, tmp_path):
    out = tmp_path / "site"
    earlier_board(out)
    dbfile = out / "results.db"
    shutil.copyfile(tracks_file, dbfile)
    digest = sha(dbfile)
    rc, stdout, err = export(capsys, out, dbfile)
    assert rc == 0, err
    assert sha(dbfile) == digest
    assert (out / "notes.txt").read_text() == "the user's" == (out / "specs" / "README.txt").read_text()


# ------------------------------------------------------------------ 2: all or nothing

def test_a_directory_named_index_html_is_refused_before_anything_is_written(capsys, db, tmp_path):
    out = tmp_path / "idxdir"
    (out / "index.html").mkdir(parents=True)
    before = tree(out)
    rc, _, err = export(capsys, out, f"sqlite:///{db}")
    one_error_line(rc, err, f"{out}/index.html is a directory", "move or remove that directory")
    assert tree(out) == before  # no specs/ or defense/ pages written


def test_a_file_named_defense_is_refused_before_anything_is_deleted(capsys, db, tmp_path):
    out = tmp_path / "deffile"
    (out / "specs").mkdir(parents=True)
    (out / "specs" / "old.vl.json").write_text("keep\n")
    (out / "defense").touch()
    before = tree(out)
    rc, _, err = export(capsys, out, f"sqlite:///{db}")
    one_error_line(rc, err, f"{out}/defense is a file", "move or remove that file")
    assert tree(out) == before  # specs/old.vl.json is still there


def test_a_failure_while_building_leaves_out_as_it_was(capsys, db, tmp_path, monkeypatch):
    import leaderboard.export as export_module
    out = tmp_path / "site"
    earlier_board(out)
    before, siblings = tree(out), sorted(os.listdir(tmp_path))
    calls = []

    def full_disk(*args, **kwargs):
        calls.append(1)
        if len(calls) > 3:  # some pages are written by then
            raise OSError(28, "No space left on device")
        return real(*args, **kwargs)

    real = export_module._defense_page
    monkeypatch.setattr(export_module, "_defense_page", full_disk)
    rc, _, err = export(capsys, out, db)
    one_error_line(rc, err, f"cannot write the board into {out} (No space left on device)")
    assert tree(out) == before
    assert sorted(os.listdir(tmp_path)) == siblings  # no temporary directory left behind


def test_a_failure_while_moving_the_board_in_is_rolled_back(capsys, db, tmp_path, monkeypatch):
    out = tmp_path / "site"
    earlier_board(out)
    before, siblings = tree(out), sorted(os.listdir(tmp_path))
    real = os.rename

    def refuse_index(src, dst, *args, **kwargs):
        if Path(dst) == out / "index.html" and Path(src).parent.name == "new":  # the new index.html, moved in
            raise PermissionError(13, "Permission denied")  # last: every other page is in place by then
        return real(src, dst, *args, **kwargs)

    monkeypatch.setattr(os, "rename", refuse_index)
    rc, _, err = export(capsys, out, db)
    one_error_line(rc, err, f"cannot write the board into {out} (Permission denied)")
    assert tree(out) == before
    assert sorted(os.listdir(tmp_path)) == siblings


def test_a_new_out_is_not_left_half_made(capsys, db, tmp_path, monkeypatch):
    real = os.rename

    def refuse_index(src, dst, *args, **kwargs):
        if Path(dst).name == "index.html" and Path(src).parent.name == "new":
            raise PermissionError(13, "Permission denied")
        return real(src, dst, *args, **kwargs)

    monkeypatch.setattr(os, "rename", refuse_index)
    rc, _, err = export(capsys, tmp_path / "a" / "b" / "site", db)
    one_error_line(rc, err, "cannot write the board into", "Permission denied")
    assert sorted(os.listdir(tmp_path)) == ["db"]  # neither site nor the folders made for it


def test_an_export_replaces_its_own_pages_only(capsys, db, tmp_path):
    out = tmp_path / "site"
    earlier_board(out)
    siblings = sorted(os.listdir(tmp_path))
    rc, _, err = export(capsys, out, db)
    assert rc == 0, err
    assert not (out / "specs" / "stale.vl.json").exists() and not (out / "defense" / "stale.html").exists()
    assert (out / "specs" / "quick.vl.json").read_text().startswith("{")
    assert (out / "index.html").read_text().startswith("<!DOCTYPE html>")
    assert (out / "notes.txt").read_text() == "the user's" == (out / "specs" / "README.txt").read_text()
    assert len(list((out / "defense").glob("*.html"))) == 15
    assert sorted(os.listdir(tmp_path)) == siblings


def test_a_folder_in_a_parent_it_cannot_write_is_built_inside_it(capsys, db, tmp_path, monkeypatch):
    """--out /srv/board (or .) where only the folder itself is the user's: the board is built inside it."""
    import tempfile
    out = tmp_path / "site"
    earlier_board(out)
    real = tempfile.mkdtemp

    def read_only_parent(*args, dir=None, **kwargs):
        if Path(dir) == tmp_path:
            raise PermissionError(13, "Permission denied")
        return real(*args, dir=dir, **kwargs)

    monkeypatch.setattr(tempfile, "mkdtemp", read_only_parent)
    rc, _, err = export(capsys, out, db)
    assert rc == 0, err
    assert sorted(p.name for p in out.iterdir()) == ["board.json", "defense", "index.html", "notes.txt", "specs"]
    assert not (out / "defense" / "stale.html").exists()


# ------------------------------------------------------------------ 3, 4: the database URL

def test_a_password_in_a_malformed_url_is_masked(capsys, tmp_path):
    url = f"postgresql://u:{PASSWORD}@db.example:notaport/x"
    rc, stdout, err = export(capsys, tmp_path / "o", url)
    one_error_line(rc, err, "malformed database URL", "u:***@db.example")
    assert PASSWORD not in stdout + err
    assert not (tmp_path / "o").exists()


def test_the_leaderboard_masks_passwords_as_the_store_does():
    """leaderboard/ imports nothing of bench (test_leaderboard.py checks it), so it masks on its own: the same
    way as the store's display URL (SQLAlchemy's rendering) and, for a URL that does not parse, _mask_password."""
    from sqlalchemy.engine import make_url

    from bench.store import _mask_password
    from leaderboard.queries import LeaderboardError, read_only_engine, shown_url
    with pytest.raises(LeaderboardError) as exc:
        read_only_engine(f"postgresql://u:{PASSWORD}@db.example:notaport/x")
    assert PASSWORD not in str(exc.value) and "u:***@db.example:notaport/x" in str(exc.value)
    unparsable = [f"postgresql://u:{PASSWORD}@db.example:notaport/x", f"mysql://me:{PASSWORD}@h:port/d",
                  f"postgresql://:{PASSWORD}@h:x/d"]
    for url in unparsable:
        assert shown_url(url) == _mask_password(url) and PASSWORD not in shown_url(url), url
    for url in (f"postgresql+psycopg://u:{PASSWORD}@h/x?sslmode=require", f"mysql://me:{PASSWORD}@h:3306/d",
                "postgresql://u@h/x", "sqlite:///a/b.db"):
        assert shown_url(url) == make_url(url).render_as_string(hide_password=True), url
        assert PASSWORD not in shown_url(url)
    assert shown_url("results.db") == "results.db"


@pytest.mark.parametrize("url", ["notadialect://x", "sqlite://x.db", "mysql://u:p@127.0.0.1:1/x"])
def test_a_bad_url_gets_the_message_show_gives(capsys, tmp_path, url, monkeypatch):
    monkeypatch.chdir(tmp_path)
    rc, _, err = export(capsys, tmp_path / "o", url)
    line = one_error_line(rc, err)
    rc_show, _, err_show = call(capsys, "show", "--db", url)
    assert rc_show == 2 and err_show.strip() == line
    assert sorted(os.listdir(tmp_path)) == []  # no board, no stray database


# ------------------------------------------------------------------ 5, 6, 7: the database's content

def _damage_metrics(path: Path) -> None:
    """Overwrite the root page of the metrics table: the schema reads fine, the metric rows do not."""
    con = sqlite3.connect(path)
    try:
        page_size = con.execute("PRAGMA page_size").fetchone()[0]
        root = con.execute("SELECT rootpage FROM sqlite_master WHERE name = 'metrics'").fetchone()[0]
    finally:
        con.close()
    with open(path, "r+b") as f:
        f.seek((root - 1) * page_size)
        f.write(b"\xff" * page_size)


def test_a_damaged_file_is_said_to_be_damaged(capsys, db, tmp_path):
    _damage_metrics(db)
    out = tmp_path / "site"
    earlier_board(out)
    before, digest = tree(out), sha(db)
    rc, _, err = export(capsys, out, db)
    line = one_error_line(rc, err, f"sqlite:///{db} is damaged", "database disk image is malformed",
                          "restore it from a copy")
    assert sha(db) == digest and tree(out) == before
    rc_show, _, err_show = call(capsys, "show", "--db", str(db))  # the same words as `show`
    assert rc_show == 2 and err_show.split(";")[0] == line.split(";")[0]


def test_text_in_a_metric_value_is_named(capsys, db, tmp_path):
    con = sqlite3.connect(db)
    con.execute("UPDATE metrics SET value = 'abc' WHERE id = (SELECT MIN(id) FROM metrics)")
    con.commit()
    con.close()
    out = tmp_path / "site"
    earlier_board(out)
    before, digest = tree(out), sha(db)
    rc, _, err = export(capsys, out, db)
    one_error_line(rc, err, f"sqlite:///{db}", "not a number in table metrics", "'abc'",
                   "restore the database from a copy")
    assert sha(db) == digest and tree(out) == before


def _unversioned(path: Path) -> None:
    con = sqlite3.connect(path)
    con.execute("DROP TABLE alembic_version")
    con.commit()
    con.close()


def test_an_unversioned_database_names_itself_in_the_upgrade_command(capsys, db, tmp_path):
    _unversioned(db)
    digest = sha(db)
    rc, _, err = export(capsys, tmp_path / "o", db)
    line = one_error_line(rc, err, f"run `privbench db upgrade --db sqlite:///{db}`")
    assert "PATH" not in line and sha(db) == digest and not (tmp_path / "o").exists()

