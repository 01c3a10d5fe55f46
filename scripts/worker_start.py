"""How long a submitted plugin's worker takes to start, spawned as a new program or forked from the fork server.

Each worker is started as a submission child starts it (bench/plugin_worker.py: its own directory, the
isolation this machine allows) and timed until it has loaded the plugin and described it (``WorkerSession.info``).
The first forked worker waits for the server's imports; later ones are forks. Not a test: run it on an otherwise
idle machine and record its output in docs/benchmarks.md.

    python scripts/worker_start.py                       # 5 workers each way, tests/plugins/good_defense.py
    python scripts/worker_start.py --workers 10 --plugin PATH
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import platform
import statistics
import tempfile
import time
from pathlib import Path

from bench.fork_server import ForkServer
from bench.plugin_ref import resolve_plugin
from bench.plugin_worker import WORKERS_DIR, WorkerIsolation, WorkerSession, worker_env

REPO = Path(__file__).resolve().parents[1]


def time_workers(plugin_path: str, n: int, forked: bool) -> list[float]:
    """Seconds from asking for each of ``n`` workers, one after another, to its description of the plugin."""
    plugin = resolve_plugin(plugin_path)
    with tempfile.TemporaryDirectory(prefix="privbench-worker-start-") as tmp:
        box = Path(tmp)
        isolation = WorkerIsolation.probe([])
        server = None
        if forked:
            where = box / WORKERS_DIR / "server"
            for sub in ("home", "tmp"):
                (where / sub).mkdir(parents=True)
            server = ForkServer(where, worker_env(box, where))
            isolation = dataclasses.replace(isolation, server=server)
        seconds = []
        try:
            for _ in range(n):
                t0 = time.perf_counter()
                with WorkerSession(plugin, box, box / "violation.json", isolation) as w:
                    w.info  # noqa: B018 - waits for the load
                    seconds.append(time.perf_counter() - t0)
        finally:
            if server is not None:
                server.close()
        return seconds


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workers", type=int, default=5, help="workers started each way (default 5)")
    ap.add_argument("--plugin", default=str(REPO / "tests" / "plugins" / "good_defense.py"))
    args = ap.parse_args()
    if args.workers < 2:
        raise SystemExit("error: --workers must be at least 2 (the first forked worker waits for the server)")
    print(json.dumps({"cpu": platform.processor() or platform.machine(), "isolation":
                      WorkerIsolation.probe([]).describe().split(";")[0]}))
    for forked in (False, True):
        s = time_workers(args.plugin, args.workers, forked)
        print(json.dumps({"start": "fork-server" if forked else "spawn", "workers": len(s),
                          "first_s": round(s[0], 2), "next_median_s": round(statistics.median(s[1:]), 2),
                          "total_s": round(sum(s), 1)}), flush=True)


if __name__ == "__main__":
    main()
