"""Ray across two nodes that share no disk: each node its own cache, artifacts and signals through a store.

A Ray head and a second Ray node are started on this machine (`ray start --head`, `ray start --address`), each
with its own private ``PRIVBENCH_CACHE``; the driver has a third cache directory and the nodes see none of the
others: everything they exchange goes through the artifact store (a ``file://`` directory standing in for a
bucket). The tiny world of the smoke suite's structure runs on the cluster and must store exactly the local
run's rows. Then a worker is SIGKILLed in the middle of a fresh run; the run fails with the error naming the
fix, and the same command run again completes with exactly the local run's rows.
"""

from __future__ import annotations

import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
import yaml

from bench.cache import ArtifactCache
from bench.executors import LocalExecutor
from bench.runner import Runner
from bench.store import Store
from bench.suite import parse_suite
from db_snapshot import integrity_problems, snapshot, tiny_world_yaml

ray = pytest.importorskip("ray")
REPO = Path(__file__).resolve().parents[1]
GAMES = "[pretrain, adapt, null]"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _ray_cli() -> list[str]:
    exe = shutil.which("ray") or str(Path(sys.executable).with_name("ray"))
    if not Path(exe).exists():
        pytest.skip("the `ray` command is not installed")
    return [exe]


class TwoNodeCluster:
    """A head and a worker node, one CPU each, started with `ray start --block` in their own process groups (so
    stopping them touches no other Ray instance on the machine)."""

    def __init__(self, tmp: Path, caches: tuple[Path, Path]) -> None:
        self.port = _free_port()
        self.address = f"127.0.0.1:{self.port}"
        self.env = dict(os.environ, RAY_USAGE_STATS_ENABLED="0", RAY_AUTH_MODE="token",
                        RAY_AUTH_TOKEN=secrets.token_hex(32), PRIVBENCH_THREADS="1",
                        PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))
        self.caches = caches
        self.logs = tmp
        # Ray's own directory for this cluster: `ray start --head` records the cluster's address there, and a
        # record in the default /tmp/ray would make later `ray.init()` calls on this machine look for it
        self.temp_dir = tempfile.mkdtemp(prefix="ray-", dir="/tmp")  # short: Ray's socket paths must fit
        self.procs: list[subprocess.Popen] = []

    def _start(self, name: str, cache: Path, args: list[str]) -> None:
        env = dict(self.env, PRIVBENCH_CACHE=str(cache))
        log = (self.logs / f"ray-{name}.log").open("w")
        self.procs.append(subprocess.Popen(
            _ray_cli() + ["start", "--block", "--num-cpus", "1", "--node-ip-address", "127.0.0.1",
                          "--disable-usage-stats", "--temp-dir", self.temp_dir, *args],
            env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True))

    def _nodes_alive(self) -> int:
        probe = ("import ray; ray.init(address='%s', log_to_driver=False); "
                 "print(sum(n['Alive'] for n in ray.nodes()))" % self.address)
        out = subprocess.run([sys.executable, "-c", probe], env=self.env, capture_output=True, text=True,
                             timeout=120)
        lines = out.stdout.strip().splitlines()
        return int(lines[-1]) if out.returncode == 0 and lines and lines[-1].isdigit() else 0

    def _wait_port(self, deadline: float) -> None:
        while time.time() < deadline:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                return
            except OSError:
                time.sleep(0.5)
        raise TimeoutError(f"the Ray head did not start: see {self.logs / 'ray-head.log'}")

    def start(self) -> None:
        deadline = time.time() + 120
        self._start("head", self.caches[0], ["--head", "--port", str(self.port), "--include-dashboard=false"])
        self._wait_port(deadline)
        self._start("node", self.caches[1], ["--address", self.address])
        while time.time() < deadline:
            time.sleep(1)
            if self._nodes_alive() >= 2:
                return
        raise TimeoutError("the second Ray node did not join within 120 s: see the ray-*.log files")

    def stop(self) -> None:
        """SIGTERM, then SIGKILL after 10 s, to every process the two `ray start` commands started (GCS, raylets,
        agents, workers: their descendants), and to nothing else."""
        pids = _descendants({p.pid for p in self.procs})
        for pid in pids:
            try:
                os.kill(pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
        deadline = time.time() + 10
        while time.time() < deadline and any(Path(f"/proc/{pid}").exists() for pid in pids):
            time.sleep(0.5)
            for p in self.procs:
                p.poll()
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        for p in self.procs:
            p.wait()
        shutil.rmtree(self.temp_dir, ignore_errors=True)


def _descendants(roots: set[int]) -> set[int]:
    """``roots`` and every process below them (from /proc's parent links)."""
    children: dict[int, list[int]] = {}
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                ppid = int((proc / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(proc.name))
    out, todo = set(), list(roots)
    while todo:
        pid = todo.pop()
        if pid not in out:
            out.add(pid)
            todo += children.get(pid, [])
    return out


def _local_run(tmp_path: Path, suite_raw: dict) -> Path:
    db = tmp_path / "local.db"
    store = Store(f"sqlite:///{db}")
    result = Runner(parse_suite(suite_raw), store, ArtifactCache(tmp_path / "cache-local"), quiet=True,
                    executor=LocalExecutor()).run()
    store.close()
    assert result.status == "complete"
    return db


def _worker_pids() -> list[int]:
    """Ray worker processes executing one of privbench's jobs (Ray titles them after the task function)."""
    out = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                cmd = (proc / "cmdline").read_bytes()
            except OSError:
                continue
            if cmd.startswith(b"ray::_ray_job"):
                out.append(int(proc.name))
    return out


def _same_rows(a: dict, b: dict) -> None:
    assert a["evaluations"] == b["evaluations"]  # every target id, label and score, exactly
    assert a["metrics"] == b["metrics"]
    assert a["utility"] == b["utility"]
    assert a["guarantees"] == b["guarantees"]


@pytest.mark.timeout(900)
def test_two_nodes_with_private_caches_store_the_local_rows_and_survive_a_killed_worker(tmp_path, monkeypatch):
    """(Ray reads its auth token when imported, so every Ray client here is a subprocess: the CLI, as users run it.)"""
    monkeypatch.setenv("PRIVBENCH_THREADS", "1")  # same thread count in driver and workers: same float sums
    suite_raw = yaml.safe_load(tiny_world_yaml(GAMES))
    t0 = time.perf_counter()
    local = snapshot(_local_run(tmp_path, suite_raw))
    local_s = time.perf_counter() - t0
    assert local["evaluations"] and local["metrics"] and local["utility"]

    node_a, node_b, driver = tmp_path / "node-a", tmp_path / "node-b", tmp_path / "driver"
    cluster = TwoNodeCluster(tmp_path, (node_a, node_b))
    cluster.start()
    try:
        # 1. the cluster run (`privbench run` as a user types it), from empty caches: exactly the local rows
        suite_file = tmp_path / "tiny.yaml"
        suite_file.write_text(yaml.safe_dump(suite_raw))
        env = dict(cluster.env, PRIVBENCH_CACHE=str(tmp_path / "not-used-by-the-nodes"))

        def command(db: Path, driver_cache: Path, bucket: Path) -> list[str]:
            return [sys.executable, "-m", "bench", "run", "--suite", str(suite_file), "--db", str(db),
                    "--cache", str(driver_cache), "--executor", "ray", "--ray-address", cluster.address,
                    "--artifact-store", bucket.as_uri(), "--quiet", "--no-report"]

        db, bucket = tmp_path / "ray.db", tmp_path / "bucket"
        t0 = time.perf_counter()
        first = subprocess.run(command(db, driver, bucket), env=env, capture_output=True, text=True, timeout=900)
        cluster_s = time.perf_counter() - t0
        assert first.returncode == 0, first.stderr[-3000:]
        _same_rows(local, snapshot(db))
        assert integrity_problems(db) == []
        print(f"\nlocal run {local_s:.1f}s, two-node Ray run with private caches {cluster_s:.1f}s")

        # each node worked from its own directory: both built or fetched models and scored texts, every artifact
        # there verifies, and the driver's and the default cache directories were never written by a worker
        caches = {}
        for node in (node_a, node_b):
            check = ArtifactCache(node).verify_all()
            assert check["invalid"] == [], check["invalid"]
            caches[node.name] = set(check["valid"])
            assert any(k.startswith(("pretrained/", "adapted/")) for k in check["valid"]), check["valid"]
            assert list((node / "signals").rglob("*.npz")), f"{node.name} scored nothing"
        assert caches["node-a"] & caches["node-b"], "no artifact travelled between the nodes through the store"
        assert not (tmp_path / "not-used-by-the-nodes").exists()
        assert not any(k.startswith(("pretrained/", "adapted/")) for k in ArtifactCache(driver).verify_all()["valid"])
        # the store holds every model artifact either node has, each a whole archive; no temporary object left
        stored = {f"{p.parent.name}/{p.name[:-4]}" for p in bucket.glob("*/*.tar")}
        assert caches["node-a"] | caches["node-b"] <= stored
        assert not list(bucket.rglob(".*"))

        # 2. a worker SIGKILLed mid-run: the run fails naming the fix; the same command again completes, equal
        for node in (node_a, node_b):
            shutil.rmtree(node)
        cmd = command(tmp_path / "kill.db", tmp_path / "driver-2", tmp_path / "bucket-2")
        proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        killed = None
        deadline = time.time() + 600
        while proc.poll() is None and time.time() < deadline:
            if list((tmp_path / "bucket-2").glob("pretrained/*.tar")):  # well into the run: θ is built
                pids = _worker_pids()
                if pids:
                    killed = pids[0]
                    os.kill(killed, signal.SIGKILL)
                    break
            time.sleep(0.05)
        out, err = proc.communicate(timeout=600)
        assert killed is not None, "the run ended before a worker could be killed"
        assert proc.returncode != 0
        assert "died" in err and "rerun the same command to resume" in err, err[-2000:]
        rerun = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
        assert rerun.returncode == 0, rerun.stderr[-3000:]
        _same_rows(local, snapshot(tmp_path / "kill.db"))
        assert integrity_problems(tmp_path / "kill.db") == []
    finally:
        cluster.stop()
