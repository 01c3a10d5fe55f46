"""`privbench board show` and `privbench show RUN --summary`: the leaderboard's ranked tables in the terminal.

They must print what the app's first screen shows, cell for cell (both read ``leaderboard.board``), and a run's
summary must rank that run's configurations alone, whether or not it finished.
"""

from __future__ import annotations

import csv
import io
import json
import shutil
from pathlib import Path

import pytest

from bench.cli import main
from leaderboard.aggregate import DISPLAY_COLUMNS
from tests.boards import HOSTILE, TRACK_ORDER, board_of, populate_tracks


@pytest.fixture(scope="module")
def tracks_file(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("show") / "tracks.db"
    populate_tracks(path)
    return path


@pytest.fixture
def db(tracks_file, tmp_path) -> Path:
    path = tmp_path / "results.db"
    shutil.copyfile(tracks_file, path)
    return path


def call(capsys, *argv: str) -> tuple[int, str, str]:
    rc = main(list(argv))
    out, err = capsys.readouterr()
    return rc, out, err


def test_board_show_prints_every_group_as_the_app_ranks_it(db, capsys):
    board = board_of(db)
    rc, out, err = call(capsys, "board", "show", "--db", str(db), "--format", "json")
    assert rc == 0, err
    rows = json.loads(out)
    assert [r["group"] for r in rows] == [n for n in board.names for _ in range(len(board.groups[n].display))]
    for name in board.names:
        mine = [{c: r[c] for c in DISPLAY_COLUMNS} for r in rows if r["group"] == name]
        assert mine == board.groups[name].display.to_dict("records")  # cell for cell, in rank order
    quick = [r for r in rows if r["group"] == "quick"]
    assert [r["defense"].split(" ")[0] for r in quick][:5] == [d for d in TRACK_ORDER][:5]
    assert all(r["kind"] == "track" and r["game"] == "adapt" for r in quick)
    # the table names each group with its headline game, and the ranking rule once
    rc, out, _ = call(capsys, "board", "show", "--db", str(db))
    assert rc == 0
    assert out.count("(track) · headline game adapt") == sum(board.groups[n].kind == "track" for n in board.names)
    assert out.count("Ranking rule:") == 1
    assert HOSTILE in out  # plain text: a label is printed as stored, nothing interprets it


def test_board_show_one_group_and_csv(db, capsys):
    rc, out, err = call(capsys, "board", "show", "canaries", "--db", str(db), "--format", "csv")
    assert rc == 0, err
    rows = list(csv.DictReader(io.StringIO(out)))
    assert {r["group"] for r in rows} == {"canaries"}
    assert [r["rank"] for r in rows] == board_of(db).groups["canaries"].display["rank"].tolist()


def test_board_show_unknown_group_names_the_groups(db, capsys):
    rc, _, err = call(capsys, "board", "show", "qick", "--db", str(db))
    assert rc == 2 and err.startswith("error: no group 'qick'") and "quick" in err and "canaries" in err, err
    rc, _, err = call(capsys, "board", "show", "--db", str(db), "--format", "yaml")
    assert rc == 2 and "unknown format" in err, err
    rc, _, err = call(capsys, "board", "show", "--db", str(db.parent / "missing.db"))
    assert rc == 2 and err.startswith("error: ") and "Traceback" not in err, err


def test_summary_ranks_one_runs_configurations(db, capsys):
    """The `adhoc` run holds finetune and weak, one seed: its summary ranks those two and nothing of the other
    runs (`quick` has a `weak` too, with other numbers)."""
    rc, out, err = call(capsys, "show", "adhoc", "--summary", "--db", str(db), "--format", "json")
    assert rc == 0, err
    rows = json.loads(out)
    assert {r["group"] for r in rows} == {"adhoc"}
    assert sorted(r["defense"].split(" ")[0] for r in rows) == ["finetune", "weak"]
    assert {r["seeds"] for r in rows} == {"1"}
    board = board_of(db)  # the same cells as the board's group of that run
    assert [{c: r[c] for c in DISPLAY_COLUMNS} for r in rows] == board.groups["adhoc"].display.to_dict("records")


def test_summary_of_a_failed_run_is_refused_with_what_to_do(db, capsys):
    rc, out, err = call(capsys, "show", "broken", "--summary", "--db", str(db))
    assert rc == 2 and out == ""
    assert err.startswith("error: run 5 is failed (rerunning its command completes it)") and "privbench show 5" in err, err


def test_summary_without_a_run_takes_the_latest_complete_one(db, capsys):
    """The fixture's latest runs (5, 6) failed: the summary skips them for the latest complete run (4, adhoc)."""
    rc, out, err = call(capsys, "show", "--summary", "--db", str(db), "--format", "json")
    assert rc == 0, err
    assert {r["group"] for r in json.loads(out)} == {"adhoc"}
    rc, _, err = call(capsys, "show", "--summary", "--db", str(db), "--format", "yaml")
    assert rc == 2 and "unknown format 'yaml'" in err, err


def test_summary_refuses_other_views(db, capsys):
    rc, _, err = call(capsys, "show", "--summary", "--utility", "--db", str(db))
    assert rc == 2 and "--utility and --summary" in err, err
    rc, _, err = call(capsys, "show", "--list", "--summary", "--db", str(db))
    assert rc == 2 and "takes no --summary" in err, err
