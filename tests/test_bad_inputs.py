"""The bad-input corpus (tests/bad_inputs/cases.yaml): every malformed input gets a clear one-line error, a
non-zero exit, and leaves the results database as it was.

How the cases run
-----------------
* Most cases call ``bench.cli.main(argv)`` in process and read stdout/stderr with ``capsys``: the console
  script ``privbench`` and ``python -m bench`` are exactly ``bench.cli:main`` plus ``sys.exit``, and a
  subprocess costs seconds of torch import. An exception escaping ``main`` is turned into exit 1 plus its
  traceback on stderr, as the interpreter would print it, so a crash fails the case instead of erroring it.
* Cases marked ``mode: subprocess`` run ``python -m bench <argv>`` for real: one suite case, one data case,
  the broken-plugin listing (a PYTHONPATH like a user's), the unreachable PostgreSQL URL (with a timeout, so
  a hang fails the test) and one full plugin run.
* Entry-point plugins in process: the case's plugin folders go on ``sys.path`` and the registries forget
  that they loaded their entry points (the built-ins stay registered), so the next lookup scans the
  distributions again, as a fresh process would; everything is restored afterwards.
* Every case works in its own empty working directory (which must stay empty: no stray ``results.db``), on a
  fresh copy of its category folder, with ``PRIVBENCH_CACHE`` set to one cache shared by the session: the
  plugin runs use one tiny world (a 4000-token nano model) trained once.
"""

from __future__ import annotations

import hashlib
import importlib
import os
import re
import shlex
import shutil
import sqlite3
import subprocess
import sys
import traceback
from collections import Counter
from pathlib import Path

import pytest
import yaml

HERE = Path(__file__).resolve().parent
CORPUS = HERE / "bad_inputs"
CASES_FILE = CORPUS / "cases.yaml"
CATEGORIES = {"suites": 12, "data": 8, "plugins": 5, "cli": 3, "db": 4}  # category -> minimum number of cases
KINDS = {"error", "usage", "warning"}
DB_SETUPS = {"populated", "none", "text_file", "zero_bytes", "foreign_sqlite", "future_schema", "two_revisions",
             "edited_date", "edited_json", "foreign_alembic"}
CHECKS = {"unchanged", "failed_run"}
FIELDS = {"id", "category", "cmd", "exit", "expect", "expect_re", "kind", "db", "check", "bad_attack",
          "bad_defense", "pythonpath", "absent", "mode", "timeout", "xfail", "twice"}
PASSWORD_LIKE = "s3cr3tPW"


def _load_cases() -> list[dict]:
    cases = yaml.safe_load(CASES_FILE.read_text(encoding="utf-8"))
    assert isinstance(cases, list), f"{CASES_FILE} must be a list of cases"
    return cases


CASES = _load_cases()


def _params():
    out = []
    for case in CASES:
        marks = [pytest.mark.xfail(strict=True, reason=" ".join(str(case["xfail"]).split()))] if case.get("xfail") \
            else []
        out.append(pytest.param(case, id=case["id"], marks=marks))
    return out


# ------------------------------------------------------------------------------------------ corpus shape

def test_corpus_is_well_formed():
    ids = [c.get("id") for c in CASES]
    assert all(isinstance(i, str) and i for i in ids)
    dup = [i for i, n in Counter(ids).items() if n > 1]
    assert not dup, f"duplicate case ids {dup}"
    per_category = Counter(c.get("category") for c in CASES)
    for category, minimum in CATEGORIES.items():
        assert per_category[category] >= minimum, (category, per_category[category])
    assert set(per_category) <= set(CATEGORIES), set(per_category) - set(CATEGORIES)
    assert len(CASES) >= 30
    for c in CASES:
        where = c["id"]
        assert set(c) <= FIELDS, (where, set(c) - FIELDS)
        assert isinstance(c.get("cmd"), str) and c["cmd"].strip(), where
        kind = c.get("kind", "error")
        assert kind in KINDS, where
        assert isinstance(c.get("exit"), int), where
        assert (c["exit"] == 0) == (kind == "warning"), f"{where}: only warnings exit 0"
        assert c.get("expect") or c.get("expect_re"), f"{where}: say what the message must contain"
        assert c.get("db", "populated") in DB_SETUPS, where
        assert c.get("check", "unchanged") in CHECKS, where
        assert c.get("mode", "inprocess") in ("inprocess", "subprocess"), where
        if c.get("check") == "failed_run":
            assert "--db" in c["cmd"] and c.get("db") == "none", f"{where}: a failed run needs a fresh {{db}}"


