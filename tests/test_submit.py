"""`privbench submit`: a plugin runs sandboxed; misbehaving plugins become failed runs and change nothing else.

The fixtures under tests/plugins/ are real plugins: one well-behaved defense and ones that open a network
connection, write outside the sandbox, loop forever or allocate too much memory. All run on the tiny world
of tests/plugins/tiny.yaml, pretrained once into the session cache.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from bench.sandbox import (VIOLATION_EXIT, Limits, os_isolation_available, readonly_mounts_available,
                           run_sandboxed)
from bench.store import Store
from bench.submit import submit
from test_cache_safety import tree_digest

HERE = Path(__file__).parent
PLUGINS = HERE / "plugins"
TINY = str(PLUGINS / "tiny.yaml")
REPO = HERE.parent
EXAMPLE = REPO / "examples" / "privbench-example-defense"
RUN_LIMITS = Limits(wall_s=300, memory_bytes=3 << 30)   # generous: a violation ends the child long before


#: every submission of this module draws its world with one secret (still handed to the child on its standard
#: input only), so the tiny world's θ, pretrained once by trusted code into the shared cache, is read by each
#: child instead of pretrained again in its overlay
DRAW_SECRET = "c0ffee" * 5 + "00"


@pytest.fixture(scope="module", autouse=True)
def one_draw(cache):
    """θ of the tiny world for :data:`DRAW_SECRET`, pretrained by the trusted runner into the shared cache."""
    from bench.runner import Runner
    from bench.suite import load_suite, parse_suite
    raw = dict(load_suite(TINY).raw, defenses=["none"], attacks=["loss"], games=["null"])
    with Store(f"sqlite:///{cache.root.parent / 'one_draw.db'}") as store:
        Runner(parse_suite(raw, path=TINY), store, cache, quiet=True, draw_secret=DRAW_SECRET).run()
    old = os.environ.get("PRIVBENCH_DRAW_SECRET")
    os.environ["PRIVBENCH_DRAW_SECRET"] = DRAW_SECRET
    yield DRAW_SECRET
    os.environ.pop("PRIVBENCH_DRAW_SECRET") if old is None else os.environ.__setitem__("PRIVBENCH_DRAW_SECRET", old)


@pytest.fixture(scope="module")
def scored(cache, tmp_path_factory):
    """A results DB holding one complete submission of the well-behaved defense."""
    root = tmp_path_factory.mktemp("submit")
    db = f"sqlite:///{root / 'results.db'}"
    os.environ.pop("CI", None)
    before = tree_digest(cache.root)
    res = submit(str(PLUGINS / "good_defense.py"), suite=TINY, db=db, cache=str(cache.root), submitter="alice",
                 limits=RUN_LIMITS)
    assert res.status == "complete", res.error
    return {"db": db, "path": root / "results.db", "result": res, "cache": str(cache.root), "root": root,
            "cache_before": before, "cache_after": tree_digest(cache.root)}


def snapshot(db: str) -> dict:
    with Store(db, create=False) as store:
        return store.count_rows()


def leaderboard_rows(path: Path):
    """The leaderboard's main table, built by the app's own read-only queries and aggregation."""
    from leaderboard.aggregate import latest_per_seed, leaderboard_table
    from leaderboard.queries import guarantee_frame, metric_frame, read_only_engine, utility_frame
    engine = read_only_engine(str(path))
    metrics = latest_per_seed(metric_frame(engine))
    games = sorted(set(metrics["game"])) if not metrics.empty else []
    return leaderboard_table(metrics, utility_frame(engine), guarantee_frame(engine), games=games).reset_index()


def test_good_plugin_is_scored_and_shown(scored):
    res = scored["result"]
    with Store(scored["db"], create=False) as store:
        info = store.run_info(res.run_id)
        rows = store.metric_rows(res.run_id)
        util = store.utility_rows(res.run_id)
    assert info["status"] == "complete" and info["submitted_by"] == "alice" and info["verified_ci"] is False
    # started when `submit` began, not when its rows were stored after the sandboxed child
    from datetime import datetime
    took = datetime.fromisoformat(info["finished_at"]) - datetime.fromisoformat(info["started_at"])
    assert took.total_seconds() == pytest.approx(info["duration_s"], abs=2.0)
    import hashlib
    code = hashlib.sha256((PLUGINS / "good_defense.py").read_bytes()).hexdigest()[:16]
    assert info["config"]["submission"]["code_hash"] == code
    assert any(k.startswith("defense:gentle_finetune") and "+" in v for k, v in info["plugin_versions"].items())
    assert {(r["defense"], r["game"], r["attack"]) for r in rows if r["metric"] == "auc"} == {
        ("gentle_finetune", "adapt", "loss"), ("gentle_finetune", "null", "loss")}
    assert any(u["role"] == "adapted" and u["defense"] == "gentle_finetune" for u in util)
    # the plugin reports no training time: its cost is adapt's wall time, measured in its worker
    trained = [u["value"] for u in util if u["defense"] == "gentle_finetune" and u["metric"] == "train_seconds"]
    assert trained and all(t > 0 for t in trained), trained
    board = leaderboard_rows(scored["path"])
    assert "gentle_finetune" in set(board["defense"])
    # the ranked table names who submitted the plugin, and that the run is not verified (it ran outside CI)
    from leaderboard.aggregate import display_ranking, track_ranking
    from leaderboard.queries import guarantee_frame, metric_frame, read_only_engine, run_frame, utility_frame
    engine = read_only_engine(str(scored["path"]))
    ranked = display_ranking(track_ranking(metric_frame(engine), utility_frame(engine), guarantee_frame(engine),
                                           run_frame(engine), group="tiny", game="adapt"))
    assert [d for d in ranked["defense"] if "gentle_finetune" in d] == [
        "gentle_finetune 0.1.0 · submitted by alice, unverified"], list(ranked["defense"])


def test_rerun_of_unchanged_plugin_is_a_noop(scored):
    before = snapshot(scored["db"])
    res = submit(str(PLUGINS / "good_defense.py"), suite=TINY, db=scored["db"], cache=scored["cache"],
                 limits=RUN_LIMITS)
    assert res.status == "unchanged" and res.run_id == scored["result"].run_id
    assert snapshot(scored["db"]) == before


def _submit_bad(scored, name: str, limits: Limits, tmp_path: Path, **env):
    before = snapshot(scored["db"])
    old = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        res = submit(str(PLUGINS / f"{name}_defense.py"), suite=TINY, db=scored["db"], cache=scored["cache"],
                     submitter="mallory", limits=limits, sandbox_dir=str(tmp_path / "box"))
    finally:
        for k, v in old.items():
            os.environ.pop(k) if v is None else os.environ.__setitem__(k, v)
    after = snapshot(scored["db"])
    assert res.status == "failed"
    # exactly one new row, the failed run; not one score, metric, utility or guarantee row more
    assert after == dict(before, runs=before["runs"] + 1), (before, after)
    with Store(scored["db"], create=False) as store:
        info = store.run_info(res.run_id)
    assert info["status"] == "failed" and info["error"] == res.error and info["submitted_by"] == "mallory"
    board = leaderboard_rows(scored["path"])  # still renders, without the failed plugin
    assert "gentle_finetune" in set(board["defense"]) and len(board) == 1
    return res


def test_network_access_is_stopped(scored, tmp_path):
    res = _submit_bad(scored, "net", RUN_LIMITS, tmp_path)
    assert "network access refused" in res.error and "198.51.100.7" in res.error


def test_write_outside_sandbox_is_stopped(scored, tmp_path):
    target = tmp_path / "outside" / "stolen.txt"
    target.parent.mkdir()
    res = _submit_bad(scored, "write", RUN_LIMITS, tmp_path, PRIVBENCH_TEST_ESCAPE=str(target))
    assert "write outside the sandbox refused" in res.error and str(target) in res.error
    assert not target.exists()


def test_a_worker_can_neither_rewrite_the_results_database_nor_leave_notes_outside(scored, tmp_path):
    """tests/plugins/db_tamper_attack.py: a libc write outside its directory (a note for a later game's worker)
    fails on the worker's read-only file system where the kernel allows one, and its ``sqlite3`` connection to
    the parent's results database ends the run before a byte of the database changes."""
    import sqlite3

    def aucs() -> list:
        with sqlite3.connect(scored["path"]) as db:
            return db.execute("SELECT id, value FROM metrics WHERE metric = 'auc' ORDER BY id").fetchall()

    before, note = aucs(), tmp_path / "outside" / "note.txt"
    note.parent.mkdir()
    env = {"PRIVBENCH_TEST_DB": str(scored["path"]), "PRIVBENCH_TEST_ESCAPE": str(note)}
    old = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    logged: list[str] = []
    try:
        res = submit(str(PLUGINS / "db_tamper_attack.py"), suite=TINY, db=scored["db"], cache=scored["cache"],
                     submitter="mallory", limits=RUN_LIMITS, sandbox_dir=str(tmp_path / "box"), log=logged.append)
    finally:
        for k, v in old.items():
            os.environ.pop(k) if v is None else os.environ.__setitem__(k, v)
    assert res.status == "failed" and "database access refused" in res.error, res.error
    assert aucs() == before
    workers = [m for m in logged if m.startswith("plugin workers: ")]
    assert len(workers) == 1, logged  # the child says how its workers run, before they run
    if "read-only file system" in workers[0]:  # where the kernel allows it (bench/confine.py)
        assert not note.exists()  # the kernel refused what the audit hook cannot see


def test_a_defense_cannot_read_the_task_pools_from_the_shared_cache(scored, tmp_path, monkeypatch):
    """tests/plugins/corpus_reader_defense.py looks up the targets in the task's built corpus: the worker's guard
    refuses the read of the shared cache (and the kernel shows it an empty directory where it can)."""
    monkeypatch.setenv("PRIVBENCH_TEST_SHARED", scored["cache"])
    res = submit(str(PLUGINS / "corpus_reader_defense.py"), suite=TINY, db=f"sqlite:///{tmp_path / 'r.db'}",
                 cache=scored["cache"], limits=RUN_LIMITS, sandbox_dir=str(tmp_path / "box"))
    assert res.status == "failed" and "read of the runner's files refused" in res.error, res.error


def test_a_defense_cannot_claim_a_lower_cost_than_it_took(scored, tmp_path):
    """tests/plugins/cheap_claim_defense.py pauses 2 s in adapt, reports 1 ms and freezes its own clock: the stored
    ``train_seconds`` is its word, ``adapt_seconds`` is what the child measured around the worker's request, and the
    board's cost column reads the measurement."""
    SPENT_S = 2.0  # the pause of tests/plugins/cheap_claim_defense.py
    path = tmp_path / "cheap.db"
    res = submit(str(PLUGINS / "cheap_claim_defense.py"), suite=TINY, db=f"sqlite:///{path}", cache=scored["cache"],
                 limits=RUN_LIMITS, sandbox_dir=str(tmp_path / "box"))
    assert res.status == "complete", res.error
    with Store(f"sqlite:///{path}", create=False) as store:
        util = {u["metric"]: u["value"] for u in store.utility_rows(res.run_id)
                if u["defense"] == "cheap_claim" and u["role"] == "adapted" and u["dataset"] == "heldout"}
    assert util["train_seconds"] == pytest.approx(0.001)
    assert SPENT_S <= util["adapt_seconds"] < SPENT_S + 60, util
    from leaderboard.aggregate import display_ranking, track_ranking
    from leaderboard.queries import guarantee_frame, metric_frame, read_only_engine, run_frame, utility_frame
    engine = read_only_engine(str(path))
    ranked = track_ranking(metric_frame(engine), utility_frame(engine), guarantee_frame(engine), run_frame(engine),
                           group="tiny", game="adapt")
    row = ranked[ranked["defense"] == "cheap_claim"].iloc[0]
    assert row["train_seconds"] == pytest.approx(util["adapt_seconds"]) and row["train_seconds_source"] == "measured"
    shown = display_ranking(ranked)["cost (train+attack)"][ranked.index[ranked["defense"] == "cheap_claim"][0]]
    assert "self-reported" not in shown and not shown.startswith("0.0 s"), shown


def test_endless_loop_is_killed(scored, tmp_path):
    res = _submit_bad(scored, "loop", Limits(wall_s=30, memory_bytes=3 << 30), tmp_path)
    assert "wall-clock limit exceeded" in res.error and "30 s" in res.error
    # the plugin really ran before it was killed, in the working directory of its worker
    assert list((tmp_path / "box" / "workers").glob("*/loop-started"))


def test_crashing_plugin_is_recorded_with_its_error(scored, tmp_path):
    res = _submit_bad(scored, "crash", RUN_LIMITS, tmp_path)
    assert "ZeroDivisionError" in res.error
    assert "(at crash_defense.py:14 in adapt)" in res.error  # where, in the plugin's own code


def test_memory_hog_is_stopped(scored, tmp_path):
    res = _submit_bad(scored, "memory", Limits(wall_s=300, memory_bytes=3 << 30), tmp_path)
    assert "memory limit exceeded" in res.error



def test_a_submitted_defense_cannot_read_the_draw_from_its_process(scored, tmp_path):
    """A defense that looks for the challenger in its process (tests/plugins/peek_defense.py) finds none: it runs
    in a worker of its own (bench/plugin_worker.py). Where it ran beside the runner, it read all 24 targets."""
    res = submit(str(PLUGINS / "peek_defense.py"), suite=TINY, db=f"sqlite:///{tmp_path / 'peek.db'}",
                 cache=scored["cache"], submitter="mallory", limits=RUN_LIMITS, sandbox_dir=str(tmp_path / "box"))
    assert res.status == "complete", res.error


def test_a_submitted_attack_cannot_read_the_labels_from_its_process(scored, tmp_path):
    """An attack that looks for the game instance holding its targets' labels (tests/plugins/peek_attack.py) finds
    none: each game is scored by a worker of its own whose model handles call back into the runner's process.
    Where it ran beside the runner, it found them."""
    res = submit(str(PLUGINS / "peek_attack.py"), suite=TINY, db=f"sqlite:///{tmp_path / 'peek.db'}",
                 cache=scored["cache"], submitter="mallory", limits=RUN_LIMITS, sandbox_dir=str(tmp_path / "box"))
    assert res.status == "complete", res.error
    with Store(f"sqlite:///{tmp_path / 'peek.db'}", create=False) as store:
        aucs = [r["value"] for r in store.metric_rows(res.run_id) if r["attack"] == "peek_attack"
                and r["metric"] == "auc" and r["game"] == "adapt"]
    assert aucs and all(a < 1.0 for a in aucs), aucs   # scored by its loss, not by labels


def test_a_forked_worker_holds_no_way_into_the_processes_that_started_it(scored, tmp_path):
    """The fork server's channel (bench/fork_server.py): a defense that looks for the server's socket among its
    descriptors and opens its parent's and grandparent's memory through libc, past the audit hook
    (tests/plugins/fork_probe_defense.py), finds its own five descriptors (its two pipes, stderr on 1 and 2, the
    guard's report) and no socket (left open, the socket would let it ask for a worker unconfined). Where the worker
    has a user namespace of its own it is refused the memory of the server and of the child that holds the draw:
    it holds no capability in their namespace (and both are non-dumpable, which is what refuses it where there is
    no namespace; as root here the test cannot show that part)."""
    res = _submit_bad(scored, "fork_probe", RUN_LIMITS, tmp_path)
    found = res.error.partition("probe: ")[2]
    assert found, res.error
    descriptors = dict(item.split("=") for item in found.partition("descriptors ")[2].partition(";")[0].split())
    # its requests, its stderr twice (stdout is stderr: prints stay off the channel), its replies, the report
    assert sorted(descriptors.values()) == ["file", "file", "file", "pipe", "pipe"], found
    assert "sockets none;" in found, found
    if os_isolation_available():
        assert "parent mem opened" not in found and "grandparent mem opened" not in found, found
        assert found.count("Permission denied") + found.count("Operation not permitted") == 2, found


def test_worker_start_is_checked_and_forks_only_without_cuda(monkeypatch):
    """``PRIVBENCH_WORKER_START`` takes the two ways a child starts workers and names them when given another."""
    import torch

    from bench.errors import ConfigError
    from bench.fork_server import fork_server_usable
    monkeypatch.setenv("PRIVBENCH_WORKER_START", "spawn")
    assert fork_server_usable() is False
    monkeypatch.setenv("PRIVBENCH_WORKER_START", "fork-server")
    assert fork_server_usable() is (not torch.cuda.is_available())
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert fork_server_usable() is False
    monkeypatch.setenv("PRIVBENCH_WORKER_START", "fork")
    with pytest.raises(ConfigError, match="'fork-server'.*'spawn'"):
        fork_server_usable()


# ------------------------------------------------------------------ the shared cache: read-only, overlay discarded

def test_honest_run_adds_only_the_parents_task_data_to_the_shared_cache(scored):
    """The child trained the adapted model into its overlay (θ it read from the shared cache); none of it was
    promoted. The one addition allowed is task data the parent builds before the child starts (trusted code,
    trusted inputs)."""
    before, after = scored["cache_before"], scored["cache_after"]
    changed = {k for k in before if after.get(k) != before[k]}
    added = set(after) - set(before)
    assert not changed, changed
    assert {k.split("/")[0] for k in added} <= {"data"}, sorted(added)


def test_a_tampering_plugin_changes_nothing_in_the_shared_cache(scored, tmp_path):
    """A defense that writes into the shared cache past the audit hook (where the kernel enforces the read-only
    mount) and then plants artifacts in the submission's cache overlay: the kernel refuses the first, its
    worker's guard the second (a defense's worker writes only in its own directory), the run is a failed one, the
    overlay is discarded and the shared cache is unchanged byte for byte."""
    shared = Path(scored["cache"])
    before = tree_digest(shared)
    kernel = readonly_mounts_available()
    env = {"PRIVBENCH_TEST_SHARED": str(shared), "PRIVBENCH_TEST_CTYPES": "1" if kernel else "0"}
    old = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    logged: list[str] = []
    try:
        res = submit(str(PLUGINS / "tamper_defense.py"), suite=TINY, db=f"sqlite:///{tmp_path / 'r.db'}",
                     cache=str(shared), submitter="mallory", limits=RUN_LIMITS, sandbox_dir=str(tmp_path / "box"),
                     log=logged.append)
    finally:
        for k, v in old.items():
            os.environ.pop(k) if v is None else os.environ.__setitem__(k, v)
    assert res.status == "failed"
    overlay = tmp_path / "box" / "cache-overlay"
    assert "filesystem change outside the sandbox refused" in res.error and str(overlay) in res.error, res.error
    if kernel:
        assert res.isolation == "unshare --net --mount, shared cache read-only"
        assert not (shared / "planted.txt").exists()                        # EROFS: the kernel refused
    assert tree_digest(shared) == before                                   # byte for byte
    assert not overlay.exists()                                             # the overlay is gone
    assert any("cache overlay discarded" in m and "nothing from a sandbox enters the shared cache" in m
               for m in logged), logged
    assert any(m.startswith("job 1/") for m in logged), logged  # the child's progress, relayed while it ran


def test_direct_write_into_the_shared_cache_is_refused(scored, tmp_path, monkeypatch):
    """The audit hook refuses a plain write into the shared cache (the same plugin's write outside the sandbox
    is a failed run in test_write_outside_sandbox_is_stopped; here in a database of its own)."""
    shared = Path(scored["cache"])
    target = shared / "data" / "planted.txt"
    before = tree_digest(shared)
    monkeypatch.setenv("PRIVBENCH_TEST_ESCAPE", str(target))
    res = submit(str(PLUGINS / "write_defense.py"), suite=TINY, db=f"sqlite:///{tmp_path / 'r.db'}",
                 cache=str(shared), limits=RUN_LIMITS, sandbox_dir=str(tmp_path / "box"))
    assert res.status == "failed"
    assert "write outside the sandbox refused" in res.error and str(target) in res.error
    assert tree_digest(shared) == before and not target.exists()
    assert not (tmp_path / "box" / "cache-overlay").exists()


def test_kernel_keeps_read_only_paths_read_only_when_available(tmp_path):
    """Without the audit hook: a write, a remount read-write and an unmount of the read-only path all fail."""
    if not readonly_mounts_available():
        pytest.skip("no mount namespaces here: only the audit hook keeps the shared cache read-only")
    shared = tmp_path / "shared"
    shared.mkdir()
    (shared / "f").write_text("x")
    code = ("import ctypes, errno, os, sys\nd = sys.argv[1]\nlibc = ctypes.CDLL(None, use_errno=True)\n"
            "for p in (d + '/f', d + '/new'):\n"
            "    try:\n        open(p, 'a').write('y'); print('wrote')\n"
            "    except OSError as e:\n        print('refused', e.errno == errno.EROFS)\n"
            "print('remount', libc.mount(None, d.encode(), None, 0x20 | 0x1000, None))\n"   # MS_REMOUNT|MS_BIND
            "print('umount', libc.umount2(d.encode(), 2))\n"                               # MNT_DETACH
            "open(d + '/f', 'a').write('y')\n")
    res = run_sandboxed([sys.executable, "-c", code, str(shared)], sandbox=tmp_path / "box", limits=Limits(wall_s=60),
                        read_only=[shared])
    assert res.stdout.splitlines()[:4] == ["refused True", "refused True", "remount -1", "umount -1"], res.stdout
    assert res.returncode != 0 and "Read-only file system" in res.stderr
    assert sorted(os.listdir(shared)) == ["f"] and (shared / "f").read_text() == "x"


def test_sandbox_and_cache_must_not_nest(tmp_path):
    from bench.errors import ConfigError
    cache = tmp_path / "cache"
    cache.mkdir()
    for box in (cache / "box", tmp_path):
        with pytest.raises(ConfigError, match="must not contain each other"):
            submit(str(PLUGINS / "good_defense.py"), suite=TINY, db=f"sqlite:///{tmp_path / 'r.db'}",
                   cache=str(cache), sandbox_dir=str(box))
        with pytest.raises(ConfigError, match="must not contain each other"):
            run_sandboxed([sys.executable, "-c", "pass"], sandbox=box, limits=Limits(wall_s=60), read_only=[cache])


# ------------------------------------------------------------------ the guard and limits, without a run

def _guarded(tmp_path: Path, code: str, guard: str = "", **kw) -> tuple[subprocess.CompletedProcess, dict | None]:
    box = tmp_path / "box"
    box.mkdir(exist_ok=True)
    script = (f"import sys; sys.path.insert(0, {str(REPO)!r})\n"
              f"from bench.sandbox import install_guard\n"
              f"install_guard([{str(box)!r}], {str(box / 'v.json')!r}{guard})\n" + code)
    proc = subprocess.run([sys.executable, "-c", script], cwd=box, capture_output=True, text=True, timeout=60, **kw)
    report = box / "v.json"
    return proc, (json.loads(report.read_text()) if report.read_text() else None)


@pytest.mark.parametrize("code,words", [
    ("import socket\ntry:\n    socket.create_connection(('127.0.0.1', 9), timeout=1)\nexcept Exception:\n    pass",
     "network access refused"),
    ("import subprocess\nsubprocess.run(['true'])", "process creation refused"),
    ("import os\nos.system('true')", "process creation refused"),
    ("open('/tmp/../tmp/privbench-guard-test.txt', 'a').write('x')", "write outside the sandbox refused"),
    ("import os\nos.rename('inside.txt', '/tmp/privbench-moved.txt')", "filesystem change outside"),
])
def test_guard_refuses_and_ends_the_child(tmp_path, code, words):
    (tmp_path / "box").mkdir()
    (tmp_path / "box" / "inside.txt").write_text("x")
    proc, report = _guarded(tmp_path, code + "\nprint('carried on')")
    assert proc.returncode == VIOLATION_EXIT, proc.stderr
    assert words in report["message"] and "carried on" not in proc.stdout
    assert not Path("/tmp/privbench-moved.txt").exists()


@pytest.mark.parametrize("code", [
    "open(RUNNER + '/scratch.db', 'rb').read()",
    "import sqlite3\nsqlite3.connect(RUNNER + '/scratch.db').execute('select 1')",
    "import os\nos.listdir(RUNNER)",
    "import os\nopen(f'/proc/{os.getppid()}/environ', 'rb').read()",
])
def test_a_workers_guard_keeps_the_runners_files_and_other_processes_from_it(tmp_path, code):
    """What bench/plugin_worker.py arms in a worker: the runner's sandbox and other processes' /proc entries
    are unreadable from Python (the worker's own directory and /proc/self stay readable)."""
    runner = tmp_path / "runner"
    runner.mkdir()
    (runner / "scratch.db").write_bytes(b"labels")
    proc, report = _guarded(tmp_path, f"RUNNER = {str(runner)!r}\n" + code + "\nprint('carried on')",
                            guard=f", unreadable=[{str(runner)!r}], other_processes=False")
    assert proc.returncode == VIOLATION_EXIT, proc.stderr
    assert "read of the runner's files refused" in report["message"] and "carried on" not in proc.stdout


@pytest.mark.parametrize("code", [
    "import sqlite3\nsqlite3.connect(':memory:').execute(\"ATTACH '/tmp/x.db' AS x\")",
    "import sqlite3\nsqlite3.connect('mine.db')",
])
def test_a_workers_guard_refuses_every_database(tmp_path, code):
    """SQLite writes in C and ``ATTACH`` raises no audit event: a worker opens no database at all."""
    proc, report = _guarded(tmp_path, code + "\nprint('carried on')", guard=", databases=False")
    assert proc.returncode == VIOLATION_EXIT, proc.stderr
    assert "database access refused" in report["message"] and "carried on" not in proc.stdout


def test_a_confined_worker_writes_only_its_directory_and_sees_nothing_of_the_runner(tmp_path):
    """bench/confine.py, as a worker applies it before the plugin loads: what C code (SQLite, libc through
    ctypes) could do past the audit hook, the kernel refuses."""
    from bench.confine import confinement_available
    if not confinement_available():
        pytest.skip("no user + mount namespaces here: workers run under the audit hook alone")
    box, cache = tmp_path / "box", tmp_path / "cache"
    work = box / "workers" / "w-1"
    work.mkdir(parents=True)
    cache.mkdir()
    (cache / "corpus.json").write_text("the task's pools")
    (box / "scratch.db").write_bytes(b"the runner's rows")
    outside = tmp_path / "results.db"
    sqlite3_setup = "import sqlite3\n"
    code = (f"import sys, os, ctypes, json\nsys.path.insert(0, {str(REPO)!r})\n" + sqlite3_setup +
            f"from bench.confine import confine\nconfine({str(work)!r}, [{str(box)!r}, {str(cache)!r}])\n"
            "out = {}\n"
            "def attempt(name, f):\n"
            "    try:\n        f(); out[name] = 'done'\n"
            "    except Exception as e:\n        out[name] = type(e).__name__\n"
            f"attempt('sqlite', lambda: sqlite3.connect({str(outside)!r}).execute('CREATE TABLE t (x)'))\n"
            "libc = ctypes.CDLL(None, use_errno=True)\n"
            f"attempt('libc', lambda: (_ for _ in ()).throw(OSError()) if libc.open({str(tmp_path / 'note')!r}.encode(), "
            "os.O_WRONLY | os.O_CREAT, 0o644) < 0 else None)\n"
            f"attempt('cache', lambda: open({str(cache / 'corpus.json')!r}).read())\n"
            f"attempt('scratch', lambda: open({str(box / 'scratch.db')!r}, 'rb').read())\n"
            "attempt('own', lambda: open('theta.json', 'w').write('{}'))\n"
            "print(json.dumps(out))\n")
    proc = subprocess.run(["unshare", "--user", "--mount", "--map-root-user", sys.executable, "-c", code],
                          cwd=work, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out == {"sqlite": "OperationalError", "libc": "OSError", "cache": "FileNotFoundError",
                   "scratch": "FileNotFoundError", "own": "done"}, out
    assert not outside.exists() and not (tmp_path / "note").exists() and (work / "theta.json").exists()


def test_a_workers_guard_lets_it_read_its_own_directory_and_its_own_proc(tmp_path):
    (tmp_path / "box").mkdir()
    (tmp_path / "box" / "theta.json").write_text("{}")
    proc, report = _guarded(tmp_path, "print(open('theta.json').read(), open('/proc/self/status').read()[:4])",
                            guard=f", unreadable=[{str(tmp_path)!r}], other_processes=False")
    assert proc.returncode == 0 and report is None, proc.stderr


def test_guard_allows_work_inside_the_sandbox(tmp_path):
    proc, report = _guarded(tmp_path, "import os, json\nos.makedirs('a/b')\nopen('a/b/f.txt', 'w').write('ok')\n"
                                      "os.rename('a/b/f.txt', 'a/g.txt')\nos.remove('a/g.txt')\n"
                                      "print(open(__import__('sys').executable, 'rb').read(4))")
    assert proc.returncode == 0 and report is None, proc.stderr


def test_cpu_limit_kills(tmp_path):
    res = run_sandboxed([sys.executable, "-c", "while True: pass"], sandbox=tmp_path / "box",
                        limits=Limits(wall_s=60, cpu_s=2, memory_bytes=2 << 30))
    assert "CPU time limit exceeded" in res.failure() and res.seconds < 30


def test_os_isolation_blocks_network_when_available(tmp_path):
    if not os_isolation_available():
        pytest.skip("user namespaces are not available here: only the audit hook guards the network")
    code = ("import socket\ntry:\n    socket.create_connection(('127.0.0.1', 22), timeout=2)\n"
            "except OSError as e:\n    print('blocked', e.errno)\nprint(sorted(n for _, n in socket.if_nameindex()))")
    res = run_sandboxed([sys.executable, "-c", code], sandbox=tmp_path / "box", limits=Limits(wall_s=60))
    assert res.returncode == 0 and "blocked" in res.stdout and "['lo']" in res.stdout, res.stderr
    assert res.isolation == "unshare --net"   # nothing asked to be read-only: no mount namespace


# ------------------------------------------------------------------ the example package, end to end

def test_example_plugin_install_validate_submit(scored, tmp_path):
    """pip-install the example outside the environment, then validate → submit → leaderboard, via the CLI."""
    import shutil
    target, source = tmp_path / "site", tmp_path / "src"
    shutil.copytree(EXAMPLE, source)  # setuptools builds in the source tree: keep the repository clean
    pip = subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation",
                          "--target", str(target), str(source)], capture_output=True, text=True, timeout=300)
    assert pip.returncode == 0, pip.stderr[-2000:]
    # CI=true: a submission made in CI is marked verified
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO), str(target)]), PRIVBENCH_CACHE=scored["cache"],
               CI="true")

    def cli(*args):
        return subprocess.run([sys.executable, "-m", "bench", *args], env=env, cwd=tmp_path, capture_output=True,
                              text=True, timeout=600)

    listed = cli("list", "defenses", "--format", "json")
    (entry,) = [d for d in json.loads(listed.stdout)["defenses"] if d["name"] == "label_smoothing"]
    assert entry["origin"].startswith("entry point") and entry["version"] == "0.1.0"
    checked = cli("validate", "label_smoothing", "--timeout", "300", "--memory", "3")
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "ok    tiny world: trains and releases a model" in checked.stdout
    db = tmp_path / "results.db"
    sub = cli("submit", "label_smoothing", "--suite", TINY, "--db", str(db), "--submitter", "example",
              "--timeout", "300", "--memory", "3")
    assert sub.returncode == 0, sub.stderr[-3000:]
    board = leaderboard_rows(db)
    assert "label_smoothing" in set(board["defense"])
    with Store(str(db), create=False) as store:
        info = store.run_info(store.resolve_run(None))
    assert info["submitted_by"] == "example" and info["verified_ci"] is True
    assert info["plugin_versions"]["defense:label_smoothing"].startswith("0.1.0+")
    again = cli("submit", "label_smoothing", "--suite", TINY, "--db", str(db), "--timeout", "300")
    assert again.returncode == 0 and "nothing to do" in again.stdout


