"""Tests for the privbench CLI's error handling: one-line errors, non-zero exits, nothing half-written.

Every case calls ``bench.cli.main`` in process: the console script ``privbench`` and ``python -m bench``
are exactly ``bench.cli:main`` (each subprocess costs seconds of torch import; the real
``python -m bench`` is exercised once, in test_registry.py's entry-point test). No test here gets
as far as training: every ``run`` fails while loading its suite.
"""

from __future__ import annotations

import json

import pytest
import yaml

from bench.cli import main
from bench.store import Store
from bench.suite import SUITE_DIR

ATTACKS = {"loss", "zlib", "min_k", "min_k_pp", "reference"}


@pytest.fixture
def cwd(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # a stray default results.db would land here, not in the repo
    return tmp_path


def call(capsys, *argv):
    rc = main(list(argv))
    out, err = capsys.readouterr()
    return rc, out, err


def assert_one_line_error(rc, err, *words):
    assert rc != 0
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1, err
    assert lines[0].startswith("error: "), err
    assert "Traceback" not in err
    for w in words:
        assert w in lines[0], (w, lines[0])


def assert_no_complete_run(db_path):
    if not db_path.exists():
        return
    with Store(f"sqlite:///{db_path}", create=False) as store:
        assert all(r["status"] != "complete" for r in store.list_runs())


def smoke_text(**changes) -> str:
    raw = yaml.safe_load((SUITE_DIR / "smoke.yaml").read_text())
    raw.update(changes)
    return yaml.safe_dump(raw, sort_keys=False)


# ---------------------------------------------------------------------------------------- help

def test_help_lists_commands(cwd, capsys):
    rc, out, err = call(capsys, "--help")
    assert rc == 0, err
    for word in ("Usage", "run ", "list ", "show ", "privbench run --suite quick"):
        assert word in out
    assert not list(cwd.iterdir())  # --help writes nothing


def test_help_of_each_command(cwd, capsys):
    for command, option in (("run", "--suite"), ("list", "--format"), ("show", "--db")):
        rc, out, _ = call(capsys, command, "--help")
        assert rc == 0 and option in out, (command, out)


# ---------------------------------------------------------------------------------------- run

def test_run_unknown_suite(cwd, capsys):
    db = cwd / "r.db"
    rc, out, err = call(capsys, "run", "--suite", "smok", "--db", f"sqlite:///{db}")
    assert_one_line_error(rc, err, "unknown suite 'smok'", "did you mean 'smoke'")
    assert rc == 2 and out == ""
    assert not db.exists()
    assert not (cwd / "results.db").exists()


def test_run_missing_suite_file(cwd, capsys):
    db = cwd / "r.db"
    rc, _, err = call(capsys, "run", "--suite", str(cwd / "nope.yaml"), "--db", f"sqlite:///{db}")
    assert_one_line_error(rc, err, "not found")
    assert_no_complete_run(db)


def test_run_malformed_suite_file(cwd, capsys):
    db = cwd / "r.db"
    bad = cwd / "bad.yaml"
    bad.write_text("name: bad\nseeds: [0, 1\nattacks: [loss]\n")
    rc, _, err = call(capsys, "run", "--suite", str(bad), "--db", f"sqlite:///{db}")
    assert_one_line_error(rc, err, "not valid YAML", "line 3")
    assert_no_complete_run(db)
    assert not db.exists()


def test_run_unknown_attack_in_suite(cwd, capsys):
    db = cwd / "r.db"
    suite = cwd / "typo.yaml"
    suite.write_text(smoke_text(attacks=["loss", "min_kk"]))
    rc, _, err = call(capsys, "run", "--suite", str(suite), "--db", f"sqlite:///{db}", "--quiet")
    assert_one_line_error(rc, err, "unknown attack 'min_kk'", "did you mean 'min_k'")
    assert_no_complete_run(db)


def test_run_bad_param_in_suite_with_existing_db(cwd, capsys):
    """With a database that already exists, a bad suite adds no run to it."""
    db = cwd / "r.db"
    with Store(f"sqlite:///{db}") as store:
        assert store.list_runs() == []
    suite = cwd / "bad_param.yaml"
    suite.write_text(smoke_text(defenses=[{"name": "lora", "params": {"rank": "eight"}}]))
    rc, _, err = call(capsys, "run", "--suite", str(suite), "--db", f"sqlite:///{db}")
    assert_one_line_error(rc, err, "lora")
    with Store(f"sqlite:///{db}", create=False) as store:
        assert store.list_runs() == []


@pytest.mark.parametrize("argv", [("run",), ("show", "--bogus")])
def test_usage_errors_are_reported_without_traceback(cwd, capsys, argv):
    rc, _, err = call(capsys, *argv)
    assert rc == 2
    assert ("--suite" if argv == ("run",) else "--bogus") in err and "Traceback" not in err


def test_run_non_mapping_world_is_a_one_line_error(cwd, capsys):
    suite = cwd / "world.yaml"
    suite.write_text(smoke_text(world=[1, 2]))
    rc, _, err = call(capsys, "run", "--suite", str(suite), "--db", f"sqlite:///{cwd / 'r.db'}")
    assert_one_line_error(rc, err, "world")


# ---------------------------------------------------------------------------------------- show

def _db_with_a_run(path):
    with Store(f"sqlite:///{path}") as store:
        run_id, status = store.begin_run(run_key="k" * 16, suite="demo", config={"name": "demo"}, config_hash="h",
                                         code_version="0", plugin_versions={}, seeds=[0], hardware={})
    assert status == "new"
    return run_id


def test_show_nonexistent_db(cwd, capsys):
    db = cwd / "missing.db"
    rc, out, err = call(capsys, "show", "--db", f"sqlite:///{db}")
    assert_one_line_error(rc, err, "no results database")
    assert out == ""
    assert not db.exists()  # show never creates a database


def test_show_empty_db(cwd, capsys):
    db = cwd / "empty.db"
    Store(f"sqlite:///{db}").close()
    rc, _, err = call(capsys, "show", "--db", f"sqlite:///{db}")
    assert_one_line_error(rc, err, "no runs")


def test_show_default_db_in_empty_dir(cwd, capsys):
    rc, _, err = call(capsys, "show")
    assert_one_line_error(rc, err, "results.db")
    assert not (cwd / "results.db").exists()


def test_show_unknown_run(cwd, capsys):
    db = cwd / "one.db"
    _db_with_a_run(db)
    rc, _, err = call(capsys, "show", "999", "--db", f"sqlite:///{db}")
    assert_one_line_error(rc, err, "999")


def test_show_unknown_format(cwd, capsys):
    db = cwd / "one.db"
    run_id = _db_with_a_run(db)
    # the run exists, so the only thing wrong is the format
    rc, out, err = call(capsys, "show", str(run_id), "--db", f"sqlite:///{db}", "--format", "json")
    assert rc == 0 and json.loads(out) == []
    rc, _, err = call(capsys, "show", str(run_id), "--db", f"sqlite:///{db}", "--format", "xml")
    assert_one_line_error(rc, err, "xml")
    rc, _, err = call(capsys, "show", "--list", "--db", f"sqlite:///{db}", "--format", "xml")
    assert_one_line_error(rc, err, "xml")


# ---------------------------------------------------------------------------------------- list

def test_list_attacks_json(cwd, capsys):
    rc, out, err = call(capsys, "list", "attacks", "--format", "json")
    assert rc == 0, err
    data = json.loads(out)
    assert list(data) == ["attacks"]
    by_name = {a["name"]: a for a in data["attacks"]}
    assert ATTACKS <= set(by_name)
    for name in ATTACKS:
        a = by_name[name]
        assert a["version"] and isinstance(a["params"], list) and a["origin"] == "builtin"
        assert "token_logprobs" in a["requires"]
    assert [p["name"] for p in by_name["min_k"]["params"]] == ["k"]
    assert by_name["min_k"]["params"][0]["default"] == 0.2
    assert {p["name"] for p in by_name["reference"]["params"]} == {"calibrate_with", "mode"}
    assert by_name["loss"]["params"] == []


def test_list_all_json_has_every_kind(cwd, capsys):
    rc, out, _ = call(capsys, "list", "--format", "json")
    assert rc == 0
    data = json.loads(out)
    assert set(data) == {"attacks", "defenses", "tasks", "games", "models", "suites"}
    assert len(data["games"]) == 9 and {"name": "smoke"} in data["suites"]


def test_list_errors(cwd, capsys):
    rc, _, err = call(capsys, "list", "widgets")
    assert_one_line_error(rc, err, "widgets")
    rc, _, err = call(capsys, "list", "attacks", "--format", "xml")
    assert_one_line_error(rc, err, "xml")


def test_help_and_show_answer_without_importing_torch(tmp_path):
    """`privbench --help` and `privbench show` read no model, so they must not pay torch's import (seconds on
    these machines): the allocator tuning every command starts with lives in a module without torch."""
    import shutil
    import subprocess
    import sys
    from pathlib import Path

    db = tmp_path / "smoke.db"
    shutil.copy(Path(__file__).parent / "baselines" / "smoke.db", db)
    probe = ("import contextlib, io, sys; from bench.cli import main\n"
             "with contextlib.redirect_stdout(io.StringIO()) as helped: rcs = [main(['--help'])]\n"
             "rcs.append(main(['show', '--db', sys.argv[1], '--format', 'json']))\n"
             "print(rcs, 'Usage' in helped.getvalue(), 'torch' in sys.modules, file=sys.stderr)")
    proc = subprocess.run([sys.executable, "-c", probe, f"sqlite:///{db}"], capture_output=True, text=True,
                          timeout=120, cwd=tmp_path)
    assert proc.stderr.strip().splitlines()[-1] == "[0, 0] True False", proc.stderr[-2000:]
    assert json.loads(proc.stdout)  # show printed the stored rows