def test_every_corpus_file_belongs_to_a_case():
    """Each file under tests/bad_inputs/<category>/ is used by some case (no orphans, no typos in cases.yaml)."""
    used = set()
    for c in CASES:
        for token in shlex.split(c["cmd"]):
            for m in re.finditer(r"\{case_dir\}/([^\s=]+)", token):
                used.add(f"{c['category']}/{m.group(1)}")
        used.update(f"{c['category']}/{p}" for p in c.get("pythonpath", []))
    missing = sorted(u for u in used if not (CORPUS / u).exists() and "/no_such" not in u)
    assert not missing, f"cases name files that are not in the corpus: {missing}"
    for path in sorted(CORPUS.rglob("*")):
        rel = path.relative_to(CORPUS).as_posix()
        if path.is_dir() or rel == "cases.yaml" or "__pycache__" in rel:
            continue
        assert any(rel == u or rel.startswith(u + "/") for u in used), f"{rel} is in the corpus but no case uses it"


# ------------------------------------------------------------------------------------------ fixtures

@pytest.fixture(scope="session")
def corpus_copy(tmp_path_factory) -> Path:
    """A copy of the corpus: plugin imports and lock files never write into the repository."""
    dst = tmp_path_factory.mktemp("bad_inputs") / "corpus"
    shutil.copytree(CORPUS, dst, ignore=shutil.ignore_patterns("__pycache__"))
    return dst


