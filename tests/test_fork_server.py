"""The fork server (bench/fork_server.py): a forked plugin worker starts as a spawned one would, and its end is
reported as a spawned one's.

Real processes, with the isolation this machine allows (a user + mount namespace of the worker's own where the
kernel has them). A plugin written here describes, at import, where it finds itself: its directory, HOME, TMPDIR,
import path, the draw variable and a draw of NumPy's global generator; the description comes back through
``WorkerSession.info``. tests/test_submit.py runs whole submissions through the server and the dishonest plugin
that looks for its socket and its parents' memory.
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import time
from pathlib import Path

import pytest

from bench.errors import PluginError
from bench.fork_server import ForkServer
from bench.plugin_ref import resolve_plugin
from bench.plugin_worker import WORKERS_DIR, WorkerIsolation, WorkerSession, worker_env
from bench.sandbox import FAILURE_EXIT

WHERE_AM_I = '''
import json, os, sys, tempfile
import numpy as np
from bench.defense import Defense
from bench.registry import register_defense

SEEN = {"cwd": os.getcwd(), "home": os.environ["HOME"], "tmp": tempfile.gettempdir(), "path0": sys.path[0],
        "draw": os.environ.get("PRIVBENCH_DRAW_SECRET"), "numpy": int(np.random.randint(1 << 30))}


@register_defense("where_am_i")
class WhereAmI(Defense):
    """Describes where its worker started."""

    description = json.dumps(SEEN)

    def adapt(self, model, data, ctx):
        return model
'''


def _server(root: Path) -> ForkServer:
    where = root / WORKERS_DIR / "server"
    for sub in ("home", "tmp"):
        (where / sub).mkdir(parents=True)
    return ForkServer(where, worker_env(root, where))


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    root = tmp_path_factory.mktemp("fork-server")
    os.environ["PRIVBENCH_DRAW_SECRET"] = "must-not-reach-a-worker"  # as a careless caller might leave it
    try:
        srv = _server(root)
    finally:
        os.environ.pop("PRIVBENCH_DRAW_SECRET")
    yield srv
    srv.close()


def _plugin(tmp_path: Path, source: str, name: str):
    folder = tmp_path / "plugin"
    folder.mkdir(exist_ok=True)
    (folder / name).write_text(source)
    return resolve_plugin(str(folder / name))


def _seen(plugin, box: Path, isolation: WorkerIsolation) -> tuple[dict, Path]:
    with WorkerSession(plugin, box, box / "violation.json", isolation) as w:
        seen = json.loads(w.info["description"])
        where = w.dir.resolve()
    return seen, where


@pytest.mark.parametrize("start", ["fork-server", "spawn"])
def test_a_worker_starts_in_its_own_directory_with_its_own_environment(server, tmp_path, start, monkeypatch):
    """Forked or spawned, the plugin finds itself in its worker's directory, with HOME, TMPDIR and the head of
    the import path there, without the draw variable; two forked workers draw differently from NumPy's global
    generator (a fork would repeat the server's stream unless reseeded)."""
    monkeypatch.setenv("PRIVBENCH_DRAW_SECRET", "must-not-reach-a-worker")
    plugin = _plugin(tmp_path, WHERE_AM_I, "where_defense.py")
    box = tmp_path / "box"
    box.mkdir()
    isolation = WorkerIsolation.probe([])
    if start == "fork-server":
        isolation = dataclasses.replace(isolation, server=server)
    runs = 2 if start == "fork-server" else 1
    seen = [_seen(plugin, box, isolation) for _ in range(runs)]
    for got, where in seen:
        assert Path(got["cwd"]).resolve() == where
        assert (got["home"], got["tmp"]) == (str(where / "home"), str(where / "tmp"))
        assert Path(got["path0"]).resolve() == where
        assert got["draw"] is None
    if runs == 2:
        assert seen[0][0]["numpy"] != seen[1][0]["numpy"]


def test_a_forked_workers_end_is_reported_as_a_spawned_ones(server, tmp_path):
    """A plugin that fails to load ends its forked worker with the failure status, which ``wait`` returns and
    ``info`` turns into the plugin's error; a worker that loads ends 0 when its session closes."""
    isolation = dataclasses.replace(WorkerIsolation.probe([]), server=server)
    box = tmp_path / "box"
    box.mkdir()
    broken = _plugin(tmp_path, "raise ImportError('no module named hidden_helper')\n", "broken_defense.py")
    with pytest.raises(PluginError, match="hidden_helper"):
        with WorkerSession(broken, box, box / "violation.json", isolation) as w:
            assert w.proc.wait(timeout=120) == FAILURE_EXIT
            w.info
    assert w._closed and w.proc.poll() == FAILURE_EXIT and not w.dir.exists()
    good = _plugin(tmp_path, WHERE_AM_I, "where_defense.py")
    with WorkerSession(good, box, box / "violation.json", isolation) as w:
        assert w.info["name"] == "where_am_i"
        assert w.proc.poll() is None  # waiting for requests
    assert w.proc.returncode == 0


def test_a_killed_server_fails_its_workers_with_an_error_that_says_so(tmp_path):
    """A server that is gone (a plugin may kill it: same user) leaves no caller waiting: a worker asked for
    before, and one asked for after, fail with a PluginError naming the server. Asking whether a worker has ended
    does not wait for the server (here still importing) to fork it."""
    srv = _server(tmp_path / "own")
    try:
        isolation = dataclasses.replace(WorkerIsolation.probe([]), server=srv)
        box = tmp_path / "box"
        box.mkdir()
        plugin = _plugin(tmp_path, WHERE_AM_I, "where_defense.py")
        early = WorkerSession(plugin, box, box / "violation.json", isolation)
        t0 = time.perf_counter()
        assert early.proc.poll() is None
        assert time.perf_counter() - t0 < 2.0
        os.kill(srv.proc.pid, signal.SIGKILL)
        srv.proc.wait()
        for session in (early, WorkerSession(plugin, box, box / "violation.json", isolation)):
            with pytest.raises(PluginError, match="worker server"):
                with session as w:
                    w.info  # noqa: B018
    finally:
        srv.close()
