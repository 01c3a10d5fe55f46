"""Executors: run a plan's jobs in process (``local``) or as Ray tasks (``ray``); the driver writes every row.

Both call the same job functions (``bench.jobs.run_job``) on the same jobs, so the
rows are the same whichever executor runs them. Without an artifact store, workers
share the artifact cache directory (one machine, or a shared filesystem):
artifacts are content-addressed, built in a private temporary directory, renamed
into place under a per-artifact lock (bench/cache.py), and signal shards are
written the same way, so concurrent builders never see or leave a half-written
artifact. With an artifact store (bench/artifact_store.py), each node keeps its
own private cache directory and artifacts and shards travel through the store.
Workers never open the database: they return rows, and the driver (the single
writer) stores them as jobs finish.
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Callable

from bench.errors import ConfigError
from bench.runner import LocalExecutor  # the in-process executor lives with the runner it drives

__all__ = ["EXECUTORS", "LocalExecutor", "RayExecutor", "make_executor"]

EXECUTORS = ("local", "ray")

Apply = Callable[[object, object], None]  # (job, JobResult) -> None, the driver's write


# -- Ray ------------------------------------------------------------------------------------------------------
_WORKER_RUNNERS: dict[tuple, object] = {}


def _worker_runner(raw: dict, path: str | None, cache_root: str | None, quiet: bool, done_evals: frozenset[str],
                   draw_secret: str | None = None, store_url: str | None = None):
    """The runner of this worker process for a suite: rebuilt once from the suite's YAML and the cache, then
    reused by every job the worker gets (its loaded models and signals stay warm).

    ``cache_root`` None (an artifact store at ``store_url``): the node's own cache directory, from its
    environment (``PRIVBENCH_CACHE`` as the node was started with, else ``~/.cache/privbench``)."""
    from bench.cache import ArtifactCache
    from bench.allocator import tune_allocator
    from bench.device import configure_determinism, set_threads
    from bench.hashing import content_hash
    from bench.suite import parse_suite
    key = (content_hash(raw), path, cache_root, draw_secret, store_url)
    runner = _WORKER_RUNNERS.get(key)
    if runner is None:
        set_threads()
        tune_allocator()
        configure_determinism()
        from bench.artifact_store import ArtifactStore
        from bench.runner import Runner
        store = ArtifactStore(store_url, check=False) if store_url else None
        runner = Runner(parse_suite(raw, path=path), None, ArtifactCache(cache_root, store=store), quiet=quiet,
                        draw_secret=draw_secret)
        _WORKER_RUNNERS.clear()  # one suite per worker at a time: drop another suite's models
        _WORKER_RUNNERS[key] = runner
    runner.done_evals = set(done_evals)
    return runner


def _ray_job(raw, path, cache_root, quiet, done_evals, draw_secret, store_url, job):
    return _worker_runner(raw, path, cache_root, quiet, done_evals, draw_secret, store_url).run_job(job)


def _check_address(address: str, timeout: float = 5.0) -> None:
    """Fail fast on a ``host:port`` or ``ray://host:port`` address nothing listens on (``ray.init`` would retry
    for minutes); ``auto`` and other forms are left to Ray."""
    target = address.split("://", 1)[-1]
    host, _, port = target.rpartition(":")
    if not host or not port.isdigit():
        return
    try:
        socket.create_connection((host, int(port)), timeout=timeout).close()
    except OSError as exc:
        raise ConfigError(f"Ray address '{address}' does not answer ({exc.strerror or exc}): start the cluster "
                          f"(`ray start --head` on the head node; `ray status` there prints its address) or give "
                          f"the right --ray-address") from None


class RayExecutor:
    """Each job a Ray task, submitted once its dependencies finished; GPU jobs ask for ``num_gpus=1``.

    ``address=None`` starts a local Ray instance (``ray.init()``); an address (``auto``,
    ``ray://host:10001``, ``host:6379``) joins an existing cluster, whose nodes must have privbench
    installed. Without an artifact store the nodes must see the driver's cache directory (a shared
    filesystem); with one (the runner's cache has a ``store``, `privbench run --artifact-store URL`), each node
    uses its own cache directory and nothing is shared but the store.
    """

    name = "ray"

    def __init__(self, address: str | None = None, *, num_cpus: int | None = None, cpus_per_job: float = 1.0,
                 max_in_flight: int | None = None) -> None:
        self.address = address
        self.num_cpus = num_cpus
        self.cpus_per_job = cpus_per_job
        self.max_in_flight = max_in_flight

    _started = False

    def _init(self, private_caches: bool = False):
        try:
            import ray
        except ImportError:
            raise ConfigError("the ray executor needs Ray: pip install 'ray[default]' or use --executor local"
                              ) from None
        if not ray.is_initialized():
            env = {k: v for k, v in os.environ.items()
                   if k.startswith("PRIVBENCH_") or k in ("PYTHONPATH", "OMP_NUM_THREADS", "HF_HUB_OFFLINE",
                                                          "TRANSFORMERS_OFFLINE", "HF_DATASETS_OFFLINE",
                                                          "CUBLAS_WORKSPACE_CONFIG")}
            if private_caches:  # each node keeps the cache directory it was started with
                env.pop("PRIVBENCH_CACHE", None)
            kwargs = dict(include_dashboard=False, log_to_driver=False, runtime_env={"env_vars": env},
                          ignore_reinit_error=True)
            if self.address:
                _check_address(self.address)
                try:
                    ray.init(address=self.address, **kwargs)
                except ConnectionError as exc:
                    raise ConfigError(f"cannot join the Ray cluster at '{self.address}' ({exc}): start it with "
                                      f"`ray start --head` or give its address with --ray-address") from None
            else:
                ray.init(address="local", num_cpus=self.num_cpus, **kwargs)  # never a cluster found on disk
                self._started = True  # a local instance of our own: shut down when the plan is done
        return ray

    def execute(self, runner, plan, apply: Apply) -> None:
        store = getattr(runner.cache, "store", None)
        ray = self._init(private_caches=store is not None)
        remote = ray.remote(_ray_job)
        s = runner.suite
        cache_root = None if store is not None else str(runner.cache.root)
        args = (s.raw, s.path, cache_root, True, frozenset(runner.done_evals), runner.draw_secret,
                store.url if store is not None else None)
        finished = {k for k, j in plan.jobs.items() if j.done}
        started: set[str] = set()
        pending: dict = {}
        limit = self.max_in_flight or max(int(ray.available_resources().get("CPU", 1) // self.cpus_per_job), 1) * 2
        t0 = time.perf_counter()
        try:
            while len(finished) < len(plan.jobs):
                for job in plan.ready(finished, started):
                    if len(pending) >= limit:
                        break
                    opts = {"num_cpus": self.cpus_per_job, "max_retries": 0}
                    if job.gpu:
                        opts["num_gpus"] = 1
                    pending[remote.options(**opts).remote(*args, job)] = job
                    started.add(job.key)
                if not pending:
                    raise RuntimeError("plan has jobs whose dependencies never finish: a cycle in bench/plan.py")
                done, _ = ray.wait(list(pending), num_returns=1)
                for ref in done:
                    job = pending.pop(ref)
                    try:
                        result = ray.get(ref)
                    except ray.exceptions.RayTaskError as exc:  # the job's own error, raised in the driver
                        cause = getattr(exc, "cause", None)
                        if isinstance(cause, Exception):
                            raise cause from None
                        raise
                    except (ray.exceptions.WorkerCrashedError, ray.exceptions.NodeDiedError,
                            ray.exceptions.OutOfMemoryError) as exc:
                        raise RuntimeError(f"the Ray worker running {job.kind} {job.label} died "
                                           f"({type(exc).__name__}: killed, out of memory or its node left): rerun "
                                           f"the same command to resume; finished jobs are kept") from None
                    apply(job, result)
                    finished.add(job.key)
                    runner.log(f"[ray] {job.kind} {job.label} done ({time.perf_counter() - t0:.0f}s)")
        finally:
            for ref in pending:
                ray.cancel(ref, force=True)
            if self._started:
                ray.shutdown()
                self._started = False


def make_executor(name: str = "local", *, ray_address: str | None = None, **kwargs):
    """The executor called ``name`` (``local`` or ``ray``)."""
    if name == "local":
        if ray_address:
            raise ConfigError("--ray-address needs --executor ray: add it or drop the address")
        return LocalExecutor()
    if name == "ray":
        if ray_address:
            _check_address(ray_address)  # before any run row is written
        return RayExecutor(ray_address, **kwargs)
    raise ConfigError(f"unknown executor '{name}': use one of {', '.join(EXECUTORS)}")
