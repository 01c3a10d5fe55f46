"""Crash safety: SIGKILL `privbench run` at five seeded points spread over a run, rerun, and compare.

The suite has the smoke suite's structure (mini-Pile task, reference model, two
defenses, five attacks) on a world small enough that six partial runs and one
uninterrupted run fit in a few minutes on one thread: the smoke suite itself
would take over ten. Kill points are chosen by phase — data build, pretraining,
adaptation, signal scoring, evaluations (DB writes) — each after a seeded random
delay once the phase has started. The final database must equal the
uninterrupted run's: same rows, same scores, no duplicates, no half-written rows,
the run complete, and every cache manifest verifying.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from bench.cache import ArtifactCache
from db_snapshot import integrity_problems, snapshot, tiny_world_yaml

GAMES = "[pretrain, adapt, joint/both, null]"
#: (phase, the log text that says it started, the largest random delay in seconds after that)
KILL_POINTS = [
    ("data build", "building data", 2.0),
    ("pretraining", "pretrain: θ", 3.0),
    ("adaptation", "adapt: θ'", 3.0),
    ("scoring", "signals: signals θ'", 2.0),
    ("evaluations and DB writes", "evaluate:", 4.0),
]
REPO = Path(__file__).resolve().parents[1]


def _cmd(suite: Path, db: Path, quiet: bool) -> list[str]:
    return [sys.executable, "-m", "bench", "run", "--suite", str(suite), "--db", f"sqlite:///{db}",
            "--no-report", *(["--quiet"] if quiet else [])]


def _env(cache: Path) -> dict:
    return dict(os.environ, PRIVBENCH_CACHE=str(cache), PRIVBENCH_THREADS="1",
                PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))


def _run_and_kill(cmd, env, cwd, marker: str, delay: float, timeout: float = 400) -> tuple[bool, str]:
    """Start ``cmd``; once a stderr line contains ``marker``, wait ``delay`` s and SIGKILL it.
    Returns (killed, stderr tail). A run that finishes before the kill point is simply not killed."""
    proc = subprocess.Popen(cmd, env=env, cwd=cwd, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True)
    lines: list[str] = []
    seen = threading.Event()

    def read():
        for line in proc.stderr:
            lines.append(line)
            if marker in line:
                seen.set()
    t = threading.Thread(target=read, daemon=True)
    t.start()
    killed = False
    deadline = time.monotonic() + timeout
    while proc.poll() is None and time.monotonic() < deadline:
        if seen.wait(0.2):
            time.sleep(delay)
            if proc.poll() is None:
                os.kill(proc.pid, signal.SIGKILL)
                killed = True
            break
    proc.wait(timeout=60)
    t.join(timeout=10)
    return killed, "".join(lines[-20:])


def test_sigkill_at_five_points_then_resume_equals_uninterrupted_run(tmp_path):
    suite = tmp_path / "tiny_world.yaml"
    suite.write_text(tiny_world_yaml(GAMES))
    # the uninterrupted run
    clean = subprocess.run(_cmd(suite, tmp_path / "clean.db", True), env=_env(tmp_path / "cache-clean"),
                           cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert clean.returncode == 0, clean.stderr[-3000:]
    # the same run, killed five times and resumed
    rng = random.Random(20261121)
    env, db = _env(tmp_path / "cache-faults"), tmp_path / "faults.db"
    kills = []
    for phase, marker, max_delay in KILL_POINTS:
        delay = rng.uniform(0.0, max_delay)
        killed, tail = _run_and_kill(_cmd(suite, db, False), env, tmp_path, marker, delay)
        kills.append((phase, round(delay, 2), killed))
        if killed:  # whatever it left behind, the integrity of what is stored holds at every kill
            assert not [p for p in integrity_problems(db) if "left in status" not in p], tail
    print("kills (phase, delay s, killed):", kills)
    assert sum(k for *_, k in kills) >= 4, kills  # the kill points did land in the run
    final = subprocess.run(_cmd(suite, db, True), env=env, cwd=tmp_path, capture_output=True, text=True,
                           timeout=600)
    assert final.returncode == 0, final.stderr[-3000:]

    a, b = snapshot(tmp_path / "clean.db"), snapshot(db)
    assert a["runs"] == b["runs"] == [("tiny_world", "complete")]
    assert len(a["evaluations"]) == 2 * 4 * 5
    assert a["evaluations"] == b["evaluations"], kills
    assert a["metrics"] == b["metrics"]
    assert a["utility"] == b["utility"]
    assert a["guarantees"] == b["guarantees"]
    assert integrity_problems(db) == []
    cache = ArtifactCache(tmp_path / "cache-faults")
    verified = cache.verify_all()
    assert verified["invalid"] == [] and len(verified["valid"]) >= 5, verified
    assert not [p for p in cache.root.rglob(".*") if p.is_dir()]  # no half-built artifact left behind
    # a rerun of the completed run does nothing
    again = subprocess.run(_cmd(suite, db, True), env=env, cwd=tmp_path, capture_output=True, text=True,
                           timeout=600)
    assert again.returncode == 0 and snapshot(db) == b