def _code_blocks_after_markers(text: str) -> dict[str, str]:
    out, lines = {}, text.splitlines(keepends=True)
    for i, line in enumerate(lines):
        if line.startswith("<!-- example: "):
            rel = line.split("example: ", 1)[1].split(" -->")[0].strip()
            assert lines[i + 1].startswith("```")
            end = next(j for j in range(i + 2, len(lines)) if lines[j].startswith("```"))
            out[rel] = "".join(lines[i + 2:end])
    return out


def test_guide_shows_the_example_verbatim():
    blocks = _code_blocks_after_markers((REPO / "docs" / "submitting.md").read_text())
    assert set(blocks) == {"examples/privbench-example-defense/privbench_example_defense/label_smoothing.py",
                           "examples/privbench-example-defense/pyproject.toml"}
    for rel, code in blocks.items():
        assert code == (REPO / rel).read_text(), f"docs/submitting.md and {rel} disagree: copy the file into the guide"


def test_label_smoothing_loss_matches_its_formula():
    """The example's loss is cross-entropy against q'(k) = (1-eps) 1[k=y] + eps/K, computed independently."""
    import torch
    import torch.nn.functional as F
    torch.manual_seed(0)
    logits, y, eps = torch.randn(5, 7), torch.randint(0, 7, (5,)), 0.2
    q = torch.full((5, 7), eps / 7)
    q[torch.arange(5), y] += 1 - eps
    expected = -(q * torch.log_softmax(logits, -1)).sum(-1).mean()
    assert torch.allclose(F.cross_entropy(logits, y, label_smoothing=eps), expected, atol=1e-6)