@pytest.fixture(scope="session")
def shared_cache(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("privbench_cache")


@pytest.fixture(scope="session")
def populated_template(tmp_path_factory) -> Path:
    """A results database with one complete run (one evaluation, scores and a metric row), closed cleanly."""
    from bench.store import Store

    path = tmp_path_factory.mktemp("template") / "results.db"
    with Store(f"sqlite:///{path}") as store:
        run_id, _ = store.begin_run(run_key="bad-inputs-template", suite="demo", config={"name": "demo"},
                                    config_hash="h", code_version="0", plugin_versions={}, seeds=[0], hardware={})
        store.write_evaluation(
            run_id, "e1", task="mini_pile", model="nano", defense="finetune", defense_params={}, seed=0,
            game="adapt", attack="loss", attack_params={}, world_key="w", target_ids=["a", "b"], labels=[1, 0],
            scores=[0.5, 0.1], duration_s=0.1,
            metrics=[{"metric": "auc", "value": 1.0, "ci_low": 1.0, "ci_high": 1.0, "n_pos": 1, "n_neg": 1}])
        store.finish_run(run_id, status="complete", duration_s=1.0)
    for side in (".db-wal", ".db-shm"):
        assert not path.with_suffix(side).exists()
    return path


def _setup_db(kind: str, path: Path, template: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    if kind == "populated":
        shutil.copyfile(template, path)
    elif kind == "text_file":
        path.write_text("These are my notes, not a database.\nPlease do not overwrite them.\n")
    elif kind == "zero_bytes":
        path.write_bytes(b"")
    elif kind == "future_schema":  # a results database written by a newer privbench
        shutil.copyfile(template, path)
        con = sqlite3.connect(path)
        con.execute("UPDATE alembic_version SET version_num = '9999_future'")
        con.commit()
        con.close()
    elif kind == "two_revisions":  # hand-edited, or two tools' stamps in one file
        shutil.copyfile(template, path)
        con = sqlite3.connect(path)
        con.execute("INSERT INTO alembic_version (version_num) VALUES ('zzz_other')")
        con.commit()
        con.close()
    elif kind in ("edited_date", "edited_json"):  # a column changed by hand into text that does not decode
        shutil.copyfile(template, path)
        con = sqlite3.connect(path)
        con.execute("UPDATE runs SET started_at = 'yesterday'" if kind == "edited_date" else
                    "UPDATE runs SET config_json = '{not json'")
        con.commit()
        con.close()
    elif kind == "foreign_alembic":  # another tool's migrations stamped this file, and it has none of our tables
        con = sqlite3.connect(path)
        con.execute("CREATE TABLE alembic_version (version_num VARCHAR(32) NOT NULL PRIMARY KEY)")
        con.execute("INSERT INTO alembic_version VALUES ('abc123')")
        con.commit()
        con.close()
    elif kind == "foreign_sqlite":
        con = sqlite3.connect(path)  # another application's database, in the default rollback-journal mode
        con.execute("CREATE TABLE notes (id INTEGER PRIMARY KEY, body TEXT)")
        con.execute("INSERT INTO notes (body) VALUES ('keep me')")
        con.commit()
        con.close()


def _digest(path: Path) -> str | None:
    return hashlib.sha256(path.read_bytes()).hexdigest() if path.is_file() else None


# ------------------------------------------------------------------------------------------ invoking

def _in_process(argv: list[str], capsys, monkeypatch, plugin_dirs: list[Path]) -> tuple[int, str, str]:
    from bench.cli import main

    if plugin_dirs:
        from bench.registry import REGISTRIES
        for reg in REGISTRIES.values():
            reg.names()  # built-ins and installed plugins registered before we make the registries forget
            monkeypatch.setattr(reg, "_classes", dict(reg._classes))
            monkeypatch.setattr(reg, "_origin", dict(reg._origin))
            monkeypatch.setattr(reg, "load_errors", [])
            monkeypatch.setattr(reg, "_loaded", False)
        for d in plugin_dirs:
            monkeypatch.syspath_prepend(str(d))
    capsys.readouterr()
    try:
        rc = main(argv)
    except Exception:  # what `python -m bench` would show: a traceback and exit 1
        sys.stderr.write(traceback.format_exc())
        rc = 1
    finally:
        for mod in [m for m in sys.modules if m.startswith("pbbad_")]:
            sys.modules.pop(mod, None)
        importlib.invalidate_caches()
    out, err = capsys.readouterr()
    return rc, out, err


def _subprocess(argv: list[str], cwd: Path, env: dict, plugin_dirs: list[Path], timeout: float):
    env = dict(env)
    env["PYTHONPATH"] = os.pathsep.join([str(d) for d in plugin_dirs] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH")
                                                                         else []))
    try:
        proc = subprocess.run([sys.executable, "-m", "bench", *argv], cwd=cwd, env=env, capture_output=True,
                              text=True, timeout=timeout)
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"`privbench {' '.join(argv)}` did not finish in {timeout}s: {exc}")
    return proc.returncode, proc.stdout, proc.stderr


# ------------------------------------------------------------------------------------------ the cases

@pytest.mark.parametrize("case", _params())
def test_bad_input(case, tmp_path, corpus_copy, shared_cache, populated_template, capsys, monkeypatch):
    work = tmp_path / "cwd"
    scratch = tmp_path / "scratch"
    db_file = tmp_path / "db" / "results.db"
    for d in (work, scratch, db_file.parent):
        d.mkdir()
    case_dir = corpus_copy / case["category"]
    values = {"case_dir": str(case_dir), "db": f"sqlite:///{db_file}", "db_file": str(db_file), "tmp": str(scratch)}

    def fill(text: str) -> str:
        for key, value in values.items():
            text = text.replace("{" + key + "}", value)
        return text

    argv = [fill(tok) for tok in shlex.split(case["cmd"])]
    uses_db = any(k in case["cmd"] for k in ("{db}", "{db_file}"))
    setup = case.get("db", "populated" if uses_db else "none")
    _setup_db(setup, db_file, populated_template)
    before = _digest(db_file)
    plugin_dirs = [case_dir / p for p in case.get("pythonpath", [])]

    env = {"PRIVBENCH_CACHE": str(shared_cache), "PRIVBENCH_THREADS": "1", "OMP_NUM_THREADS": "1",
           "PYTHONDONTWRITEBYTECODE": "1", "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
           "TRANSFORMERS_OFFLINE": "1"}
    if case.get("mode", "inprocess") != "subprocess":
        for k, v in env.items():
            monkeypatch.setenv(k, v)
        monkeypatch.chdir(work)

    def invoke():
        if case.get("mode", "inprocess") == "subprocess":
            return _subprocess(argv, work, {**os.environ, **env}, plugin_dirs, float(case.get("timeout", 120)))
        return _in_process(argv, capsys, monkeypatch, plugin_dirs)

    if case.get("twice"):  # a first call leaves its artifacts and signals in the cache; the checked call reruns
        first = invoke()
        assert first[0] == case["exit"], f"first call: exit {first[0]}\n{first[2][-4000:]}"
        for stale in [db_file, *db_file.parent.glob(db_file.name + "-*")]:  # with SQLite's -wal and -shm files
            stale.unlink(missing_ok=True)
        _setup_db(setup, db_file, populated_template)
    rc, out, err = invoke()

    shown = f"privbench {' '.join(argv)}\n--- exit {rc}\n--- stdout\n{out[-2000:]}\n--- stderr\n{err[-4000:]}"
    assert "Traceback" not in err and "Traceback" not in out, shown
    for secret in case.get("absent", []):
        assert secret not in out and secret not in err, f"{secret!r} leaked\n{shown}"
    assert rc == case["exit"], shown

    lines = [ln for ln in err.splitlines() if ln.strip()]
    kind = case.get("kind", "error")
    if kind == "error":
        assert len(lines) == 1, f"the error must be one line\n{shown}"
        message = lines[0]
        assert message.startswith("error: "), shown
        assert out == "", shown
    elif kind == "usage":
        # click's own format (bench.cli.main calls exc.show()): "Error: <problem>", after a usage line where click
        # has the command's context; the exit code is click's 2
        assert lines and lines[-1].startswith("Error: "), shown
        assert all(ln.startswith(("Usage: privbench", "Try 'privbench", "Error: ")) for ln in lines), shown
        message = lines[-1]
    else:
        assert lines and all(ln.startswith("warning: ") for ln in lines), shown
        assert re.search(r"\bloss\b", out), f"the listing must still be printed\n{shown}"
        message = "\n".join(lines)
    for piece in case.get("expect", []):
        assert fill(piece) in message, f"expected {fill(piece)!r} in the message\n{shown}"
    if case.get("expect_re"):
        assert re.search(case["expect_re"], message), f"expected /{case['expect_re']}/\n{shown}"

    assert not list(work.iterdir()), f"the command wrote into the working directory: {list(work.iterdir())}"
    if case.get("check", "unchanged") == "unchanged":
        assert _digest(db_file) == before, f"the database {db_file} changed\n{shown}"
    else:
        _assert_failed_run(db_file, case.get("bad_attack"), shown, case.get("bad_defense"))


def _assert_failed_run(db_file: Path, bad_attack: str | None, shown: str, bad_defense: str | None = None) -> None:
    """One run, recorded as failed with the error; nothing stored for the attack or defense that broke its
    contract."""
    from bench.store import Store

    with Store(f"sqlite:///{db_file}", create=False) as store:
        runs = store.list_runs()
        assert [r["status"] for r in runs] == ["failed"], f"{runs}\n{shown}"
        info = store.run_info(runs[0]["id"])
        assert info["error"] and info["finished_at"], info
        evaluations = store.evaluations(runs[0]["id"])
        metrics = store.metric_rows(runs[0]["id"])
    if bad_attack:
        assert bad_attack in info["error"], info["error"]
        assert not [e for e in evaluations if e["attack"] == bad_attack], evaluations
        assert not [m for m in metrics if m["attack"] == bad_attack], metrics
        # the well-behaved attack of the same suite was stored: a plugin failure loses only its own work
        assert [m for m in metrics if m["attack"] == "loss"], metrics
    elif bad_defense:
        assert bad_defense in info["error"], info["error"]
        assert not [e for e in evaluations if e["defense"] == bad_defense], evaluations
        assert not [m for m in metrics if m["defense"] == bad_defense], metrics
    else:
        assert evaluations == [] and metrics == [], (evaluations, metrics)