def test_submit_cli_one_line_errors(tmp_path, capsys, monkeypatch):
    from bench.cli import main
    db = tmp_path / "r.db"
    for args, words, env in [
            (["submit", "no/such/plugin.py"], "not found", {}),
            (["submit", "not_an_installed_plugin"], "neither a plugin file nor an installed entry point", {}),
            (["submit", str(PLUGINS / "good_defense.py"), "--timeout", "0"], "must be positive", {}),
            (["submit", str(PLUGINS / "good_defense.py"), "--suite", "smok"], "did you mean 'smoke'", {}),
            (["submit", str(PLUGINS / "good_defense.py"), "--suite", TINY], "give 'fork-server' (the default) or "
             "'spawn'", {"PRIVBENCH_WORKER_START": "fork"})]:
        with monkeypatch.context() as m:
            for k, v in env.items():
                m.setenv(k, v)
            rc = main(args + ["--db", str(db)])
        err = capsys.readouterr().err
        assert rc == 2 and words in err and len(err.strip().splitlines()) == 1, (args, err)
    assert not db.exists()  # nothing was run, so no database was created


def test_a_submission_on_a_track_runs_beside_the_anchors_and_refuses_parameters_it_cannot_use():
    """`privbench submit PLUGIN --track NAME`: the suite is the track with the plugin as its defense, so the anchors
    run beside it and the run is ranked; a suite entry that gives the plugin parameters is refused, not dropped."""
    from bench.errors import ConfigError
    from bench.submit import submission_suite
    from bench.suite import parse_suite

    suite = parse_suite(submission_suite({"track": "pii", "defenses": []}, "defense", "lora", False))
    assert [d.label for d in suite.defenses][:2] == ["none", "finetune"] and "lora" in [d.label for d in suite.defenses]
    raw = {"track": "pii", "defenses": [{"name": "lora", "params": {"r": 4}}]}
    with pytest.raises(ConfigError, match="default parameters"):
        submission_suite(raw, "defense", "lora", True)
    kept = submission_suite({"defenses": ["finetune", "lora"]}, "defense", "lora", True)["defenses"]
    assert kept == ["finetune", {"name": "lora"}]  # extended: the suite's own entry of that name is not doubled


def test_the_childs_progress_is_relayed_line_by_line(tmp_path):
    from bench.submit import ProgressRelay
    seen: list[str] = []
    path = tmp_path / "progress.log"
    relay = ProgressRelay(path, seen.append)
    relay()  # no file yet: nothing
    path.write_bytes(b"job 1/3 train: theta\njob 2/3 ad")
    relay()
    assert seen == ["job 1/3 train: theta"]  # a line still being written waits
    with open(path, "ab") as f:
        f.write(b"apt: finetune\x1b[2J\n\njob 3/3 evaluate\n")
    relay()
    relay()
    assert seen == ["job 1/3 train: theta", "job 2/3 adapt: finetune[2J", "job 3/3 evaluate"]
